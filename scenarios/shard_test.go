package scenarios_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/sut"
)

// TestShardsMergeToTheWholeRun: the three shards of a run, merged, give
// the run's verdicts: against the clean server the same passes, evaluated
// as often, over the same checks and steps; against a mutant the same
// failure, found at the same check, and the same same-cause verdicts.
func TestShardsMergeToTheWholeRun(t *testing.T) {
	t.Parallel() // it mostly waits on its servers
	for name, target := range map[string]reference.Target{
		"clean":             {},
		"mutate-before-run": reference.WithMutant(sut.MutateBeforeRun),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// Unshrunk: what is merged is where and what was found.
			opts := scenarios.Options{Checks: 6, Steps: 12, Seed: 5, ShrinkTime: time.Millisecond}
			whole, err := scenarios.Conform(target, opts)
			require.NoError(t, err)
			if name != "clean" {
				require.NotEmpty(t, whole.Failures(), "the mutant is caught in the whole run, for its shards to find it too")
			}
			var shards []*report.Conformance
			for k := 1; k <= 3; k++ {
				o := opts
				o.Shard = scenarios.Shard{K: k, N: 3}
				c, err := scenarios.Conform(target, o)
				require.NoError(t, err)
				assert.Equal(t, o.Shard.String(), c.Shard)
				assert.Equal(t, 2, c.Asked, "a third of the checks")
				shards = append(shards, c)
			}
			merged, err := report.Merge(shards)
			require.NoError(t, err)
			assert.Equal(t, whole.Stats.Checks, merged.Stats.Checks)
			require.Len(t, merged.Verdicts, len(whole.Verdicts))
			broken := func(s scenarios.Status) bool { return s == scenarios.Fail || s == scenarios.SameCause }
			for i, w := range whole.Verdicts {
				m := merged.Verdicts[i]
				if name == "clean" || broken(w.Status) || broken(m.Status) {
					// After a finding, the whole run goes on past the
					// violations it set aside, where a shard that had not
					// found it yet stops a check: what else the two
					// exercised may differ, never what they found.
					assert.Equal(t, w.Status, m.Status, "%s", w.Invariant)
				}
				if w.Status == scenarios.Fail && m.Status == scenarios.Fail {
					assert.Equal(t, w.Failure.Check, m.Failure.Check, "%s: found at the same check", w.Invariant)
					assert.Equal(t, w.Failure.Seed, m.Failure.Seed, w.Invariant)
				}
			}
			if name == "clean" {
				// Every check ran as it would have in the whole run.
				assert.Equal(t, whole.Stats.Steps, merged.Stats.Steps)
				for i, w := range whole.Verdicts {
					assert.Equal(t, w.Evaluations, merged.Verdicts[i].Evaluations, "%s", w.Invariant)
				}
			}

			_, err = report.Merge(shards[:2])
			assert.ErrorContains(t, err, "shard(s) 3/3 missing")
			_, err = report.Merge(append(shards, shards[0]))
			assert.ErrorContains(t, err, "shard 1/3 twice")
			_, err = report.Merge([]*report.Conformance{whole})
			assert.ErrorContains(t, err, "no shard")
		})
	}
	_, err := scenarios.Conform(reference.Target{}, scenarios.Options{Checks: 1, Shard: scenarios.Shard{K: 4, N: 3}})
	assert.ErrorContains(t, err, "shard 4/3")
}
