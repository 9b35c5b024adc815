package scenarios_test

import (
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/sut"
)

var fidelity = flag.Int("fidelity", 0, "TestReplayFidelity: failing seeds to replay per concurrency mutant (0 skips it)")

// TestReplayFidelity measures how often a failing seed of a concurrency
// mutant replays to the same violation: for each mutant it finds -fidelity
// failing seeds, runs each once more, and compares the violations (the
// invariant, conversation, turn, reason and histories). It is a
// measurement, run by hand:
//
//	go test ./scenarios -run TestReplayFidelity -fidelity 100 -v
func TestReplayFidelity(t *testing.T) {
	if *fidelity == 0 {
		t.Skip("a measurement: run with -fidelity N")
	}
	targets := map[string]scenarios.Target{}
	for _, m := range []sut.Mutant{sut.ForkNewSession, sut.NoConversationLock} {
		targets[string(m)] = reference.Target{Mutant: m}
		// The same server, seen as one that does not report its activity:
		// bursts settle by a quiet period.
		targets[string(m)+" without activity reports"] = quietTarget{reference.Target{Mutant: m}}
	}
	for name, target := range targets {
		t.Run(name, func(t *testing.T) {
			opts := scenarios.Options{Checks: 1, ShrinkTime: time.Millisecond}
			found, same := 0, 0
			for seed := uint64(1); found < *fidelity; seed++ {
				opts.Seed = seed
				first, err := scenarios.Check(target, opts)
				require.NoError(t, err)
				if first.Failure == nil {
					continue
				}
				found++
				again, err := scenarios.Check(target, opts)
				require.NoError(t, err)
				if again.Failure != nil && again.Failure.Violation != nil && first.Failure.Violation != nil &&
					again.Failure.Violation.Error() == first.Failure.Violation.Error() {
					same++
				} else {
					t.Logf("seed %d did not replay the same:\nfirst:\n%s\nagain:\n%v", seed, first.Failure.Report, again.Failure)
				}
			}
			t.Logf("%s: %d/%d failing seeds replayed to the same violation", name, same, found)
		})
	}
}
