package scenarios_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	assert.Contains(t, res.Pace, "a start 1.")
	assert.Greater(t, res.Ration, 1, "a restart costs hundreds of steps: rationed")
	assert.Positive(t, res.Steered)
	for _, inv := range []model.Invariant{model.T2, model.T3, model.T4, model.T5, model.T7} {
		assert.Positive(t, res.Invariants[inv], "%s not exercised", inv)
	}
	assert.Contains(t, res.Summary(), "\npace: a start 1.")
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
