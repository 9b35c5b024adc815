package shrink

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/report"
)

// TestShrinkConfirmsWhatItReports: a candidate that broke the invariant
// once, by the luck of an interleaving, and not again in reproduceTries
// replays, is not what the shrinker reports: it falls back to the next
// smallest run it kept that breaks the invariant again. Here runs of
// three steps or more always break it, shorter ones only the first time
// each length is replayed.
func TestShrinkConfirmsWhatItReports(t *testing.T) {
	conv := model.ConversationRef{Key: "key-a", ID: "conv-1"}
	plans := make([]plan.Plan, 6)
	for i := range plans {
		plans[i] = plan.Single("continue", plan.TurnSend(conv, model.UserToken(i+1), false))
	}
	var mu sync.Mutex
	replays := map[int]int{}
	fake := func(_ *execute.Lab, _ context.Context, ps []plan.Plan) ([]history.Op, *model.Violation, error) {
		mu.Lock()
		defer mu.Unlock()
		replays[len(ps)]++
		ops := make([]history.Op, len(ps))
		for i := range ops {
			ops[i] = history.Op{Step: i + 1}
		}
		if len(ps) >= 3 || replays[len(ps)] == 1 {
			return ops, &model.Violation{Invariant: model.T1, Conv: conv}, nil
		}
		return ops, nil, nil
	}
	v := &model.Violation{Invariant: model.T1, Conv: conv}
	s := &Shrinker{labs: []*execute.Lab{{}}, want: model.T1, ctx: context.Background(), from: len(plans), Plans: plans, Violation: v,
		replayOn: fake}
	require.True(t, s.run(plans))
	assert.Len(t, s.Plans, 3, "the smallest run that breaks the invariant again")
	assert.Equal(t, s.Plans, s.found[len(s.found)-1].plans)
	assert.Positive(t, replays[1], "shorter runs were tried")
}

// TestShrinkConfirmsOnAFreshServer: where the run shared one server
// across its checks, what is reported is confirmed on a fresh server, as
// a replay of the saved failure runs it. Here step 3 alone breaks the
// invariant on the shared server, which earlier checks had used, and
// only after step 2 on a fresh one: the shrinker falls back to the
// smallest run kept that breaks it on a fresh server, and says why it is
// not called shrunk. Where not even the failing run's own steps do, they
// are reported, and the note says so; where the fresh server does not
// start, the smallest run is kept, and said not to be confirmed.
func TestShrinkConfirmsOnAFreshServer(t *testing.T) {
	two, three := model.UserToken(2), model.UserToken(3)
	shared := &fakeServer{at: three, breaks: func(plans []plan.Plan, _ int) bool { return anySends(plans, three) }}
	fresh := &fakeServer{at: three, breaks: func(plans []plan.Plan, _ int) bool { return anySends(plans, two) && anySends(plans, three) }}
	s := newShrinker(context.Background(), singleSteps(4), shared.replay)
	s.fresh, s.freshOn = true, fresh.replay
	require.True(t, s.run(singleSteps(4)))
	assert.Equal(t, tokens(singleSteps(3)[1:3]), tokens(s.Plans), "the smallest run kept that breaks it on a fresh server")
	assert.Equal(t, ReproduceTries, fresh.tries[tokens(singleSteps(3)[2:3])], "step 3 alone, given every try on a fresh server")
	state, note := s.State()
	assert.Equal(t, report.PartlyShrunk, state)
	assert.Equal(t, "2 candidates tried; 1 smaller run that broke it did not break it again on a fresh server", note)

	never := &fakeServer{at: three, breaks: func([]plan.Plan, int) bool { return false }}
	s = newShrinker(context.Background(), singleSteps(4), shared.replay)
	s.fresh, s.freshOn = true, never.replay
	require.True(t, s.run(singleSteps(4)))
	assert.Equal(t, tokens(singleSteps(3)), tokens(s.Plans), "the failing run's steps, up to the violation")
	state, note = s.State()
	assert.Equal(t, report.NotShrunk, state)
	assert.Contains(t, note, "its steps did not break it again on a fresh server")

	// A fresh server that does not start says nothing against the run:
	// it is kept, and the note says it was not confirmed.
	s = newShrinker(context.Background(), singleSteps(4), shared.replay)
	s.fresh = true
	s.freshOn = func(*execute.Lab, context.Context, []plan.Plan) ([]history.Op, *model.Violation, error) {
		return nil, nil, errors.New("start the server under test: address already in use")
	}
	require.True(t, s.run(singleSteps(4)))
	assert.Equal(t, tokens(singleSteps(3)[2:3]), tokens(s.Plans))
	state, note = s.State()
	assert.Equal(t, report.PartlyShrunk, state)
	assert.Contains(t, note, "its steps could not be replayed on a fresh server to confirm them")
}
