package model_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
)

// ---------------------------------------------------------------------------
// Helpers for tool traffic and interrupted turns

// tk is the id the fake model gives the i-th tool call of round r of the
// turn tc-u<n>.
func tk(n, r, i int) string { return model.ToolCallID(u(n), r, i) }

// asks, answers and userMsg are the marks of a model request's tool
// traffic: an assistant's tool call, a tool result, a user message.
func asks(id string) model.ToolEvent    { return model.ToolEvent{Kind: model.ToolCalled, ID: id} }
func answers(id string) model.ToolEvent { return model.ToolEvent{Kind: model.ToolAnswered, ID: id} }
func userMsg() model.ToolEvent          { return model.ToolEvent{Kind: model.UserMessage} }

// tools returns c carrying the tool traffic evs.
func tools(c model.Call, evs ...model.ToolEvent) model.Call {
	c.Tools = evs
	return c
}

// timed returns c reaching the model at at.
func timed(c model.Call, at int64) model.Call {
	c.At = at
	return c
}

// interrupted is a turn whose client disconnected mid-turn: its outcome is
// unknown, and the harness let go of what the server waited on at
// released (0: never).
func interrupted(conv model.ConversationRef, user model.Token, released int64, calls ...model.Call) model.Turn {
	t := unknown(conv, user, calls...)
	t.Interrupted, t.Released = true, released
	return t
}

// rollback and keep are the two interruption policies (PROTOCOL.md,
// "Profiles").
var (
	rollback = model.Policies{}
	keep     = model.Policies{KeepConsistent: true}
)

// policyName names p's interruption policy, for subtests.
func policyName(p model.Policies) string {
	if p.KeepConsistent {
		return "keep-consistent"
	}
	return "rollback"
}

// runWith is run for a server that declares p.
func runWith(t *testing.T, p model.Policies, steps []step) *model.Model {
	t.Helper()
	m := model.NewWith(p)
	for i, s := range steps {
		v := m.Apply(s.turn)
		last := i == len(steps)-1
		if s.want == "" {
			if last {
				assert.Nil(t, v, "step %d (%s): unexpected violation", i, s.turn.User)
			} else {
				require.Nil(t, v, "step %d (%s): unexpected violation while setting up", i, s.turn.User)
			}
			continue
		}
		requireViolation(t, v, s.want, s.turn)
		if !last {
			// The model's state after a violation is unspecified.
			t.Fatalf("step %d: a violation may only be expected on the last step", i)
		}
	}
	return m
}

// withSteps returns scene followed by more, sharing nothing with scene.
func withSteps(scene []step, more ...step) []step {
	return append(append([]step{}, scene...), more...)
}

// toolTurn1 is turn 1 on convA with one tool round: a first call, then
// one that carries the tool call tk(1,1,1) and its result; it ends ok.
func toolTurn1() model.Turn {
	return ok(convA, u(1),
		call(u(1), u(1)),
		tools(call(u(1), u(1)), userMsg(), asks(tk(1, 1, 1)), answers(tk(1, 1, 1))))
}

// carrying is a call of the turn user with history that carries the tool
// pairs ids (each asked for, then answered) after a first user message,
// and ends with the turn's own user message: a later turn's view of an
// earlier turn's tool loop.
func carrying(user model.Token, history []model.Token, ids ...string) model.Call {
	evs := []model.ToolEvent{userMsg()}
	for _, id := range ids {
		evs = append(evs, asks(id), answers(id))
	}
	evs = append(evs, userMsg())
	return tools(call(user, history...), evs...)
}

// ---------------------------------------------------------------------------
// Tool call ids

func TestToolCallID(t *testing.T) {
	assert.Equal(t, "tc-k7-2-1", model.ToolCallID(u(7), 2, 1))
	assert.Equal(t, "tc-k12-1-3", tk(12, 1, 3))

	for _, c := range []struct{ n, r, i int }{{1, 1, 1}, {7, 2, 1}, {42, 3, 9}, {0, 1, 1}, {1234567, 10, 11}} {
		id := model.ToolCallID(u(c.n), c.r, c.i)
		user, round, ok := model.ToolTurn(id)
		require.True(t, ok, "ToolTurn(%q)", id)
		assert.Equal(t, u(c.n), user, "turn of %q", id)
		assert.Equal(t, c.r, round, "round of %q", id)
	}

	// A tool call id is no message token: it never enters a history.
	assert.Nil(t, model.Tokens(tk(7, 1, 1)))
	assert.Nil(t, model.Tokens("calling "+tk(7, 1, 1)+" now"))
	assert.Nil(t, model.Tokens("calling "+model.ToolCallRef{User: u(7), Round: 1, Call: 1, Asking: 2}.ID()+" now"))
}

// TestToolCallIDOfALaterAsking: a round asked again (a retried turn, whose
// user token is the same) gets ids of its own, which still name the turn
// and the round; the first asking keeps the ids it always had.
func TestToolCallIDOfALaterAsking(t *testing.T) {
	first := model.ToolCallRef{User: u(28), Round: 1, Call: 1, Asking: 1}
	assert.Equal(t, "tc-k28-1-1", first.ID())
	assert.Equal(t, model.ToolCallID(u(28), 1, 1), first.ID())
	assert.Equal(t, "tc-k28-1-1", model.ToolCallRef{User: u(28), Round: 1, Call: 1}.ID(), "no asking is the first")
	second := first
	second.Asking = 2
	assert.Equal(t, "tc-k28-1-1x2", second.ID())
	assert.NotEqual(t, first.ID(), second.ID())

	for _, r := range []model.ToolCallRef{
		first, second,
		{User: u(7), Round: 2, Call: 3, Asking: 10},
		{User: u(0), Round: 1, Call: 1, Asking: 2},
		{User: u(1234567), Round: 10, Call: 11, Asking: 123},
	} {
		id := r.ID()
		assert.Regexp(t, `^[a-zA-Z0-9_-]+$`, id, "an id that frameworks keep as it is")
		got, ok := model.ParseToolCallID(id)
		require.True(t, ok, "ParseToolCallID(%q)", id)
		assert.Equal(t, r, got, "what %q names", id)
		user, round, ok := model.ToolTurn(id)
		require.True(t, ok, "ToolTurn(%q)", id)
		assert.Equal(t, r.User, user, "turn of %q", id)
		assert.Equal(t, r.Round, round, "round of %q", id)
	}
}

func TestToolTurnRejectsMalformedIDs(t *testing.T) {
	for _, id := range []string{
		"tc-k7-1",     // no index
		"tc-k7-0-1",   // round 0
		"tc-k7-1-0",   // index 0
		"tc-k07-1-1",  // leading zero in the turn
		"tc-k7-01-1",  // leading zero in the round
		"tc-k7-1-1-1", // one part too many
		"tc-k-1-1",    // no turn
		"tc-kx-1-1",   // not a number
		"tc-k7-+1-1",  // a sign
		"tc-k7--1-1",  // a negative round
		"tc-u7-1-1",   // a user token's prefix
		"tc-k7-1-1 ",  // trailing space
		"call_1",      // another server's id
		"",
		// A later asking's ordinal.
		"tc-k7-1-1x1",   // the first asking has none
		"tc-k7-1-1x0",   // asking 0
		"tc-k7-1-1x",    // no ordinal
		"tc-k7-1-1x02",  // a leading zero
		"tc-k7-1-1x+2",  // a sign
		"tc-k7-1-1x2x3", // two ordinals
		"tc-k7-1-1.2",   // another separator
		"tc-k7-1x2-1",   // on the round
		"tc-k7x2-1-1",   // on the turn
		"tc-k7-1-x2",    // no index
		"tc-k7-1-1x2 ",  // trailing space
		"tc-k7-0-1x2",   // round 0
		"tc-k7-1-1X2",   // another letter
	} {
		user, round, ok := model.ToolTurn(id)
		assert.False(t, ok, "ToolTurn(%q) must reject it", id)
		assert.Empty(t, user, "ToolTurn(%q)", id)
		assert.Zero(t, round, "ToolTurn(%q)", id)
		r, ok := model.ParseToolCallID(id)
		assert.False(t, ok, "ParseToolCallID(%q) must reject it", id)
		assert.Zero(t, r, "ParseToolCallID(%q)", id)
	}
}

// ---------------------------------------------------------------------------
// T9: tool pairs, on any model request

func TestToolPairs(t *testing.T) {
	k1, k2 := tk(1, 1, 1), tk(1, 1, 2)
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name:  "a tool call answered once",
			steps: []step{{turn: toolTurn1()}},
		},
		{
			name: "two tool calls of one round, answered in another order",
			steps: []step{{turn: ok(convA, u(1), call(u(1), u(1)),
				tools(call(u(1), u(1)), userMsg(), asks(k1), asks(k2), answers(k2), answers(k1)))}},
		},
		{
			name: "two rounds",
			steps: []step{{turn: ok(convA, u(1), call(u(1), u(1)),
				tools(call(u(1), u(1)), userMsg(), asks(k1), answers(k1)),
				tools(call(u(1), u(1)), userMsg(), asks(k1), answers(k1), asks(tk(1, 2, 1)), answers(tk(1, 2, 1))))}},
		},
		{
			name: "a committed turn's pairs before the next user message",
			steps: []step{
				{turn: toolTurn1()},
				{turn: ok(convA, u(2), carrying(u(2), h(u(1), a(1), u(2)), k1))},
			},
		},
		{
			name: "a call without a result before the next user message",
			steps: []step{
				{turn: toolTurn1()},
				{turn: ok(convA, u(2), tools(call(u(2), u(1), a(1), u(2)), userMsg(), asks(k1), userMsg())), want: model.T9},
			},
		},
		{
			name: "a call answered only after the next user message",
			steps: []step{
				{turn: toolTurn1()},
				{turn: ok(convA, u(2), tools(call(u(2), u(1), a(1), u(2)), userMsg(), asks(k1), userMsg(), answers(k1))), want: model.T9},
			},
		},
		{
			name: "a call without a result at the end of the request",
			steps: []step{{turn: ok(convA, u(1), call(u(1), u(1)),
				tools(call(u(1), u(1)), userMsg(), asks(k1))), want: model.T9}},
		},
		{
			name: "one of two calls of a round without a result",
			steps: []step{{turn: ok(convA, u(1), call(u(1), u(1)),
				tools(call(u(1), u(1)), userMsg(), asks(k1), asks(k2), answers(k1))), want: model.T9}},
		},
		{
			name: "a result with no call",
			steps: []step{{turn: ok(convA, u(1), call(u(1), u(1)),
				tools(call(u(1), u(1)), userMsg(), answers(k1))), want: model.T9}},
		},
		{
			name: "a result before its call",
			steps: []step{{turn: ok(convA, u(1), call(u(1), u(1)),
				tools(call(u(1), u(1)), userMsg(), answers(k1), asks(k1))), want: model.T9}},
		},
		{
			name: "two results for one call",
			steps: []step{{turn: ok(convA, u(1), call(u(1), u(1)),
				tools(call(u(1), u(1)), userMsg(), asks(k1), answers(k1), answers(k1))), want: model.T9}},
		},
		{
			name: "the same call id asked for twice",
			steps: []step{{turn: ok(convA, u(1), call(u(1), u(1)),
				tools(call(u(1), u(1)), userMsg(), asks(k1), answers(k1), asks(k1), answers(k1))), want: model.T9}},
		},
		{
			name: "the same call id asked for twice, across user messages",
			steps: []step{
				{turn: toolTurn1()},
				{turn: ok(convA, u(2), tools(call(u(2), u(1), a(1), u(2)),
					userMsg(), asks(k1), answers(k1), userMsg(), asks(k1), answers(k1))), want: model.T9},
			},
		},
		{
			name: "an orphan in an auxiliary call",
			steps: []step{{turn: ok(convA, u(1), call(u(1), u(1)),
				tools(aux(u(1)), userMsg(), asks(k1), userMsg())), want: model.T9}},
		},
		{
			name: "a result with no call in an auxiliary call",
			steps: []step{
				{turn: toolTurn1()},
				{turn: ok(convA, u(2), call(u(2), u(1), a(1), u(2)),
					tools(aux(u(1), a(1)), userMsg(), answers(k1))), want: model.T9},
			},
		},
		{
			name: "an orphan in a call without any turn",
			steps: []step{{turn: ok(convA, u(1), call(u(1), u(1)),
				tools(model.Call{}, asks(k1))), want: model.T9}},
		},
		{
			name: "an orphan in a failed turn's call",
			steps: []step{{turn: fail(convA, u(1),
				tools(call(u(1), u(1)), userMsg(), asks(k1))), want: model.T9}},
		},
		{
			name: "an orphan in a call made during a refused request",
			steps: []step{
				{turn: toolTurn1()},
				{turn: invalid(convA, "", model.Fail, 400,
					tools(aux(u(7)), userMsg(), asks(tk(7, 1, 1)), userMsg())), want: model.T9},
			},
		},
		{
			name: "an orphan of an interrupted turn in the interrupted turn's own call",
			steps: []step{{turn: interrupted(convA, u(1), 0,
				tools(call(u(1), u(1)), userMsg(), asks(k1))), want: model.T9}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run(t, tt.steps)
		})
	}
}

// A T9 violation names the tool call and shows the request's history.
func TestToolPairsViolation(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(toolTurn1()))
	turn := ok(convA, u(2), tools(call(u(2), u(1), a(1), u(2)), userMsg(), asks(tk(1, 1, 1)), userMsg()))
	v := m.Apply(turn)
	requireViolation(t, v, model.T9, turn)
	assert.Contains(t, v.Reason, tk(1, 1, 1))
	assert.Contains(t, v.Reason, "orphan")
	assert.Equal(t, h(u(1), a(1), u(2)), v.Observed)

	m = model.New()
	turn = ok(convA, u(1), call(u(1), u(1)), tools(aux(u(5)), userMsg(), answers(tk(5, 1, 1))))
	v = m.Apply(turn)
	requireViolation(t, v, model.T9, turn)
	assert.Contains(t, v.Reason, tk(5, 1, 1))
	assert.Equal(t, h(u(5)), v.Observed, "the auxiliary call's history")
	assert.Contains(t, v.Error(), "T9 (tool pairs)")
}

func TestToolPairsChecked(t *testing.T) {
	m := model.New()
	// No tool traffic: T9 is not evaluated, not even on an empty Tools.
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)), tools(aux(u(1)), []model.ToolEvent{}...))))
	assert.Zero(t, m.Checked()[model.T9])
	_, present := m.Checked()[model.T9]
	assert.False(t, present, "an invariant never evaluated is not listed")

	// One call with tool events out of three (an auxiliary one).
	require.Nil(t, m.Apply(ok(convA, u(2),
		call(u(2), u(1), a(1), u(2)),
		tools(call(u(2), u(1), a(1), u(2)), userMsg(), userMsg(), asks(tk(2, 1, 1)), answers(tk(2, 1, 1))),
		aux(u(2)))))
	assert.Equal(t, 1, m.Checked()[model.T9])

	// Auxiliary calls with tool events count too, one each.
	require.Nil(t, m.Apply(ok(convA, u(3),
		carrying(u(3), h(u(1), a(1), u(2), a(2), u(3)), tk(2, 1, 1)),
		carrying(aux(u(3)).Turn, h(u(3)), tk(2, 1, 1)))))
	assert.Equal(t, 3, m.Checked()[model.T9])
}

// ---------------------------------------------------------------------------
// Tool provenance: where a turn's calls' tool pairs come from

func TestToolOwners(t *testing.T) {
	k1 := tk(1, 1, 1)
	k2 := tk(2, 1, 1)
	// failed2 is turn 1 ok, turn 2 failed after its tool round.
	failed2 := []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: fail(convA, u(2), call(u(2), u(1), a(1), u(2)),
			carrying(u(2), h(u(1), a(1), u(2)), k2))},
	}
	// unknown2 is turn 1 ok, turn 2 unknown after its tool round.
	unknown2 := []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: unknown(convA, u(2), call(u(2), u(1), a(1), u(2)),
			carrying(u(2), h(u(1), a(1), u(2)), k2))},
	}
	tests := []struct {
		name   string
		policy model.Policies
		steps  []step
	}{
		{
			name: "a committed turn's pairs in a later turn",
			steps: []step{
				{turn: toolTurn1()},
				{turn: ok(convA, u(2), carrying(u(2), h(u(1), a(1), u(2)), k1))},
				{turn: ok(convA, u(3), carrying(u(3), h(u(1), a(1), u(2), a(2), u(3)), k1))},
			},
		},
		{
			name: "a committed turn's pairs hidden in a later turn (compaction)",
			steps: []step{
				{turn: toolTurn1()},
				{turn: ok(convA, u(2), call(u(2), u(1), a(1), u(2)))},
			},
		},
		{
			name: "a committed turn's pairs shown, then hidden",
			steps: []step{
				{turn: toolTurn1()},
				{turn: ok(convA, u(2), carrying(u(2), h(u(1), a(1), u(2)), k1))},
				{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3)))},
			},
		},
		{
			name:  "the turn's own pairs",
			steps: []step{{turn: toolTurn1()}},
		},
		{
			name:  "a failed turn's own pairs in its own calls",
			steps: failed2,
		},
		{
			name: "a failed turn's pairs, a turn after the next",
			steps: withSteps(failed2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))},
				step{turn: ok(convA, u(4), carrying(u(4), h(u(1), a(1), u(3), a(3), u(4)), k2)), want: model.T1}),
		},
		{
			name: "a failed turn's pairs in a failed later turn, a turn after the next",
			steps: withSteps(failed2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))},
				step{turn: fail(convA, u(4), carrying(u(4), h(u(1), a(1), u(3), a(3), u(4)), k2)), want: model.T1}),
		},
		{
			name: "a failed turn's pairs after its retry committed them",
			steps: withSteps(failed2,
				step{turn: ok(convA, u(2), call(u(2), u(1), a(1), u(2)),
					carrying(u(2), h(u(1), a(1), u(2)), k2))},
				step{turn: ok(convA, u(3), carrying(u(3), h(u(1), a(1), u(2), a(2), u(3)), k2))}),
		},
		{
			name: "another conversation's pairs",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convB, u(5), call(u(5), u(5)), carrying(u(5), h(u(5)), tk(5, 1, 1)))},
				{turn: ok(convA, u(3), carrying(u(3), h(u(1), a(1), u(3)), tk(5, 1, 1))), want: model.T5},
			},
		},
		{
			name: "another key's conversation's pairs",
			steps: []step{
				{turn: ok(convK1, u(1), call(u(1), u(1)), carrying(u(1), h(u(1)), k1))},
				{turn: ok(convK2, u(2), carrying(u(2), h(u(2)), k1)), want: model.T5},
			},
		},
		{
			name:   "an interrupted turn's pairs without its user message (rollback)",
			policy: rollback,
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: interrupted(convA, u(2), 0, call(u(2), u(1), a(1), u(2)),
					carrying(u(2), h(u(1), a(1), u(2)), k2))},
				{turn: ok(convA, u(3), carrying(u(3), h(u(1), a(1), u(3)), k2)), want: model.T10},
			},
		},
		{
			name:   "an interrupted turn's pairs without its user message (keep-consistent)",
			policy: keep,
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: interrupted(convA, u(2), 0, call(u(2), u(1), a(1), u(2)),
					carrying(u(2), h(u(1), a(1), u(2)), k2))},
				{turn: ok(convA, u(3), carrying(u(3), h(u(1), a(1), u(3)), k2)), want: model.T10},
			},
		},
		{
			name:   "an interrupted turn's pairs with its user message (keep-consistent)",
			policy: keep,
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: interrupted(convA, u(2), 0, call(u(2), u(1), a(1), u(2)),
					carrying(u(2), h(u(1), a(1), u(2)), k2))},
				{turn: ok(convA, u(3), tools(call(u(3), u(1), a(1), u(2), u(3)),
					userMsg(), userMsg(), asks(k2), answers(k2), userMsg()))},
			},
		},
		{
			name: "an unknown turn's pairs, in the call that shows it not committed",
			steps: withSteps(unknown2,
				step{turn: ok(convA, u(3), carrying(u(3), h(u(1), a(1), u(3)), k2)), want: model.T6}),
		},
		{
			name: "an unknown turn's pairs, after a history showed it not committed",
			steps: withSteps(unknown2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))},
				step{turn: ok(convA, u(4), carrying(u(4), h(u(1), a(1), u(3), a(3), u(4)), k2)), want: model.T6}),
		},
		{
			name: "an unknown turn's pairs, committed with it",
			steps: withSteps(unknown2,
				step{turn: ok(convA, u(3), carrying(u(3), h(u(1), a(1), u(2), a(2), u(3)), k2))}),
		},
		{
			name: "the pairs of a turn never sent",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2), carrying(u(2), h(u(1), a(1), u(2)), tk(77, 1, 1))), want: model.T1},
			},
		},
		{
			name: "a result alone of a turn never sent is T9 before provenance",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2), tools(call(u(2), u(1), a(1), u(2)), userMsg(), answers(tk(77, 1, 1)), userMsg())), want: model.T9},
			},
		},
		{
			name: "pairs with ids of another form are not judged for provenance",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2), carrying(u(2), h(u(1), a(1), u(2)), "call_1", "tc-k07-1-1"))},
			},
		},
		{
			name: "an auxiliary call's pairs are not judged for provenance",
			steps: withSteps(failed2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)),
					carrying(aux(u(9)).Turn, h(u(9)), k2))}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runWith(t, tt.policy, tt.steps)
		})
	}
}

// A provenance violation names the tool call and its turn.
func TestToolOwnersViolation(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	require.Nil(t, m.Apply(ok(convB, u(5), call(u(5), u(5)), carrying(u(5), h(u(5)), tk(5, 1, 1)))))
	turn := ok(convA, u(3), carrying(u(3), h(u(1), a(1), u(3)), tk(5, 1, 1)))
	v := m.Apply(turn)
	requireViolation(t, v, model.T5, turn)
	assert.Contains(t, v.Reason, tk(5, 1, 1))
	assert.Contains(t, v.Reason, string(u(5)))
	assert.Contains(t, v.Reason, convB.ID)
	assert.Equal(t, h(u(1), a(1), u(3)), v.Observed)
}

// A failed turn's tool pairs in the very next turn are its output reaching
// a later turn: T1, as they are a turn later (TestToolOwners), not a
// change in how the committed tool calls are shown (T11): provenance is
// judged before T11.
func TestToolOwnersFailedTurnNextTurn(t *testing.T) {
	k2 := tk(2, 1, 1)
	run(t, []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: fail(convA, u(2), call(u(2), u(1), a(1), u(2)),
			carrying(u(2), h(u(1), a(1), u(2)), k2))},
		{turn: ok(convA, u(3), carrying(u(3), h(u(1), a(1), u(3)), k2)), want: model.T1},
	})
	// The same where the committed conversation has tool calls of its own,
	// shown alike by both turns: the failed turn's are still T1's.
	k1 := tk(1, 1, 1)
	run(t, []step{
		{turn: toolTurn1()},
		{turn: fail(convA, u(2), carrying(u(2), h(u(1), a(1), u(2)), k1),
			tools(call(u(2), u(1), a(1), u(2)), userMsg(), asks(k1), answers(k1), userMsg(), asks(k2), answers(k2)))},
		{turn: ok(convA, u(3), tools(call(u(3), u(1), a(1), u(3)),
			userMsg(), asks(k1), answers(k1), userMsg(), asks(k2), answers(k2), userMsg())), want: model.T1},
	})
}

// A retry of a failed turn must see the last committed history (T1): its
// first model call cannot carry tool pairs of its own, which only the
// failed attempt can have left there.
func TestToolOwnersRetryCarriesFailedAttempt(t *testing.T) {
	k2 := tk(2, 1, 1)
	run(t, []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: fail(convA, u(2), call(u(2), u(1), a(1), u(2)),
			carrying(u(2), h(u(1), a(1), u(2)), k2))},
		{turn: ok(convA, u(2), carrying(u(2), h(u(1), a(1), u(2)), k2)), want: model.T1},
	})
}

// ---------------------------------------------------------------------------
// T10: interruption, the turn stopped

func TestInterruptedTurnStops(t *testing.T) {
	const released = 10
	k2 := tk(2, 1, 1)
	setup := step{turn: ok(convA, u(1), call(u(1), u(1)))}
	withRuns := func(tt model.Turn, runs ...model.ToolRun) model.Turn {
		tt.Runs = runs
		return tt
	}
	tests := []struct {
		name string
		turn model.Turn
		want model.Invariant
	}{
		{
			name: "a call of the turn before the release",
			turn: interrupted(convA, u(2), released, timed(call(u(2), u(1), a(1), u(2)), 5)),
		},
		{
			name: "a call of the turn after the release",
			turn: interrupted(convA, u(2), released, timed(call(u(2), u(1), a(1), u(2)), 11)),
			want: model.T10,
		},
		{
			name: "a later call of the tool loop after the release",
			turn: interrupted(convA, u(2), released,
				timed(call(u(2), u(1), a(1), u(2)), 5),
				timed(carrying(u(2), h(u(1), a(1), u(2)), k2), 12)),
			want: model.T10,
		},
		{
			name: "a tool run before the release",
			turn: withRuns(interrupted(convA, u(2), released, timed(call(u(2), u(1), a(1), u(2)), 5)),
				model.ToolRun{ID: k2, At: 7}),
		},
		{
			name: "a tool run after the release",
			turn: withRuns(interrupted(convA, u(2), released, timed(call(u(2), u(1), a(1), u(2)), 5)),
				model.ToolRun{ID: k2, At: 7}, model.ToolRun{ID: tk(2, 1, 2), At: 11}),
			want: model.T10,
		},
		{
			name: "a tool run after the release, no model call",
			turn: withRuns(interrupted(convA, u(2), released), model.ToolRun{ID: k2, At: 20}),
			want: model.T10,
		},
		{
			name: "a tool run after the server gave up on the held one",
			turn: carriedOn(withRuns(interrupted(convA, u(2), released, timed(call(u(2), u(1), a(1), u(2)), 5)),
				model.ToolRun{ID: k2, At: 6}, model.ToolRun{ID: tk(2, 1, 2), At: 9}), 9, 6),
			want: model.T10,
		},
		{
			// docker-agent's title call: the client left at it, the
			// server gave it up, and the turn's own call, on its way
			// beside it, arrived after: nothing says it started after
			// the server saw the disconnect.
			name: "the turn's own call after the server gave up only on a title call beside it",
			turn: beside(carriedOn(interrupted(convA, u(2), 0, timed(call(u(2), u(1), a(1), u(2)), 7)), 7, 5),
				timed(call(u(2), u(2)), 5)),
		},
		{
			name: "the turn's own call after the server gave up on a title call and on one of the turn's",
			turn: beside(carriedOn(interrupted(convA, u(2), 0,
				timed(call(u(2), u(1), a(1), u(2)), 6),
				timed(carrying(u(2), h(u(1), a(1), u(2)), k2), 9)), 9, 5, 6),
				timed(call(u(2), u(2)), 5)),
			want: model.T10,
		},
		{
			// The reference server with titles, on a loaded machine: the
			// title call came first and was held; the server saw the
			// disconnect and gave it up, and the harness let go of the
			// turn; the turn's own call, on its way, came after.
			name: "the turn's own call after a release that followed only a title call's give-up",
			turn: releasedAfter(beside(interrupted(convA, u(2), released, timed(call(u(2), u(1), a(1), u(2)), 12)),
				timed(call(u(2), u(2)), 5)), 5),
		},
		{
			name: "a tool run after that call",
			turn: withRuns(releasedAfter(beside(interrupted(convA, u(2), released, timed(call(u(2), u(1), a(1), u(2)), 12)),
				timed(call(u(2), u(2)), 5)), 5), model.ToolRun{ID: k2, At: 14}),
			want: model.T10,
		},
		{
			name: "a second call of the turn after that call",
			turn: releasedAfter(beside(interrupted(convA, u(2), released,
				timed(call(u(2), u(1), a(1), u(2)), 12),
				timed(carrying(u(2), h(u(1), a(1), u(2)), k2), 15)),
				timed(call(u(2), u(2)), 5)), 5),
			want: model.T10,
		},
		{
			name: "the turn's own call after a release that followed a give-up of one of the turn's",
			turn: releasedAfter(beside(interrupted(convA, u(2), released,
				timed(call(u(2), u(1), a(1), u(2)), 6),
				timed(call(u(2), u(1), a(1), u(2)), 12)),
				timed(call(u(2), u(2)), 5)), 5, 6),
			want: model.T10,
		},
		{
			name: "a model call after the server gave up on the held one, never released",
			turn: carriedOn(interrupted(convA, u(2), 0,
				timed(call(u(2), u(1), a(1), u(2)), 5),
				timed(carrying(u(2), h(u(1), a(1), u(2)), k2), 9)), 9, 5),
			want: model.T10,
		},
		{
			name: "a tool run on its way after the disconnect, the held one still waited on",
			turn: dropped(withRuns(interrupted(convA, u(2), released, timed(call(u(2), u(1), a(1), u(2)), 5)),
				model.ToolRun{ID: k2, At: 6}, model.ToolRun{ID: tk(2, 1, 2), At: 9}), 8),
		},
		{
			name: "never released: nothing to judge the calls by",
			turn: withRuns(interrupted(convA, u(2), 0, timed(call(u(2), u(1), a(1), u(2)), 50)),
				model.ToolRun{ID: k2, At: 60}),
		},
		{
			name: "a turn not interrupted may call after its Released",
			turn: func() model.Turn {
				tt := unknown(convA, u(2), timed(call(u(2), u(1), a(1), u(2)), 50))
				tt.Released = released
				return tt
			}(),
		},
	}
	for _, policy := range []model.Policies{rollback, keep} {
		for _, tt := range tests {
			t.Run(policyName(policy)+"/"+tt.name, func(t *testing.T) {
				runWith(t, policy, []step{setup, {turn: tt.turn, want: tt.want}})
			})
		}
	}
}

// dropped is tt with its client gone at tick at.
func dropped(tt model.Turn, at int64) model.Turn {
	tt.Dropped = at
	return tt
}

// carriedOn is tt with a call or run of it at tick at arrived after its
// server gave up on those the model held for it that arrived at after.
func carriedOn(tt model.Turn, at int64, after ...int64) model.Turn {
	tt.CarriedOn, tt.CarriedAfter = at, after
	return tt
}

// releasedAfter is tt let go of once its server gave up on what the
// model held of it: those that arrived at after.
func releasedAfter(tt model.Turn, after ...int64) model.Turn {
	tt.ReleasedAfter = after
	return tt
}

// beside is tt with calls made beside it (a title): its Aux.
func beside(tt model.Turn, calls ...model.Call) model.Turn {
	tt.Aux = append(tt.Aux, calls...)
	return tt
}

func TestInterruptedTurnStopsViolation(t *testing.T) {
	m := model.New()
	turn := interrupted(convA, u(1), 10, timed(call(u(1), u(1)), 5))
	turn.Runs = []model.ToolRun{{ID: tk(1, 1, 1), At: 11}}
	v := m.Apply(turn)
	requireViolation(t, v, model.T10, turn)
	assert.Contains(t, v.Reason, tk(1, 1, 1))
	assert.Contains(t, v.Error(), "T10 (interruption)")

	// Stopped in time: T10 evaluated once, on the release.
	m = model.New()
	require.Nil(t, m.Apply(interrupted(convA, u(1), 10, timed(call(u(1), u(1)), 5))))
	assert.Equal(t, 1, m.Checked()[model.T10])
	// Without a release nothing is evaluated.
	m = model.New()
	require.Nil(t, m.Apply(interrupted(convA, u(1), 0, timed(call(u(1), u(1)), 5))))
	assert.Zero(t, m.Checked()[model.T10])
}

// ---------------------------------------------------------------------------
// T10: what a later turn shows of an interrupted turn

// interrupted2 is turn 1 ok, then turn 2 interrupted after its first call.
func interrupted2() []step {
	return []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: interrupted(convA, u(2), 10, timed(call(u(2), u(1), a(1), u(2)), 5))},
	}
}

func TestInterruptedRollback(t *testing.T) {
	k2 := tk(2, 1, 1)
	tests := []struct {
		name      string
		steps     []step
		committed []model.Token
	}{
		{
			name:      "rolled back: a later call holds nothing of it",
			steps:     withSteps(interrupted2(), step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))}),
			committed: h(u(1), a(1), u(3), a(3)),
		},
		{
			name: "rolled back, then a later turn still without it",
			steps: withSteps(interrupted2(),
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))},
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(3), a(3), u(4)))}),
			committed: h(u(1), a(1), u(3), a(3), u(4), a(4)),
		},
		{
			name:  "a later call holds its user message",
			steps: withSteps(interrupted2(), step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))), want: model.T10}),
		},
		{
			name: "a later call holds its user message and completed tool pairs",
			steps: withSteps(interrupted2(), step{turn: ok(convA, u(3), tools(call(u(3), u(1), a(1), u(2), u(3)),
				userMsg(), userMsg(), asks(k2), answers(k2), userMsg())), want: model.T10}),
		},
		{
			name:  "a failed later turn's call holds its user message",
			steps: withSteps(interrupted2(), step{turn: fail(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))), want: model.T10}),
		},
		{
			name:  "an unknown later turn's call holds its user message",
			steps: withSteps(interrupted2(), step{turn: unknown(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))), want: model.T10}),
		},
		{
			name: "rolled back, then its user message reappears",
			steps: withSteps(interrupted2(),
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))},
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(3), a(3), u(2), u(4))), want: model.T10}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := runWith(t, rollback, tt.steps)
			if tt.committed != nil {
				assert.Equal(t, tt.committed, m.Committed(convA))
			}
		})
	}
}

func TestInterruptedRollbackViolation(t *testing.T) {
	m := model.New()
	for _, s := range interrupted2() {
		require.Nil(t, m.Apply(s.turn))
	}
	turn := ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3)))
	v := m.Apply(turn)
	requireViolation(t, v, model.T10, turn)
	assert.Contains(t, v.Reason, string(u(2)))
	assert.Contains(t, v.Reason, "rollback")
	assert.Equal(t, h(u(1), a(1), u(2), u(3)), v.Observed)
	assert.Equal(t, h(u(1), a(1), u(3)), v.Expected)
}

// T10 is evaluated on every call of a later turn of a conversation with an
// interrupted turn, and there only.
func TestInterruptedChecked(t *testing.T) {
	for _, policy := range []model.Policies{rollback, keep} {
		m := model.NewWith(policy)
		require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
		require.Nil(t, m.Apply(ok(convB, u(9), call(u(9), u(9)))))
		assert.Zero(t, m.Checked()[model.T10])
		require.Nil(t, m.Apply(interrupted(convA, u(2), 0, call(u(2), u(1), a(1), u(2)))))
		assert.Zero(t, m.Checked()[model.T10], "never released: nothing to check yet")
		require.Nil(t, m.Apply(ok(convA, u(3), call(u(3), u(1), a(1), u(3)))))
		assert.Greater(t, m.Checked()[model.T10], 0)
		assert.Equal(t, 1, m.Checked()[model.T10])
		require.Nil(t, m.Apply(ok(convB, u(8), call(u(8), u(9), a(9), u(8)))))
		assert.Equal(t, 1, m.Checked()[model.T10], "another conversation had no interrupted turn")
		require.Nil(t, m.Apply(ok(convA, u(4), call(u(4), u(1), a(1), u(3), a(3), u(4)), call(u(4), u(1), a(1), u(3), a(3), u(4)))))
		assert.Equal(t, 3, m.Checked()[model.T10], "one evaluation per call")
	}
}

func TestInterruptedKeepConsistent(t *testing.T) {
	k2 := tk(2, 1, 1)
	// kept3 is interrupted2, then turn 3 keeping turn 2's user message.
	kept3 := withSteps(interrupted2(), step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3)))})
	tests := []struct {
		name      string
		steps     []step
		committed []model.Token
	}{
		{
			name:      "its user message alone kept",
			steps:     kept3,
			committed: h(u(1), a(1), u(2), u(3), a(3)),
		},
		{
			name: "its user message kept with its completed tool pairs",
			steps: withSteps(interrupted2(), step{turn: ok(convA, u(3), tools(call(u(3), u(1), a(1), u(2), u(3)),
				userMsg(), userMsg(), asks(k2), answers(k2), userMsg()))}),
			committed: h(u(1), a(1), u(2), u(3), a(3)),
		},
		{
			name:      "rolled back whole",
			steps:     withSteps(interrupted2(), step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))}),
			committed: h(u(1), a(1), u(3), a(3)),
		},
		{
			name: "the next turn extends the kept prefix",
			steps: withSteps(kept3,
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(2), u(3), a(3), u(4)))}),
			committed: h(u(1), a(1), u(2), u(3), a(3), u(4), a(4)),
		},
		{
			name: "the kept user message's tool pairs stay in a later turn",
			steps: withSteps(interrupted2(),
				step{turn: ok(convA, u(3), tools(call(u(3), u(1), a(1), u(2), u(3)),
					userMsg(), userMsg(), asks(k2), answers(k2), userMsg()))},
				step{turn: ok(convA, u(4), tools(call(u(4), u(1), a(1), u(2), u(3), a(3), u(4)),
					userMsg(), userMsg(), asks(k2), answers(k2), userMsg(), userMsg()))}),
			committed: h(u(1), a(1), u(2), u(3), a(3), u(4), a(4)),
		},
		{
			name: "the next turn drops the kept user message",
			steps: withSteps(kept3,
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(3), a(3), u(4))), want: model.T10}),
		},
		{
			name: "the next turn moves the kept user message",
			steps: withSteps(kept3,
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(3), a(3), u(2), u(4))), want: model.T2}),
		},
		{
			name: "kept, then followed by its reply",
			steps: withSteps(kept3,
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(2), a(2), u(3), a(3), u(4))), want: model.T10}),
		},
		{
			name: "absent, then reappearing",
			steps: withSteps(interrupted2(),
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))},
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(2), u(3), a(3), u(4))), want: model.T10}),
		},
		{
			name: "absent, then reappearing after the next turn",
			steps: withSteps(interrupted2(),
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))},
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(3), a(3), u(2), u(4))), want: model.T10}),
		},
		{
			name:  "its user message kept twice",
			steps: withSteps(interrupted2(), step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(2), u(3))), want: model.T10}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := runWith(t, keep, tt.steps)
			if tt.committed != nil {
				require.Empty(t, tt.steps[len(tt.steps)-1].want, "test bug: committed is only checked after a passing step")
				assert.Equal(t, tt.committed, m.Committed(convA))
			}
		})
	}
}

// An interrupted turn's reply is never kept, whatever the policy.
func TestInterruptedReplyNeverKept(t *testing.T) {
	histories := map[string][]model.Token{
		"whole":                h(u(1), a(1), u(2), a(2), u(3)),
		"the reply alone":      h(u(1), a(1), a(2), u(3)),
		"the reply, then more": h(u(1), a(1), u(2), a(2), a(2), u(3)),
	}
	for name, history := range histories {
		for _, policy := range []model.Policies{rollback, keep} {
			t.Run(policyName(policy)+"/"+name, func(t *testing.T) {
				turn := ok(convA, u(3), call(u(3), history...))
				runWith(t, policy, withSteps(interrupted2(), step{turn: turn, want: model.T10}))
			})
		}
	}
	// The reason names the reply.
	m := model.NewWith(keep)
	for _, s := range interrupted2() {
		require.Nil(t, m.Apply(s.turn))
	}
	turn := ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3)))
	v := m.Apply(turn)
	requireViolation(t, v, model.T10, turn)
	assert.Contains(t, v.Reason, string(a(2)))
}

// T9 is checked before T10: an orphan left by an interrupted turn is named
// as such, even where keeping the turn at all is T10.
func TestOrphanOfInterruptedTurnIsT9(t *testing.T) {
	k2 := tk(2, 1, 1)
	orphan := ok(convA, u(3), tools(call(u(3), u(1), a(1), u(2), u(3)),
		userMsg(), userMsg(), asks(k2), userMsg()))
	paired := ok(convA, u(3), tools(call(u(3), u(1), a(1), u(2), u(3)),
		userMsg(), userMsg(), asks(k2), answers(k2), userMsg()))

	t.Run("rollback, orphan", func(t *testing.T) {
		runWith(t, rollback, withSteps(interrupted2(), step{turn: orphan, want: model.T9}))
	})
	t.Run("rollback, pair complete", func(t *testing.T) {
		runWith(t, rollback, withSteps(interrupted2(), step{turn: paired, want: model.T10}))
	})
	t.Run("keep-consistent, orphan", func(t *testing.T) {
		runWith(t, keep, withSteps(interrupted2(), step{turn: orphan, want: model.T9}))
	})
	t.Run("keep-consistent, result without its call", func(t *testing.T) {
		turn := ok(convA, u(3), tools(call(u(3), u(1), a(1), u(2), u(3)),
			userMsg(), userMsg(), answers(k2), userMsg()))
		runWith(t, keep, withSteps(interrupted2(), step{turn: turn, want: model.T9}))
	})
	t.Run("keep-consistent, pair complete", func(t *testing.T) {
		runWith(t, keep, withSteps(interrupted2(), step{turn: paired}))
	})
}

// TestOrphanAlsoBreaksT10: the orphaned tool call of an interrupted turn
// is T9's finding; where the same request also carries the turn's message,
// which rollback was to drop, it breaks T10 by the same trigger, and says
// so (Also): T10 is then that finding's SAME CAUSE, never a pass. Under
// keep-consistent the message may stay, and nothing else is broken.
func TestOrphanAlsoBreaksT10(t *testing.T) {
	k2 := tk(2, 1, 1)
	orphan := ok(convA, u(3), tools(call(u(3), u(1), a(1), u(2), u(3)),
		userMsg(), userMsg(), asks(k2), userMsg()))
	for _, tc := range []struct {
		p    model.Policies
		also []model.Invariant
	}{{rollback, []model.Invariant{model.T10}}, {keep, nil}} {
		t.Run(policyName(tc.p), func(t *testing.T) {
			m := model.NewWith(tc.p)
			for _, s := range interrupted2() {
				require.Nil(t, m.Apply(s.turn))
			}
			v := m.Apply(orphan)
			require.NotNil(t, v)
			assert.Equal(t, model.T9, v.Invariant)
			assert.Equal(t, tc.also, v.Also)
		})
	}
}

// ---------------------------------------------------------------------------
// T11: no leaks from the working copy

func TestLeakFromWorkingCopy(t *testing.T) {
	k1 := tk(1, 1, 1)
	turnA := toolTurn1()
	// Turn B's and C's first calls, showing turn A's tool pairs or hiding
	// them (compacted).
	shows := func(user model.Token, history ...model.Token) model.Call { return carrying(user, history, k1) }
	failB := fail(convA, u(2), shows(u(2), u(1), a(1), u(2)))
	hideC := ok(convA, u(3), call(u(3), u(1), a(1), u(3)))
	showC := ok(convA, u(3), shows(u(3), u(1), a(1), u(3)))
	tests := []struct {
		name    string
		steps   []step
		checked int // Checked()[T11] after the steps, when they pass
	}{
		{
			name:  "a failed turn, then the next turn hides the committed tool calls",
			steps: []step{{turn: turnA}, {turn: failB}, {turn: hideC, want: model.T11}},
		},
		{
			name:    "a failed turn, then the next turn shows them as before",
			steps:   []step{{turn: turnA}, {turn: failB}, {turn: showC}},
			checked: 1,
		},
		{
			name: "a failed turn, then the next turn shows them hidden before",
			steps: []step{{turn: turnA},
				{turn: fail(convA, u(2), call(u(2), u(1), a(1), u(2)))},
				{turn: showC, want: model.T11}},
		},
		{
			name: "several failed turns, then the next turn hides them",
			steps: []step{{turn: turnA}, {turn: failB},
				{turn: fail(convA, u(4), shows(u(4), u(1), a(1), u(4)))},
				{turn: hideC, want: model.T11}},
		},
		{
			name: "several failed turns showing them alike",
			steps: []step{{turn: turnA}, {turn: failB},
				{turn: fail(convA, u(4), shows(u(4), u(1), a(1), u(4)))},
				{turn: showC}},
			checked: 2,
		},
		{
			name:  "a failed turn, then its retry hides them",
			steps: []step{{turn: turnA}, {turn: failB}, {turn: ok(convA, u(2), call(u(2), u(1), a(1), u(2))), want: model.T11}},
		},
		{
			name: "a failed turn, then a turn of another conversation, then the next turn hides them",
			steps: []step{{turn: turnA}, {turn: failB},
				{turn: ok(convB, u(9), call(u(9), u(9)))},
				{turn: hideC, want: model.T11}},
		},
		{
			name: "a committed turn, then the next turn hides them (compaction)",
			steps: []step{{turn: turnA},
				{turn: ok(convA, u(2), shows(u(2), u(1), a(1), u(2)))},
				{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3)))}},
		},
		{
			name: "an unknown turn, then the next turn hides them",
			steps: []step{{turn: turnA},
				{turn: unknown(convA, u(2), shows(u(2), u(1), a(1), u(2)))},
				{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3)))}},
		},
		{
			name: "a failed turn, a failed turn without a model call, then the next turn hides them",
			steps: []step{{turn: turnA}, {turn: failB},
				{turn: fail(convA, u(4))},
				{turn: hideC, want: model.T11}},
		},
		{
			name: "a committed turn, a failed turn without a model call, then the next turn hides them",
			steps: []step{{turn: turnA},
				{turn: ok(convA, u(4), shows(u(4), u(1), a(1), u(4)))},
				{turn: fail(convA, u(2))},
				{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(4), a(4), u(3)))}},
		},
		{
			name: "no tool calls at all",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: fail(convA, u(2), call(u(2), u(1), a(1), u(2)))},
				{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))}},
		},
		{
			name: "only the failed turn's own tool calls",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: fail(convA, u(2), call(u(2), u(1), a(1), u(2)),
					carrying(u(2), h(u(1), a(1), u(2)), tk(2, 1, 1)))},
				{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := run(t, tt.steps)
			if tt.steps[len(tt.steps)-1].want == "" {
				assert.Equal(t, tt.checked, m.Checked()[model.T11], "T11 evaluations")
			}
		})
	}
}

func TestLeakFromWorkingCopyViolation(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(toolTurn1()))
	require.Nil(t, m.Apply(fail(convA, u(2), carrying(u(2), h(u(1), a(1), u(2)), tk(1, 1, 1)))))
	turn := ok(convA, u(3), call(u(3), u(1), a(1), u(3)))
	v := m.Apply(turn)
	requireViolation(t, v, model.T11, turn)
	assert.Contains(t, v.Reason, "hidden now: "+tk(1, 1, 1))
	assert.Contains(t, v.Error(), "T11 (no leaks from the working copy)")
}

// A restart forgets what the last turn showed: a server may compact on
// start-up, so a change across it is not judged.
func TestLeakFromWorkingCopyAcrossRestart(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(toolTurn1()))
	require.Nil(t, m.Apply(fail(convA, u(2), carrying(u(2), h(u(1), a(1), u(2)), tk(1, 1, 1)))))
	m.Restart(false, false)
	require.Nil(t, m.Apply(ok(convA, u(3), call(u(3), u(1), a(1), u(3)))))
	assert.Zero(t, m.Checked()[model.T11])
	assert.Positive(t, m.Checked()[model.T7], "the resume was checked")

	// And after the restart, the comparison starts over.
	require.Nil(t, m.Apply(fail(convA, u(4), call(u(4), u(1), a(1), u(3), a(3), u(4)))))
	turn := ok(convA, u(5), carrying(u(5), h(u(1), a(1), u(3), a(3), u(5)), tk(1, 1, 1)))
	v := m.Apply(turn)
	requireViolation(t, v, model.T11, turn)
	assert.Contains(t, v.Reason, "shown now, hidden before: "+tk(1, 1, 1))
}

// TestOrphanOfATurnThatLeavesNothingIsItsLeftover: the orphan an
// interrupted turn leaves under rollback is that turn's leftover, the same
// root cause as its message kept (T10): one finding, not two. Under
// keep-consistent the orphan is T9's alone.
func TestOrphanOfATurnThatLeavesNothingIsItsLeftover(t *testing.T) {
	k2 := tk(2, 1, 1)
	orphan := ok(convA, u(3), tools(call(u(3), u(1), a(1), u(2), u(3)),
		userMsg(), userMsg(), asks(k2), userMsg()))
	for policies, kind := range map[model.Policies]model.Kind{rollback: model.LeftoverInterrupted, keep: ""} {
		m := model.NewWith(policies)
		for _, s := range interrupted2() {
			require.Nil(t, m.Apply(s.turn))
		}
		v := m.Apply(orphan)
		require.NotNil(t, v)
		assert.Equal(t, model.T9, v.Invariant)
		assert.Equal(t, kind, v.Kind, "%+v", policies)
	}
}

// abandoned2 is turn 1 ok, then turn 2 whose client gave up waiting after
// its first call (model.Turn.Abandoned): nothing held it, so nothing of
// when it stopped is judged.
func abandoned2() []step {
	t2 := unknown(convA, u(2), timed(call(u(2), u(1), a(1), u(2)), 5))
	t2.TimedOut, t2.Abandoned = true, true
	return []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: t2},
	}
}

// TestAbandonedTurn: a turn whose client's own time ran out is an
// interruption at a point the harness did not choose (docker-agent's
// session API kept the user message of such a turn, which keep-consistent
// allows: no T6). It may have committed whole before the server saw the
// client go, or have been stopped as the policy says; a part of it kept
// otherwise is T10, never T6.
func TestAbandonedTurn(t *testing.T) {
	tests := []struct {
		name      string
		next      model.Turn
		committed []model.Token
		want      map[string]model.Invariant // by policy name; absent: none
	}{
		{
			name:      "committed whole before the server saw the client go",
			next:      ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3))),
			committed: h(u(1), a(1), u(2), a(2), u(3), a(3)),
		},
		{
			name:      "rolled back",
			next:      ok(convA, u(3), call(u(3), u(1), a(1), u(3))),
			committed: h(u(1), a(1), u(3), a(3)),
		},
		{
			name: "its user message kept",
			next: ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))),
			want: map[string]model.Invariant{"rollback": model.T10},
		},
		{
			name: "its reply kept without its user message",
			next: ok(convA, u(3), call(u(3), u(1), a(1), a(2), u(3))),
			want: map[string]model.Invariant{"rollback": model.T10, "keep-consistent": model.T10},
		},
	}
	for _, policy := range []model.Policies{rollback, keep} {
		for _, tt := range tests {
			t.Run(policyName(policy)+"/"+tt.name, func(t *testing.T) {
				m := runWith(t, policy, withSteps(abandoned2(), step{turn: tt.next, want: tt.want[policyName(policy)]}))
				if tt.committed != nil {
					assert.Equal(t, tt.committed, m.Committed(convA))
				}
			})
		}
	}
}

// TestAppendedAfterKeptInterrupted: docker-agent's session API keeps an
// interrupted turn's message (keep-consistent), then appends a client
// tool's output as a user message without a token: that message is the
// newest, and the kept one is not run again as new (no T3). The same
// call with nothing after the kept message would be a replay.
func TestAppendedAfterKeptInterrupted(t *testing.T) {
	kept := interrupted(convA, u(5), 0, timed(call(u(5), u(5)), 3))
	runWith(t, keep, []step{{turn: kept},
		{turn: appended(invalid(convA, "", model.OK, 200, model.Call{History: h(u(5)), Turn: u(5), Tail: true, Trailing: true}))}})
	runWith(t, keep, []step{{turn: kept},
		{turn: appended(invalid(convA, "", model.OK, 200, model.Call{History: h(u(5)), Turn: u(5)})), want: model.T3}})
}

// TestToolRunAfterItsStep: a tool run of an interrupted turn that starts
// after the harness let go of what the server waited on is T10's even when
// it comes after the turn's step ended, in a later step (Turn.LateRuns):
// how fast the server starts it decides only where it is seen. One that
// started before the let-go, or of a turn never let go of, is not.
func TestToolRunAfterItsStep(t *testing.T) {
	late := func(tt model.Turn, runs ...model.ToolRun) model.Turn {
		tt.LateRuns = runs
		return tt
	}
	const released = 10
	m := model.NewWith(rollback)
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	require.Nil(t, m.Apply(interrupted(convA, u(2), released, call(u(2), u(1), a(1), u(2)))))
	require.Nil(t, m.Apply(late(ok(convB, u(3), call(u(3), u(3))), model.ToolRun{ID: tk(2, 1, 1), At: 9})), "started before the let-go")
	require.Nil(t, m.Apply(late(ok(convB, u(4), call(u(4), u(3), a(3), u(4))), model.ToolRun{ID: tk(9, 1, 1), At: 12})), "no turn let go of")
	v := m.Apply(late(ok(convB, u(5), call(u(5), u(3), a(3), u(4), a(4), u(5))), model.ToolRun{ID: tk(2, 1, 3), At: 14}))
	require.NotNil(t, v)
	assert.Equal(t, model.T10, v.Invariant)
	assert.Equal(t, convA, v.Conv, "the interrupted turn's conversation")
	assert.Equal(t, u(2), v.Turn)
	assert.Contains(t, v.Reason, "started the tool call "+tk(2, 1, 3)+" (at tick 14, after the turn's step had ended) once the harness let go of what it waited on (at tick 10)")
}

// A continuation without a user message of its own that a server appends
// and runs on an interrupted turn's kept message (docker-agent's serve api
// merges a client tool's output into it) gets the fake model's reply to
// that message: the reply is the continuation's own, committed with it,
// and a later turn that sees it sees no leftover of the interrupted turn
// (a false T10 before). The same reply with no continuation to own it
// stays T10's.
func TestContinuationOwnsItsReply(t *testing.T) {
	merged := call(u(2), u(1), a(1), u(2))
	merged.Tail, merged.Trailing = true, true
	continuation := appended(invalid(convA, u(3), model.OK, 200, merged))
	continuation.Reply = string(a(2)) + " acknowledges your message."
	later := ok(convA, u(4), call(u(4), u(1), a(1), u(2), a(2), u(4)))

	t.Run("the continuation's reply", func(t *testing.T) {
		m := runWith(t, keep, withSteps(interrupted2(), step{turn: continuation}, step{turn: later}))
		assert.Equal(t, h(u(1), a(1), u(2), a(2), u(4), a(4)), m.Committed(convA))
	})
	t.Run("refused, the reply is the interrupted turn's", func(t *testing.T) {
		refused := appended(invalid(convA, u(3), model.Fail, 400))
		runWith(t, keep, withSteps(interrupted2(), step{turn: refused}, step{turn: later, want: model.T10}))
	})
	t.Run("answered with no such reply", func(t *testing.T) {
		other := continuation
		other.Reply = "acknowledged."
		runWith(t, keep, withSteps(interrupted2(), step{turn: other}, step{turn: later, want: model.T10}))
	})
	t.Run("then shown twice", func(t *testing.T) {
		// docker-agent's serve api, after a blank body: the reply stored
		// again, as a user message. A committed reply, twice: T2.
		twice := ok(convA, u(4), call(u(4), u(1), a(1), u(2), a(2), a(2), u(4)))
		runWith(t, keep, withSteps(interrupted2(), step{turn: continuation}, step{turn: twice, want: model.T2}))
	})
	t.Run("then lost", func(t *testing.T) {
		lost := ok(convA, u(4), call(u(4), u(1), a(1), u(4)))
		runWith(t, keep, withSteps(interrupted2(), step{turn: continuation}, step{turn: lost, want: model.T10}))
	})
}
