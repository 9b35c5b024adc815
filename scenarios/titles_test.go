package scenarios

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// TestTitleCallsRaiseNoFalseAlarm: a server that calls the model for a
// title beside every turn, with the conversation's user messages only, is
// judged by the calls that led to each answer: the title calls are
// auxiliary (PROTOCOL.md, "Auxiliary model calls"), and the clean server
// passes every invariant in every protocol.
func TestTitleCallsRaiseNoFalseAlarm(t *testing.T) {
	t.Parallel()
	for _, p := range []targets.Protocol{targets.Chat, targets.Responses, targets.Sessions} {
		t.Run(string(p), func(t *testing.T) {
			t.Parallel()
			c, err := Conform(reference.Target{Protocol: p, Titles: true}, Options{Checks: 12, Seed: 5})
			require.NoError(t, err)
			for _, v := range c.Verdicts {
				assert.NotEqual(t, report.Fail, v.Status, "%s: %+v", v.Invariant, v)
			}
			assert.Equal(t, report.Pass, c.Verdict(model.T2).Status, "%+v", c.Verdict(model.T2))
			assert.Positive(t, c.Stats.Auxiliary, "title calls were made and set apart")
			assert.True(t, c.Passed(), "%s", c.Text(targets.Profile{}))
		})
	}
}

// TestTitleCallsHideNoBug: title calls beside the turns do not hide a
// real bug: a failed turn's message left in the history is T1 still, a
// title call that leaks another key's conversation is T5, and turns of one
// conversation run at once are T4.
func TestTitleCallsHideNoBug(t *testing.T) {
	t.Parallel() // its runs are the in-process server's, and share nothing with other tests
	for _, tc := range []struct {
		mutant sut.Mutant
		want   model.Invariant
	}{
		{sut.MutateBeforeRun, model.T1},
		{sut.CrossKeyLeak, model.T5},
		{sut.NoConversationLock, model.T4},
	} {
		t.Run(string(tc.mutant), func(t *testing.T) {
			t.Parallel()
			// The verdict is what is held, not how short the failure
			// gets: its shrink is cut at once. Each bug is found within
			// three checks from seed 11 (the first two in the first),
			// room for another interleaving of a burst on a loaded
			// machine.
			c, err := Conform(reference.Target{Mutant: tc.mutant, Titles: true}, Options{Checks: 3, Seed: 11, ShrinkTime: time.Millisecond})
			require.NoError(t, err)
			assert.Equal(t, report.Fail, c.Verdict(tc.want).Status, "%s", c.Text(targets.Profile{}))
		})
	}
}
