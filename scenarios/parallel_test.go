package scenarios_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/sut"
)

// TestParallelChecksRunAtOnce shows that Options.Parallel runs checks at
// once, each on a server of its own: the first two servers wait for each
// other to start, which only two checks at once let them do.
func TestParallelChecksRunAtOnce(t *testing.T) {
	t.Parallel()
	target := &meeting{Target: reference.Target{}, want: 2, met: make(chan struct{})}
	res, err := scenarios.Check(target, scenarios.Options{Checks: 6, Seed: 1, Parallel: 2})
	require.NoError(t, err)
	require.Nil(t, res.Failure)
	assert.Equal(t, 6, res.Checks)
}

// TestParallelGivesTheSameFinding checks a mutant from one seed one check
// at a time and three at a time: the finding is the same, found by the
// same check, with the same counts up to it; the checks after it that ran
// beside it do not count.
func TestParallelGivesTheSameFinding(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("two runs of a mutant: not under -short")
	}
	// Each seed finds its mutant a few checks in: at --parallel 3 the
	// checks before it and after it run beside it.
	for _, c := range []struct {
		m    sut.Mutant
		seed uint64
	}{{sut.CommitOnStreamError, 2}, {sut.ToolRunsAfterCancel, 5}} {
		m := c.m
		t.Run(string(m), func(t *testing.T) {
			found := make([]*scenarios.Result, 0, 2)
			for _, parallel := range []int{1, 3} {
				// What is compared is what was found and counted up to it,
				// not its shrink: the shrink is cut at once.
				res, err := scenarios.Check(reference.WithMutant(m), scenarios.Options{Checks: 100, Seed: c.seed, Parallel: parallel,
					ShrinkTime: time.Millisecond})
				require.NoError(t, err)
				require.NotNil(t, res.Failure, "not caught with --parallel %d", parallel)
				require.NotNil(t, res.Failure.Violation, res.Failure.Report)
				found = append(found, res)
			}
			one, three := found[0], found[1]
			assert.Equal(t, one.Failure.FoundAfter, three.Failure.FoundAfter, "found by the same check")
			assert.Equal(t, one.Failure.Seed, three.Failure.Seed)
			assert.Equal(t, one.Failure.Violation.Invariant, three.Failure.Violation.Invariant)
			assert.Equal(t, one.Checks, three.Checks, "checks counted")
			assert.Equal(t, one.Steps, three.Steps, "requests counted")
			t.Logf("%s: found by check %d", m, one.Failure.FoundAfter)
		})
	}
}

// meeting is the reference target whose first want servers each wait, in
// Start, until all of them have started: a run that starts one at a time
// never gets past the first, and fails after a bound instead of hanging.
// The servers are the reference's own, with all its abilities.
type meeting struct {
	reference.Target
	want int
	met  chan struct{}

	mu      sync.Mutex
	started int
}

func (m *meeting) Start(modelURL string) (scenarios.Server, error) {
	m.mu.Lock()
	m.started++
	first := m.started <= m.want
	if m.started == m.want {
		close(m.met)
	}
	m.mu.Unlock()
	if first {
		select {
		case <-m.met:
		case <-time.After(30 * time.Second):
			return nil, fmt.Errorf("a server waited 30s for %d servers to start at once", m.want)
		}
	}
	return m.Target.Start(modelURL)
}
