package scenarios_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/sut"
)

// TestFoundAfterCountsFromTheRunsStart: every finding of a run says how
// many checks and how long it took to find from the run's start, the
// checks and shrinking before earlier findings included: a second
// finding does not count from the first, as it once did ("found after 3
// check(s)" at check 12). Its report says that it counts from the start.
func TestFoundAfterCountsFromTheRunsStart(t *testing.T) {
	t.Parallel()
	var found []*scenarios.Failure
	// The mutant keeps a failed turn's message (T1) and an aborted turn's
	// (T10): two findings, the second in a round of its own.
	c, err := scenarios.Conform(reference.WithMutant(sut.MutateBeforeRun), scenarios.Options{Checks: 40, Seed: 11,
		ShrinkTime: 2 * time.Second, Found: func(f *scenarios.Failure, _ scenarios.Stats) { found = append(found, f) }})
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(found), 2, "%s", c.Text(scenarios.Profile{}))
	for i, f := range found {
		// Checks are numbered from 1 in the whole run: the n-th is found
		// after n checks of it.
		assert.Equal(t, f.Check, f.FoundAfter, "finding %d (%s) counts its checks from the run's start", i+1, f.Violation.Invariant)
		assert.Contains(t, f.ShrinkStats(), fmt.Sprintf("found after %d check(s) of the run, ", f.Check))
		if i > 0 {
			prev := found[i-1]
			assert.Greater(t, f.Check, prev.Check)
			// Found once the one before it was found and shrunk.
			assert.GreaterOrEqual(t, f.FoundIn, prev.FoundIn+prev.ShrunkIn,
				"finding %d (%s) counts its time from the run's start", i+1, f.Violation.Invariant)
		}
	}
}
