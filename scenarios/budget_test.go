package scenarios_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/examples/memserver"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
)

// TestSlowServerSpendsItsTime: on a server that takes a second to start,
// a run measures its pace and says it, rations its restarts, and steers
// each check towards what it has not exercised yet: a few short checks
// exercise what the reference server offers, durability included.
func TestSlowServerSpendsItsTime(t *testing.T) {
	t.Parallel() // it mostly waits on starts
	res, err := scenarios.Check(reference.Target{StartDelay: time.Second}, scenarios.Options{Checks: 3, Steps: 15, Seed: 1})
	require.NoError(t, err)
	require.Nil(t, res.Failure, "clean server failed")
	assert.Regexp(t, `^a start [0-9.]+m?s, a step `, res.Pace)
	assert.Greater(t, res.Ration, 1, "a restart costs hundreds of steps: rationed")
	assert.Positive(t, res.Steered)
	for _, inv := range []model.Invariant{model.T2, model.T3, model.T4, model.T5, model.T7} {
		assert.Positive(t, res.Invariants[inv], "%s not exercised", inv)
	}
	assert.Regexp(t, `\npace: a start [0-9.]+m?s, a step `, res.Summary())
}

// TestCleanRunFailsNoTurnUnasked: on the correct reference server, every
// turn that did not end ok ended so for what the harness drew, a refusal
// while two loaded sources share one stable key (T8) included: no warning
// blames the server for it.
func TestCleanRunFailsNoTurnUnasked(t *testing.T) {
	t.Parallel()
	res, err := scenarios.Check(reference.Target{}, scenarios.Options{Checks: 15, Seed: 1})
	require.NoError(t, err)
	require.Nil(t, res.Failure, "clean server failed")
	require.Positive(t, res.Invariants[model.T8], "no resume after a source change was drawn")
	assert.Empty(t, res.Uninjected, res.Summary())
}

// TestNothingToRationNoSteering: a server slow to start that is never
// restarted (a Handler) has no restart to ration: its checks draw as
// their seeds always have, and its pace is said.
func TestNothingToRationNoSteering(t *testing.T) {
	t.Parallel() // it mostly waits on starts
	target := scenarios.Handler(scenarios.Profile{Model: "turncheck", ModelTimeout: time.Second},
		func(modelURL, dataDir string) (http.Handler, error) {
			time.Sleep(time.Second)
			return memserver.New(modelURL), nil
		})
	res, err := scenarios.Check(target, scenarios.Options{Checks: 2, Steps: 10, Seed: 1})
	require.NoError(t, err)
	require.Nil(t, res.Failure, "clean server failed")
	assert.Regexp(t, `^a start [0-9.]+m?s, a step `, res.Pace)
	assert.LessOrEqual(t, res.Ration, 1)
	assert.Zero(t, res.Steered)
}
