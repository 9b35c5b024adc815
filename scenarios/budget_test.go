package scenarios_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/examples/memserver"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/reference"
)

// TestSlowServerSpendsItsTime: a server slow to start, whose profile
// allows restarts a small share of the steps, gets them rationed by count,
// and each check steers towards what it has not exercised yet: a few
// short checks exercise what the reference server offers, durability
// included. The run says its pace, and what it rationed.
func TestSlowServerSpendsItsTime(t *testing.T) {
	t.Parallel() // it mostly waits on starts
	res, err := scenarios.Check(reference.Target{StartDelay: time.Second, RestartShare: 0.02}, scenarios.Options{Checks: 3, Steps: 15, Seed: 1})
	require.NoError(t, err)
	require.Nil(t, res.Failure, "clean server failed")
	assert.Regexp(t, `^a start [0-9.]+m?s, a step `, res.Pace)
	assert.Equal(t, 8, res.Ration, "1/(7*8) of the steps is below 0.02, 1/(7*4) above")
	assert.Positive(t, res.Steered)
	for _, inv := range []model.Invariant{model.T2, model.T3, model.T4, model.T5, model.T7} {
		assert.Positive(t, res.Invariants[inv], "%s not exercised", inv)
	}
	assert.Regexp(t, `\npace: a start [0-9.]+m?s, a step `, res.Summary())
	assert.Contains(t, res.Summary(), "\nrestarts: carried out 1 in 8 times drawn")
}

// TestASeedIsOneRunAtAnySpeed: what a check draws and carries out comes
// from its seed, its profile and the server's answers, never from what a
// start or a step cost: the same seed sends the same steps and faults to
// a server that starts at once and to one slow to start (over
// execute.SlowCost, the second from which the run's old design rationed
// restarts by what they were measured to cost: under it the slow run drew
// otherwise), with restarts rationed or not. Seed 6's one check of 10
// steps restarts or crashes the server under either share, and under
// share 0.02 rations restarts too: a few slow starts, the two shares side
// by side.
func TestASeedIsOneRunAtAnySpeed(t *testing.T) {
	t.Parallel() // it mostly waits on starts
	slowStart := execute.SlowCost + 200*time.Millisecond
	for _, share := range []float64{0, 0.02} {
		t.Run(fmt.Sprint(share), func(t *testing.T) {
			t.Parallel() // it mostly waits on starts
			var runs [2]*scenarios.Result
			for i, delay := range []time.Duration{0, slowStart} {
				res, err := scenarios.Check(reference.Target{StartDelay: delay, RestartShare: share}, scenarios.Options{Checks: 1, Steps: 10, Seed: 6})
				require.NoError(t, err)
				require.Nil(t, res.Failure, "clean server failed")
				runs[i] = res
			}
			fast, slow := runs[0].Stats, runs[1].Stats
			require.Positive(t, fast.Faults["restart"]+fast.Faults["crash"]+fast.Rationed, "share %v: no restart drawn: the test shows nothing", share)
			assert.Equal(t, fast.Steps, slow.Steps, "share %v: steps", share)
			assert.Equal(t, fast.Faults, slow.Faults, "share %v: faults", share)
			assert.Equal(t, fast.Outcomes, slow.Outcomes, "share %v: outcomes", share)
			assert.Equal(t, fast.Rationed, slow.Rationed, "share %v: restarts rationed", share)
			assert.Equal(t, fast.Steered, slow.Steered, "share %v: steps steered", share)
		})
	}
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
