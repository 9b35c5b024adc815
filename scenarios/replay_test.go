package scenarios

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// lockFailure saves the failure the no-conversation-lock mutant shows
// under reject: a turn, then two on its conversation sent at once, which
// the mutant runs side by side (T4) where a clean server refuses the
// second with 409.
func lockFailure(t *testing.T) string {
	t.Helper()
	target := reference.Target{Mutant: sut.NoConversationLock, Concurrency: sut.Reject}
	conv := model.ConversationRef{Key: target.Profile().Keys[0], ID: "c"}
	plans := []plan.Plan{plan.Single("new", plan.TurnSend(conv, model.UserToken(1), false)), plan.Burst(conv, 2, 2, 0, 1)}
	history, v, err := Replay(target, plans)
	require.NoError(t, err)
	require.NotNil(t, v, "the mutant broke nothing")
	require.Equal(t, model.T4, v.Invariant, v.Error())
	path := filepath.Join(t.TempDir(), "T4.json")
	require.NoError(t, report.NewReport(&report.Result{Seed: 1, Failure: &report.Failure{Violation: v, Plans: plans, History: history}},
		target.Spec()).Save(path))
	return path
}

// TestReplayInGoTestNotReproduced: TURNCHECK_REPLAY of a failure that
// does not break again, in TURNCHECK_REPLAY_TRIES tries, fails the test
// with a message that is no FAIL verdict: how many tries, what differed,
// and how to try more.
func TestReplayInGoTestNotReproduced(t *testing.T) {
	path := lockFailure(t)
	clean := reference.Target{Concurrency: sut.Reject}
	msg, err := replayMessage(clean, path, "2", t.Name())
	require.NoError(t, err)
	assert.Contains(t, msg, "turncheck: replayed "+path+"\nNOT REPRODUCED: the saved failure, T4 (one conversation, one line), "+
		"did not break again in 2 tries of its 2 step(s), each in a fresh session (they broke no invariant).")
	assert.Contains(t, msg, "What differed from the saved run:\nTries 1 and 2:\n"+
		"  - at step 2, request 2 (c, tc-u3): the failing run got ok 200, the replay fail 409\n")
	assert.Contains(t, msg, "at step 2: its requests were answered in the order [1 2] in the failing run, [2 1] in the replay\n")
	assert.Contains(t, msg, "To try more: TURNCHECK_REPLAY_TRIES=10 TURNCHECK_REPLAY="+path+
		" go test -run '^TestReplayInGoTestNotReproduced$' .")
	assert.NotContains(t, msg, "violated")

	// Unset, as many tries as the shrinker's.
	msg, err = replayMessage(clean, path, "", t.Name())
	require.NoError(t, err)
	assert.Contains(t, msg, fmt.Sprintf("did not break again in %d tries", 3))

	for _, bad := range []string{"0", "-1", "many"} {
		_, err := replayMessage(clean, path, bad, t.Name())
		assert.ErrorContains(t, err, "TURNCHECK_REPLAY_TRIES="+bad, bad)
	}
}

// TestReplayInGoTestBreaksAgain: a failure that breaks again on its first
// try is reported as it is, without tries; one that breaks again only on
// a later try says so, and how the tries before it went otherwise.
func TestReplayInGoTestBreaksAgain(t *testing.T) {
	path := lockFailure(t)
	mutant := reference.Target{Mutant: sut.NoConversationLock, Concurrency: sut.Reject}
	msg, err := replayMessage(mutant, path, "", t.Name())
	require.NoError(t, err)
	assert.Contains(t, msg, "turncheck: replayed "+path+":\nT4 (one conversation, one line) violated")
	assert.NotContains(t, msg, "NOT REPRODUCED")
	assert.NotContains(t, msg, "It broke again on try")

	// The first session clean, the second the mutant: a server that
	// behaves otherwise from one replay to the next.
	later := &sessions{list: []targets.Target{reference.Target{Concurrency: sut.Reject}, mutant}}
	saved, err := report.ReadReport(path)
	require.NoError(t, err)
	r, err := ReplayFailureTries(context.Background(), later, saved.Failure, 3)
	require.NoError(t, err)
	assert.True(t, r.Reproduced)
	assert.Equal(t, 2, r.Tries)
	require.Len(t, r.Misses, 1)
	assert.Nil(t, r.Misses[0].Violation)

	later.n.Store(0)
	msg, err = replayMessage(later, path, "", t.Name())
	require.NoError(t, err)
	assert.Contains(t, msg, "T4 (one conversation, one line) violated")
	assert.Contains(t, msg, "\nIt broke again on try 2; the tries before it did not break it.\nWhat differed from the saved run:\nTry 1:\n"+
		"  - at step 2, request 2 (c, tc-u3): the failing run got ok 200, the replay fail 409\n")
}

// sessions is a target whose sessions start, in turn, a server of each
// target of list, the last one from then on.
type sessions struct {
	list []targets.Target
	n    atomic.Int32
}

func (s *sessions) Profile() targets.Profile { return s.list[0].Profile() }

func (s *sessions) Start(modelURL string) (targets.Server, error) {
	i := min(int(s.n.Add(1))-1, len(s.list)-1)
	return s.list[i].Start(modelURL)
}
