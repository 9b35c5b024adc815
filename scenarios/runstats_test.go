//go:build unix

package scenarios_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/testbin"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/sut"
)

// These tests hold what a run says of itself, as it goes and at its end,
// to what it did: where the time went, the checks it ran, its progress.

// TestWhereTheTimeGoes: a run's summary says where its wall time went.
func TestWhereTheTimeGoes(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	res, err := scenarios.Check(reference.Target{}, scenarios.Options{Checks: 1, Steps: 15, Seed: 1})
	require.NoError(t, err)
	for _, what := range []string{"starting servers", "waiting for the server to come to rest"} {
		assert.Contains(t, res.TimeMS, what)
	}
	assert.Contains(t, res.Summary(), "time spent (summed over the checks): ")
	assert.NotContains(t, res.TimeMS, "quiet periods (the server reports no activity)",
		"the in-process server reports its activity: no quiet period is needed")

	// A server run as a process reports no activity and keeps its own
	// model timeout: its run says what both cost. Seed 9's one check of 10
	// steps holds a call past that timeout.
	c, err := scenarios.Conform(profileTarget(t, testbin.Turncheck(t)), scenarios.Options{Checks: 1, Steps: 10, Seed: 9})
	require.NoError(t, err)
	require.Positive(t, c.Stats.Faults["model-timeout"], "no held call drawn: pick a seed that draws one")
	for _, what := range []string{"starting servers", "quiet periods (the server reports no activity)",
		"held calls waiting out the server's model timeout"} {
		assert.Contains(t, c.Stats.TimeMS, what)
	}
	assert.Positive(t, c.Stats.TimeMS["held calls waiting out the server's model timeout"])
}

// TestChecksCountWhatWasAsked: --checks N runs at most N checks, however
// many failures a Conform finds and rapid replays.
func TestChecksCountWhatWasAsked(t *testing.T) {
	t.Parallel()
	// Seed 1 finds T1 and T10 in the first two checks, and shrinks each.
	c, err := scenarios.Conform(reference.WithMutant(sut.MutateBeforeRun), scenarios.Options{Checks: 5, Seed: 1, ShrinkTime: 2 * time.Second})
	require.NoError(t, err)
	require.NotEmpty(t, c.Failures())
	assert.LessOrEqual(t, c.Stats.Checks, 5)
	assert.Positive(t, c.Stats.Checks)
}

// TestProgressNamesTheShrink: while a failure shrinks, progress says which
// invariant's and how far down it is; once it is done, it says nothing of
// it.
func TestProgressNamesTheShrink(t *testing.T) {
	var named []string
	res, err := scenarios.Check(reference.WithMutant(sut.ForkNewSession), scenarios.Options{Checks: 20, Seed: 1,
		Progress: func(s scenarios.Stats) {
			if s.Shrinking != "" {
				named = append(named, s.Shrinking)
			}
		}})
	require.NoError(t, err)
	require.NotNil(t, res.Failure)
	require.NotEmpty(t, named, "no progress during the shrink named it")
	assert.Regexp(t, `^the T4 failure, at \d+ step\(s\)$`, named[len(named)-1])
	assert.Empty(t, res.Stats.Shrinking)
}

// TestStepsPerRun: each run draws its own number of steps, even while
// runs with other numbers run at once: rapid's flag for it is held only
// as each check's steps start.
func TestStepsPerRun(t *testing.T) {
	t.Parallel()
	perCheck := make([]float64, 2)
	var wg sync.WaitGroup
	for i, steps := range []int{2, 60} {
		wg.Go(func() {
			res, err := scenarios.Check(reference.Target{}, scenarios.Options{Checks: 3, Steps: steps, Seed: 1})
			if assert.NoError(t, err) && assert.Nil(t, res.Failure) {
				perCheck[i] = float64(res.Steps) / float64(res.Checks)
			}
		})
	}
	wg.Wait()
	assert.Less(t, perCheck[0], 10.0, "runs of 2 steps on average")
	assert.Greater(t, perCheck[1], 20.0, "runs of 60 steps on average")
}

// TestProgressOnlyCountsUp: the progress a run says only ever grows, when
// a failure starts to shrink after checks beyond it ran (at once, beside
// it) and when the run goes on after it in a round of its own: what it
// counts is what ran, not what the verdicts count.
func TestProgressOnlyCountsUp(t *testing.T) {
	t.Parallel()
	var seen []scenarios.Stats
	var mu sync.Mutex
	c, err := scenarios.Conform(reference.WithMutant(sut.MutateBeforeRun), scenarios.Options{Checks: 6, Seed: 11, Parallel: 2,
		ShrinkTime: 2 * time.Second,
		Progress: func(s scenarios.Stats) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, scenarios.Stats{Checks: s.Checks, Steps: s.Steps, ShrinkRuns: s.ShrinkRuns, Shrinking: s.Shrinking})
		}})
	require.NoError(t, err)
	require.Equal(t, scenarios.Fail, c.Verdict(model.T1).Status, "a failure found, shrunk, and the run went on")
	shrinks := 0
	for i, s := range seen {
		if s.Shrinking != "" {
			shrinks++
		}
		if i == 0 {
			continue
		}
		prev := seen[i-1]
		assert.GreaterOrEqual(t, s.Checks, prev.Checks, "checks counted back at %d: %+v after %+v", i, s, prev)
		assert.GreaterOrEqual(t, s.Steps, prev.Steps, "steps counted back at %d: %+v after %+v", i, s, prev)
		assert.GreaterOrEqual(t, s.ShrinkRuns, prev.ShrinkRuns, "shrink replays counted back at %d", i)
	}
	assert.Positive(t, shrinks, "progress said the shrink")
	// What ran is at least what the verdicts count: checks run again
	// after a failure count in both.
	assert.GreaterOrEqual(t, seen[len(seen)-1].Checks, c.Stats.Checks)
}

// TestT3ShrinksToAReplay: a T3 failure found as a replay (a request
// without a usable message after a committed turn of its conversation)
// shrinks to a run that still shows the committed turn it replays, not to
// one invalid request on a new conversation.
func TestT3ShrinksToAReplay(t *testing.T) {
	t.Parallel()
	res, err := scenarios.Check(reference.WithMutant(sut.ReplayWithoutUser), scenarios.Options{Checks: 50, Seed: 1, ShrinkTime: 10 * time.Second})
	require.NoError(t, err)
	require.NotNil(t, res.Failure)
	f := res.Failure
	require.NotNil(t, f.Violation)
	require.Equal(t, model.T3, f.Violation.Invariant)
	last := f.History[len(f.History)-1]
	committed := false
	for _, op := range f.History {
		committed = committed || op.Step < last.Step && op.Send.Conv == f.Violation.Conv && op.Response.Outcome == model.OK && op.Send.Token != ""
	}
	assert.True(t, committed, "no committed turn before the invalid request:\n%s", f.Report)
}
