package shrink

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
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
