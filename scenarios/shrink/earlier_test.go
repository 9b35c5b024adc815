package shrink

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
)

// TestShrinkKeepsEarlierChecksSteps: a leak between checks is saved with
// the steps of the earlier check whose messages leaked, before the
// failing check's (plan.Plan.Earlier). The shrinker shrinks both, and
// every step it keeps, made simpler or not, stays of its check: here
// only the earlier check's second step, unstreamed, and the failing
// check's last are needed.
func TestShrinkKeepsEarlierChecksSteps(t *testing.T) {
	earlier := plan.Origin{Check: 2, Session: 3}
	step := func(tok int, o plan.Origin) plan.Plan {
		p := plan.Single("continue", plan.TurnSend(shrinkConv, model.UserToken(tok), true))
		p.Earlier = o
		return p
	}
	plans := []plan.Plan{step(8, earlier), step(9, earlier), step(1, plan.Origin{}), step(3, plan.Origin{})}
	leaked := func(p plan.Plan) bool { return p.Earlier == earlier && sends(p, model.UserToken(9)) }
	breaks := func(_ *execute.Lab, _ context.Context, ps []plan.Plan) ([]history.Op, *model.Violation, error) {
		ops := make([]history.Op, len(ps))
		for i := range ops {
			ops[i] = history.Op{Step: i + 1}
		}
		from := slices.IndexFunc(ps, leaked)
		at := slices.IndexFunc(ps, func(p plan.Plan) bool { return p.Earlier == (plan.Origin{}) && sends(p, model.UserToken(3)) })
		if from < 0 || at < from {
			return ops, nil, nil
		}
		return ops[:at+1], &model.Violation{Invariant: model.T5, Conv: shrinkConv}, nil
	}
	s := &Shrinker{labs: []*execute.Lab{{}}, want: model.T5, ctx: context.Background(), from: len(plans), Plans: plans,
		Violation: &model.Violation{Invariant: model.T5, Conv: shrinkConv}, replayOn: breaks, freshOn: breaks}
	require.True(t, s.run(plans))
	require.Len(t, s.Plans, 2, tokens(s.Plans))
	assert.Equal(t, earlier, s.Plans[0].Earlier)
	assert.True(t, sends(s.Plans[0], model.UserToken(9)))
	assert.False(t, s.Plans[0].Sends[0].Stream, "made simpler, and still the earlier check's")
	assert.Zero(t, s.Plans[1].Earlier)
	assert.True(t, sends(s.Plans[1], model.UserToken(3)))
}

// TestOnlySentInItsSession: an invalid continuation quotes only a user
// message its own check sends before it: an earlier check's message of
// the same token, on a conversation of the same name, is another's.
func TestOnlySentInItsSession(t *testing.T) {
	conv := model.ConversationRef{ID: "c"}
	user := func(tok string) openai.Message {
		return openai.Message{Role: openai.RoleUser, Content: openai.Content("Please remember " + tok + ".")}
	}
	before := plan.Single("turn", plan.Send{Conv: conv, Token: "tc-u4", Messages: []openai.Message{user("tc-u4")}})
	before.Earlier = plan.Origin{Check: 1, Session: 1}
	invalid := plan.Single("invalid continuation: last message a system message",
		plan.Send{Conv: conv, Messages: []openai.Message{user("tc-u4"), {Role: openai.RoleSystem, Content: "Be brief."}}})
	got := onlySent([]plan.Plan{before, invalid})
	assert.Equal(t, []openai.Message{{Role: openai.RoleSystem, Content: "Be brief."}}, got[1].Sends[0].Messages)
}
