package shrink

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
)

// lossRuns replays as a server that loses a turn does: the first three
// steps show the loss after a restart (T7, kind lost), and, where
// withoutRestart, step 3 alone shows it lost with none (T2).
func lossRuns(withoutRestart bool) replayFunc {
	three := model.UserToken(3)
	return func(_ *execute.Lab, _ context.Context, ps []plan.Plan) ([]history.Op, *model.Violation, error) {
		ops := make([]history.Op, len(ps))
		for i := range ops {
			ops[i] = history.Op{Step: i + 1}
		}
		if len(ps) >= 3 {
			return ops[:3], &model.Violation{Invariant: model.T7, Kind: model.Lost}, nil
		}
		if withoutRestart && anySends(ps, three) {
			at := 0
			for i, p := range ps {
				if sends(p, three) {
					at = i
				}
			}
			return ops[:at+1], &model.Violation{Invariant: model.T2, Kind: model.Lost}, nil
		}
		return ops, nil, nil
	}
}

// TestLossRenamedThenNotConfirmed: a loss after a restart (T7) that a
// smaller run shows with no restart (T2) on the run's shared server, but
// not on a fresh one, falls back to the T7 run it came from, which
// breaks on a fresh server every time: confirmed, and still T7.
func TestLossRenamedThenNotConfirmed(t *testing.T) {
	s := &Shrinker{labs: []*execute.Lab{{}}, want: model.T7, ctx: context.Background(), from: 4, Plans: singleSteps(4),
		Violation: &model.Violation{Invariant: model.T7, Kind: model.Lost}, replayOn: lossRuns(true), freshOn: lossRuns(false)}
	s.fresh = true
	require.True(t, s.run(singleSteps(4)))
	assert.False(t, s.unconfirmed, "the T7 run breaks on a fresh server every time")
	assert.Equal(t, model.T7, s.Violation.Invariant)
}

// TestLossRenamedWhenShownWithoutRestart: where a smaller run shows the
// loss with no restart on a fresh server too, the finding is T2's.
func TestLossRenamedWhenShownWithoutRestart(t *testing.T) {
	s := &Shrinker{labs: []*execute.Lab{{}}, want: model.T7, ctx: context.Background(), from: 4, Plans: singleSteps(4),
		Violation: &model.Violation{Invariant: model.T7, Kind: model.Lost}, replayOn: lossRuns(true), freshOn: lossRuns(true)}
	s.fresh = true
	require.True(t, s.run(singleSteps(4)))
	assert.Equal(t, model.T2, s.Violation.Invariant)
	assert.Less(t, len(s.Plans), 3)
}

// TestNoLossIsNotRenamed: a T7 that is no loss (a resume refused) is not
// renamed T2 by a candidate that shows some loss.
func TestNoLossIsNotRenamed(t *testing.T) {
	fake := func(_ *execute.Lab, _ context.Context, ps []plan.Plan) ([]history.Op, *model.Violation, error) {
		ops := make([]history.Op, len(ps))
		for i := range ops {
			ops[i] = history.Op{Step: i + 1}
		}
		if len(ps) >= 3 {
			return ops[:3], &model.Violation{Invariant: model.T7, Reason: "did not resume: 404"}, nil
		}
		return ops, &model.Violation{Invariant: model.T2, Kind: model.Lost}, nil
	}
	s := &Shrinker{labs: []*execute.Lab{{}}, want: model.T7, ctx: context.Background(), from: 4, Plans: singleSteps(4),
		Violation: &model.Violation{Invariant: model.T7}, replayOn: fake, freshOn: fake}
	require.True(t, s.run(singleSteps(4)))
	assert.Equal(t, model.T7, s.Violation.Invariant, "a T7 that is no loss is not renamed T2")
}

// TestOnlySent: a shrunk run's invalid continuation quotes, as its earlier
// user message, only one its steps send before it on its conversation:
// the latest such, or none.
func TestOnlySent(t *testing.T) {
	conv := model.ConversationRef{ID: "c"}
	user := func(tok string) openai.Message {
		return openai.Message{Role: openai.RoleUser, Content: openai.Content("Please remember " + tok + ".")}
	}
	turn := func(n int) plan.Plan {
		tok := model.UserToken(n)
		return plan.Single("turn", plan.Send{Conv: conv, Token: tok, Messages: []openai.Message{user(string(tok))}})
	}
	invalid := plan.Single("invalid continuation: last message a system message",
		plan.Send{Conv: conv, Messages: []openai.Message{user("tc-u4"), {Role: openai.RoleSystem, Content: "Be brief."}}})
	full := []plan.Plan{turn(1), turn(4), invalid}
	assert.Equal(t, full, onlySent(full), "every message it quotes is sent: unchanged")

	got := onlySent([]plan.Plan{turn(1), invalid})
	assert.Equal(t, []openai.Message{user("tc-u1"), {Role: openai.RoleSystem, Content: "Be brief."}}, got[1].Sends[0].Messages)
	assert.Equal(t, user("tc-u4"), invalid.Sends[0].Messages[0], "the plans it was given are left as they were")

	got = onlySent([]plan.Plan{invalid})
	assert.Equal(t, []openai.Message{{Role: openai.RoleSystem, Content: "Be brief."}}, got[0].Sends[0].Messages)
}

// TestShrunkRunQuotesOnlyWhatItSends: whatever steps the shrinker removes,
// the run it keeps quotes, in an invalid continuation, no user message
// those steps do not send.
func TestShrunkRunQuotesOnlyWhatItSends(t *testing.T) {
	conv := model.ConversationRef{ID: "c"}
	user := func(tok string) openai.Message {
		return openai.Message{Role: openai.RoleUser, Content: openai.Content("Please remember " + tok + ".")}
	}
	turn := func(n int) plan.Plan {
		tok := model.UserToken(n)
		return plan.Single("turn", plan.Send{Conv: conv, Token: tok, Messages: []openai.Message{user(string(tok))}})
	}
	invalid := plan.Single("invalid continuation: last message a system message",
		plan.Send{Conv: conv, Messages: []openai.Message{user("tc-u4"), {Role: openai.RoleSystem, Content: "Be brief."}}})
	// Any run that ends in the invalid request breaks T3.
	breaks := func(_ *execute.Lab, _ context.Context, ps []plan.Plan) ([]history.Op, *model.Violation, error) {
		ops := make([]history.Op, len(ps))
		for i := range ops {
			ops[i] = history.Op{Step: i + 1}
		}
		if len(ps) > 0 && ps[len(ps)-1].Action == invalid.Action {
			return ops, &model.Violation{Invariant: model.T3, Conv: conv}, nil
		}
		return ops, nil, nil
	}
	plans := []plan.Plan{turn(1), turn(4), invalid}
	s := &Shrinker{labs: []*execute.Lab{{}}, want: model.T3, ctx: context.Background(), from: len(plans), Plans: plans,
		Violation: &model.Violation{Invariant: model.T3, Conv: conv}, replayOn: breaks, freshOn: breaks}
	require.True(t, s.run(plans))
	sent := map[model.Token]bool{}
	for _, p := range s.Plans {
		for _, send := range p.Sends {
			for _, m := range send.Messages {
				for _, tok := range model.Tokens(string(m.Content)) {
					if send.Token == "" {
						assert.True(t, sent[tok], "the shrunk run quotes %s, which it never sends: %+v", tok, s.Plans)
					}
				}
			}
			if send.Token != "" {
				sent[send.Token] = true
			}
		}
	}
}
