package model_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
)

// ---------------------------------------------------------------------------
// Helpers

// Short names for tokens: u(3) is "tc-u3", a(3) is "tc-a3".
func u(n int) model.Token { return model.UserToken(n) }
func a(n int) model.Token { return model.UserToken(n).Reply() }

// h builds a history.
func h(ts ...model.Token) []model.Token { return ts }

var (
	convA  = model.ConversationRef{ID: "conv-a"}
	convB  = model.ConversationRef{ID: "conv-b"}
	convK1 = model.ConversationRef{Key: "key-1", ID: "shared"}
	convK2 = model.ConversationRef{Key: "key-2", ID: "shared"}
)

// call is the model call of turn user carrying history.
func call(user model.Token, history ...model.Token) model.Call {
	return model.Call{History: history, Turn: user}
}

// aux is an auxiliary call (a title, a summary): its last user message is
// not the turn's.
func aux(history ...model.Token) model.Call {
	return model.Call{History: history, Turn: "tc-u999"}
}

// ok is a usable turn on conv that ended ok with 200 and the model's reply.
func ok(conv model.ConversationRef, user model.Token, calls ...model.Call) model.Turn {
	return model.Turn{Conv: conv, User: user, Usable: true, Outcome: model.OK,
		Status: 200, Reply: "sure: " + string(user.Reply()), Calls: calls}
}

// fail is a usable turn on conv that failed with 502.
func fail(conv model.ConversationRef, user model.Token, calls ...model.Call) model.Turn {
	return model.Turn{Conv: conv, User: user, Usable: true, Outcome: model.Fail,
		Status: 502, Calls: calls}
}

// unknown is a usable turn on conv whose outcome the client never learned.
func unknown(conv model.ConversationRef, user model.Token, calls ...model.Call) model.Turn {
	return model.Turn{Conv: conv, User: user, Usable: true, Outcome: model.Unknown,
		Calls: calls}
}

// invalid is a request without a usable new user message.
func invalid(conv model.ConversationRef, user model.Token, outcome model.Outcome, status int, calls ...model.Call) model.Turn {
	return model.Turn{Conv: conv, User: user, Usable: false, Outcome: outcome,
		Status: status, Calls: calls}
}

// appended is t sent to a server that appends the input whole.
func appended(t model.Turn) model.Turn {
	t.Appends = true
	return t
}

// clientTool is c with a client tool's call and output after its last
// user message: what a server appends of an input that holds only those.
func clientTool(c model.Call) model.Call {
	c = tools(c, userMsg(), asks("call_client"), answers("call_client"))
	c.Trailing = true
	return c
}

// unstored is t sent with store: false.
func unstored(t model.Turn) model.Turn {
	t.Unstored = true
	return t
}

// step is one turn fed to the model and what Apply must return for it: nil
// when want is "", else a violation of want.
type step struct {
	turn model.Turn
	want model.Invariant
}

// run applies steps in order to a fresh model, checking each result, and
// returns the model. Every step but the last must pass (they set the scene);
// the last is the one under test.
func run(t *testing.T, steps []step) *model.Model {
	t.Helper()
	return runWith(t, model.Policies{}, steps)
}

// requireViolation checks that v is a violation of want, raised for turn, with
// a reason.
func requireViolation(t *testing.T, v *model.Violation, want model.Invariant, turn model.Turn) {
	t.Helper()
	require.NotNil(t, v, "want a %s violation, got none", want)
	assert.Equal(t, want, v.Invariant, "invariant; violation: %v", v)
	assert.NotEmpty(t, v.Reason, "reason")
	assert.Equal(t, turn.Conv, v.Conv, "conversation")
	assert.Equal(t, turn.User, v.Turn, "turn")
}

// ---------------------------------------------------------------------------
// Tokens

func TestTokens(t *testing.T) {
	tests := []struct {
		name string
		text string
		want []model.Token
	}{
		{"empty", "", nil},
		{"no token", "hello there, nothing to see", nil},
		{"single user token", "tc-u1", h(u(1))},
		{"single reply token", "tc-a7", h(a(7))},
		{"in a sentence", "please answer tc-u12 now", h(u(12))},
		{"order kept", "tc-a2 then tc-u1 then tc-u3", h(a(2), u(1), u(3))},
		{"repeats kept", "tc-u1 tc-u1", h(u(1), u(1))},
		{"punctuation around", "(tc-u1), [tc-a1]. \"tc-u2\"", h(u(1), a(1), u(2))},
		{"decorated user message", "tc-u4\n[runtime: 2025-01-01T00:00:00Z]", h(u(4))},
		{"across lines", "line tc-u1\nline tc-a1\n", h(u(1), a(1))},
		{"multi-digit", "tc-u1234567", h(u(1234567))},
		{"leading zeros kept verbatim", "tc-u007", h(model.Token("tc-u007"))},
		{"prefixed by a letter", "xtc-u1", nil},
		{"prefixed by a digit", "1tc-u1", nil},
		{"prefixed by underscore", "_tc-u1", nil},
		{"suffixed by a letter", "tc-u1x", nil},
		{"suffixed by underscore", "tc-u1_", nil},
		{"longer word both sides", "abctc-u1def", nil},
		{"no digits", "tc-u", nil},
		{"other kind letter", "tc-x1", nil},
		{"upper case", "TC-U1", nil},
		{"missing dash", "tcu1", nil},
		{"word and token mixed", "xtc-u1 tc-u2 tc-u3x tc-a4", h(u(2), a(4))},
		{"hyphen is a boundary", "-tc-u1-", h(u(1))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, model.Tokens(tt.text))
		})
	}
}

func TestTokenReply(t *testing.T) {
	tests := []struct {
		in       model.Token
		wantUser bool
		want     model.Token
	}{
		{"tc-u1", true, "tc-a1"},
		{"tc-u42", true, "tc-a42"},
		{"tc-a42", false, "tc-a42"}, // a reply's reply is itself
		{"", false, ""},
	}
	for _, tt := range tests {
		t.Run(string(tt.in), func(t *testing.T) {
			assert.Equal(t, tt.wantUser, tt.in.IsUser())
			assert.Equal(t, tt.want, tt.in.Reply())
		})
	}
	assert.Equal(t, model.Token("tc-u3"), model.UserToken(3))
	assert.Equal(t, model.Token("tc-a3"), model.UserToken(3).Reply())
}

// TestLeaksNameTheirChecks: the messages of other checks a shared
// server's request carries are told apart from the check's own, and the
// checks they came from are named by their tags, each once, in the order
// met: their steps are what a replay of the leak runs first.
func TestLeaksNameTheirChecks(t *testing.T) {
	const own, first, second = "(tc0a1b2c-3)", "(tc0a1b2c-1)", "(tc0a1b2c-2)"
	assert.Equal(t, []string{first, second}, model.OtherChecks("tc-u1 "+first+" tc-u2 "+second+" "+first+" "+own, own))
	assert.Empty(t, model.OtherChecks("Please remember tc-u1. "+own, own))
	assert.Empty(t, model.OtherChecks("Please remember tc-u1. (tc0a1b2c)", own), "no check's tag")

	leaks := model.Leaks{Tag: own}
	assert.True(t, leaks.Foreign("Please remember tc-u6. "+second, h(u(6)), true))
	assert.True(t, leaks.Foreign("tc-a6", h(a(6)), false), "the reply to a leaked message")
	assert.False(t, leaks.Foreign("Please remember tc-u1. "+own, h(u(1)), true))
	assert.True(t, leaks.Foreign("Please remember tc-u6. "+first, h(u(6)), true))
	assert.True(t, leaks.Foreign("Please remember tc-u9. "+second, h(u(9)), true))
	assert.Equal(t, []string{second, first}, leaks.From())
	assert.Empty(t, (&model.Leaks{}).From(), "on a server of its own, none")
}

func TestFormatTokens(t *testing.T) {
	assert.Equal(t, "(empty)", model.FormatTokens(nil))
	assert.Equal(t, "(empty)", model.FormatTokens([]model.Token{}))
	assert.Equal(t, "tc-u1 tc-a1 tc-u2", model.FormatTokens(h(u(1), a(1), u(2))))
}

func TestInvariants(t *testing.T) {
	assert.Equal(t, []model.Invariant{model.T1, model.T2, model.T3, model.T4, model.T5, model.T6, model.T7, model.T8,
		model.T9, model.T10, model.T11}, model.Invariants())
	for _, inv := range model.Invariants() {
		assert.NotEmpty(t, inv.Title(), "title of %s", inv)
	}
	assert.Equal(t, "atomic turns", model.T1.Title())
	assert.Equal(t, "committed turns stay", model.T2.Title())
	assert.Equal(t, "no replay", model.T3.Title())
	assert.Equal(t, "one conversation, one line", model.T4.Title())
	assert.Equal(t, "isolation", model.T5.Title())
	assert.Equal(t, "unknown outcomes", model.T6.Title())
}

func TestOutcomeString(t *testing.T) {
	assert.Equal(t, "ok", model.OK.String())
	assert.Equal(t, "fail", model.Fail.String())
	assert.Equal(t, "unknown", model.Unknown.String())
	assert.Equal(t, "Outcome(9)", model.Outcome(9).String())
}

// ---------------------------------------------------------------------------
// Apply

func TestApply(t *testing.T) {
	// Scenes reused below.
	committed12 := []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: ok(convA, u(2), call(u(2), u(1), a(1), u(2)))},
	}
	failed2 := []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: fail(convA, u(2), call(u(2), u(1), a(1), u(2)))},
	}
	unknown2 := []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: unknown(convA, u(2), call(u(2), u(1), a(1), u(2)))},
	}
	with := func(scene []step, more ...step) []step {
		return append(append([]step{}, scene...), more...)
	}

	tests := []struct {
		name  string
		steps []step
		// committed, when set, is what Committed(conv of the last step)
		// must return after a passing last step.
		committed []model.Token
	}{
		// Clean sequences.
		{
			name:      "first turn",
			steps:     []step{{turn: ok(convA, u(1), call(u(1), u(1)))}},
			committed: h(u(1), a(1)),
		},
		{
			name:      "clean sequence of two ok turns",
			steps:     committed12,
			committed: h(u(1), a(1), u(2), a(2)),
		},
		{
			name: "clean sequence of three ok turns",
			steps: with(committed12,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3)))}),
			committed: h(u(1), a(1), u(2), a(2), u(3), a(3)),
		},
		{
			name: "reply with decorations around the token",
			steps: []step{{turn: model.Turn{Conv: convA, User: u(1), Usable: true,
				Outcome: model.OK, Status: 200, Reply: "Here you go (tc-a1).",
				Calls: []model.Call{call(u(1), u(1))}}}},
			committed: h(u(1), a(1)),
		},

		// T1: atomic turns.
		{
			name:      "failed turn commits nothing",
			steps:     failed2,
			committed: h(u(1), a(1)),
		},
		{
			name: "failed turn without any model call commits nothing",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: fail(convA, u(2))},
			},
			committed: h(u(1), a(1)),
		},
		{
			name: "failed turn's user message reaches a later turn",
			steps: with(failed2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))), want: model.T1}),
		},
		{
			name: "failed turn's output reaches a later turn",
			steps: with(failed2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), a(2), u(3))), want: model.T1}),
		},
		{
			name: "failed turn kept whole in a later turn",
			steps: with(failed2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3))), want: model.T1}),
		},
		{
			name: "retry of a failed turn sees it duplicated",
			steps: with(failed2,
				step{turn: ok(convA, u(2), call(u(2), u(1), a(1), u(2), u(2))), want: model.T1}),
		},
		{
			name: "retry of a failed turn sees its partial output",
			steps: with(failed2,
				step{turn: ok(convA, u(2), call(u(2), u(1), a(1), u(2), a(2), u(2))), want: model.T1}),
		},
		{
			name: "retry of a failed turn sees the last committed history",
			steps: with(failed2,
				step{turn: ok(convA, u(2), call(u(2), u(1), a(1), u(2)))}),
			committed: h(u(1), a(1), u(2), a(2)),
		},
		{
			name: "retry of a failed turn fails again, then a later turn is clean",
			steps: with(failed2,
				step{turn: fail(convA, u(2), call(u(2), u(1), a(1), u(2)))},
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))}),
			committed: h(u(1), a(1), u(3), a(3)),
		},
		{
			name: "failed turn whose history was already wrong",
			steps: with(failed2,
				step{turn: fail(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))), want: model.T1}),
		},
		{
			name: "a token no turn of the conversation holds",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2), call(u(2), u(1), a(1), u(77), u(2))), want: model.T1},
			},
		},

		// T2: committed turns stay.
		{
			name: "committed turn missing from a later call",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2), call(u(2), u(2))), want: model.T2},
			},
		},
		{
			name: "committed turn's reply missing from a later call",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2), call(u(2), u(1), u(2))), want: model.T2},
			},
		},
		{
			name: "committed turn missing from a failed later call",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: fail(convA, u(2), call(u(2), u(2))), want: model.T2},
			},
		},
		{
			name: "committed turns out of order",
			steps: with(committed12,
				step{turn: ok(convA, u(3), call(u(3), u(2), a(2), u(1), a(1), u(3))), want: model.T2}),
		},
		{
			name: "reply before its user message",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2), call(u(2), a(1), u(1), u(2))), want: model.T2},
			},
		},
		{
			name: "history does not end with the turn's message",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2), call(u(2), u(2), u(1), a(1))), want: model.T2},
			},
		},
		{
			name:  "ok with no call at all",
			steps: []step{{turn: ok(convA, u(1)), want: model.T2}},
		},
		{
			name:  "ok with only an auxiliary call",
			steps: []step{{turn: ok(convA, u(1), aux(u(1))), want: model.T2}},
		},
		{
			name: "ok with only a call of another turn",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2), call(u(1), u(1))), want: model.T2},
			},
		},
		{
			name: "ok whose reply lacks the reply token",
			steps: []step{{turn: model.Turn{Conv: convA, User: u(1), Usable: true,
				Outcome: model.OK, Status: 200, Reply: "hello",
				Calls: []model.Call{call(u(1), u(1))}}, want: model.T2}},
		},
		{
			name: "ok whose reply carries another turn's reply token",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: model.Turn{Conv: convA, User: u(2), Usable: true,
					Outcome: model.OK, Status: 200, Reply: "tc-a1",
					Calls: []model.Call{call(u(2), u(1), a(1), u(2))}}, want: model.T2},
			},
		},
		{
			name: "ok whose reply token is inside a longer word",
			steps: []step{{turn: model.Turn{Conv: convA, User: u(1), Usable: true,
				Outcome: model.OK, Status: 200, Reply: "xtc-a1",
				Calls: []model.Call{call(u(1), u(1))}}, want: model.T2}},
		},

		// Auxiliary calls are not history.
		{
			name: "auxiliary call with an unrelated history is ignored",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2), aux(), aux(u(5), u(6)), call(u(2), u(1), a(1), u(2)), aux(u(2)))},
			},
			committed: h(u(1), a(1), u(2), a(2)),
		},
		{
			name: "auxiliary call carrying a failed turn's token is ignored",
			steps: with(failed2,
				step{turn: ok(convA, u(3), aux(u(2), a(2)), call(u(3), u(1), a(1), u(3)))}),
			committed: h(u(1), a(1), u(3), a(3)),
		},
		{
			name: "auxiliary call with Turn empty is ignored",
			steps: []step{{turn: ok(convA, u(1),
				model.Call{History: h(u(9)), Turn: ""}, call(u(1), u(1)))}},
			committed: h(u(1), a(1)),
		},

		// T3: no replay.
		{
			name:  "invalid request refused with 400, no call",
			steps: []step{{turn: invalid(convA, u(1), model.Fail, 400)}},
		},
		{
			name: "invalid request after a committed turn changes nothing",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: invalid(convA, "", model.Fail, 400)},
			},
			committed: h(u(1), a(1)),
		},
		{
			name: "invalid request reaches the model",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: invalid(convA, "", model.Fail, 400, call(u(1), u(1), a(1), u(1))), want: model.T3},
			},
		},
		{
			// PROTOCOL.md allows calls that are not turns (titles,
			// summaries); only a replayed message of the conversation is one.
			name:  "invalid request during which only an auxiliary call is made",
			steps: []step{{turn: invalid(convA, "", model.Fail, 400, aux())}},
		},
		{
			name: "invalid request replays an earlier message of its conversation",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: invalid(convA, "", model.OK, 200, call(u(1), u(1), a(1), u(1))), want: model.T3},
			},
		},
		{
			name: "invalid request during which the conversation's own title is asked for",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2), call(u(2), u(1), a(1), u(2)))},
				{turn: invalid(convA, "", model.Fail, 400, call(u(1), u(1)))},
			},
		},
		{
			name: "invalid request whose blank message is passed on to the model",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: invalid(convA, "", model.Fail, 400, model.Call{History: []model.Token{u(1), a(1)}}), want: model.T3},
			},
		},
		{
			name: "an auxiliary call mixing two conversations",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convB, u(2), call(u(2), u(2)))},
				{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)), aux(u(1), a(1), u(2))), want: model.T5},
			},
		},
		{
			name: "an auxiliary call of another conversation during an invalid request",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convB, u(2), call(u(2), u(2)))},
				{turn: invalid(convA, "", model.Fail, 400, model.Call{History: []model.Token{u(2), a(2)}, Turn: u(2)})},
			},
		},
		{
			name:  "invalid request answered 200",
			steps: []step{{turn: invalid(convA, "", model.OK, 200), want: model.T3}},
		},
		{
			name: "invalid request answered 500",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: invalid(convA, "", model.Fail, 500), want: model.T3},
			},
		},
		{
			// Nothing to replay, and a server error is what a server that
			// serves nothing answers to everything: no evidence.
			name:  "invalid request answered 500 on a conversation with nothing committed",
			steps: []step{{turn: invalid(convA, "", model.Fail, 500)}},
		},
		{
			name:  "invalid request answered 409",
			steps: []step{{turn: invalid(convA, "", model.Fail, 409), want: model.T3}},
		},
		{
			name:  "invalid request answered 200, then the stream broke",
			steps: []step{{turn: invalid(convA, "", model.Unknown, 200), want: model.T3}},
		},
		{
			// Unreachable, or the client gave up: nothing to judge.
			name:  "invalid request that got no answer at all",
			steps: []step{{turn: invalid(convA, "", model.Unknown, 0)}},
		},
		{
			// Taken and never answered: a server that hangs on a blank
			// message.
			name: "invalid request the server took and never answered",
			steps: []step{{turn: func() model.Turn {
				t := invalid(convA, "", model.Unknown, 0)
				t.TimedOut = true
				return t
			}(), want: model.T3}},
		},

		// T3 where the input is appended whole (the Responses API).
		{
			name: "appended input without a user message runs on the history, answered 200",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				// A client tool's call and output, appended after the
				// history: the model sees them after the reply.
				{turn: appended(invalid(convA, "", model.OK, 200, clientTool(call(u(1), u(1), a(1)))))},
				{turn: appended(invalid(convA, "", model.OK, 200, model.Call{History: []model.Token{u(1), a(1)}, Tail: true}))},
				{turn: ok(convA, u(2), call(u(2), u(1), a(1), u(2)))},
			},
			committed: h(u(1), a(1), u(2), a(2)),
		},
		{
			name: "appended input without a user message refused, or failed",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: appended(invalid(convA, "", model.Fail, 400))},
				{turn: appended(invalid(convA, "", model.Fail, 404))},
				{turn: appended(invalid(convA, "", model.Unknown, 0, clientTool(call(u(1), u(1), a(1)))))},
			},
			committed: h(u(1), a(1)),
		},
		{
			// A request refused with 400 ran no turn: a call beside it
			// that carries the conversation as it stands (a summary) is
			// not the request's.
			name: "a refused request beside a call that carries the conversation as it stands",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: appended(invalid(convA, "", model.Fail, 400, call(u(1), u(1), a(1))))},
			},
			committed: h(u(1), a(1)),
		},
		{
			// docker-agent's session API, sent an empty list: nothing is
			// appended, and the model runs on the session as it is.
			name: "appended input without anything runs the conversation as it stands",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: appended(invalid(convA, "", model.OK, 200, call(u(1), u(1), a(1)))), want: model.T3},
			},
		},
		{
			name: "appended input without a user message replays the last committed one",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: appended(invalid(convA, "", model.OK, 200, call(u(1), u(1), a(1), u(1)))), want: model.T3},
			},
		},
		{
			name: "appended input without a user message replays one, refused all the same",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2), call(u(2), u(1), a(1), u(2)))},
				{turn: appended(invalid(convA, "", model.Fail, 502, call(u(1), u(1), a(1), u(2), a(2), u(1)))), want: model.T3},
			},
		},

		// A response not stored (store: false) is no one's base.
		{
			name: "a response not stored is seen by no later turn",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: unstored(ok(convA, u(2), call(u(2), u(1), a(1), u(2))))},
				{turn: fail(convA, u(3))},
				{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(4)))},
			},
			committed: h(u(1), a(1), u(4), a(4)),
		},
		{
			name: "a response not stored is chained from",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: unstored(ok(convA, u(2), call(u(2), u(1), a(1), u(2))))},
				{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3))), want: model.T1},
			},
		},

		// T5: isolation.
		{
			name: "two conversations, each clean",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convB, u(2), call(u(2), u(2)))},
				{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))},
			},
			committed: h(u(1), a(1), u(3), a(3)),
		},
		{
			name: "another conversation's turn leaks in",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convB, u(2), call(u(2), u(1), a(1), u(2))), want: model.T5},
			},
		},
		{
			name: "another conversation's reply alone leaks in",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convB, u(2), call(u(2), a(1), u(2))), want: model.T5},
			},
		},
		{
			name: "another conversation's failed turn leaks in",
			steps: []step{
				{turn: fail(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convB, u(2), call(u(2), u(1), u(2))), want: model.T5},
			},
		},
		{
			name: "same id under another key leaks in",
			steps: []step{
				{turn: ok(convK1, u(1), call(u(1), u(1)))},
				{turn: ok(convK2, u(2), call(u(2), u(1), a(1), u(2))), want: model.T5},
			},
		},
		{
			name: "same id under two keys, each clean",
			steps: []step{
				{turn: ok(convK1, u(1), call(u(1), u(1)))},
				{turn: ok(convK2, u(2), call(u(2), u(2)))},
			},
			committed: h(u(2), a(2)),
		},
		{
			name: "leak on a later turn of a longer conversation",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convB, u(2), call(u(2), u(2)))},
				{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))},
				{turn: ok(convB, u(4), call(u(4), u(2), a(2), u(3), a(3), u(4))), want: model.T5},
			},
		},

		// T6: unknown outcomes.
		{
			name:      "unknown turn is pending",
			steps:     unknown2,
			committed: h(u(1), a(1), u(2), a(2)),
		},
		{
			name: "unknown turn shown committed",
			steps: with(unknown2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3)))}),
			committed: h(u(1), a(1), u(2), a(2), u(3), a(3)),
		},
		{
			name: "unknown turn shown committed stays committed",
			steps: with(unknown2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3)))},
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(3), a(3), u(4))), want: model.T6}),
		},
		{
			name: "unknown turn shown not committed",
			steps: with(unknown2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))}),
			committed: h(u(1), a(1), u(3), a(3)),
		},
		{
			name: "unknown turn shown not committed, then reappears",
			steps: with(unknown2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))},
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(2), a(2), u(3), a(3), u(4))), want: model.T6}),
		},
		{
			name: "unknown turn shown not committed, then reappears after the next turn",
			steps: with(unknown2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))},
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(3), a(3), u(2), a(2), u(4))), want: model.T6}),
		},
		{
			name: "unknown turn shown not committed by a failed turn, then reappears",
			steps: with(unknown2,
				step{turn: fail(convA, u(3), call(u(3), u(1), a(1), u(3)))},
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(2), a(2), u(4))), want: model.T6}),
		},
		{
			name: "unknown turn's user message without its reply",
			steps: with(unknown2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))), want: model.T6}),
		},
		{
			name: "unknown turn's reply without its user message",
			steps: with(unknown2,
				step{turn: ok(convA, u(3), call(u(3), u(1), a(1), a(2), u(3))), want: model.T6}),
		},
		{
			name: "unknown turn without any model call, shown not committed",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: unknown(convA, u(2))},
				{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))},
			},
			committed: h(u(1), a(1), u(3), a(3)),
		},
		{
			name: "two unknown turns, first dropped, second committed",
			steps: with(unknown2,
				step{turn: unknown(convA, u(3), call(u(3), u(1), a(1), u(3)))},
				step{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(3), a(3), u(4)))}),
			committed: h(u(1), a(1), u(3), a(3), u(4), a(4)),
		},
		{
			name: "unknown turn still pending keeps committed turns mandatory",
			steps: with(unknown2,
				step{turn: ok(convA, u(3), call(u(3), u(2), a(2), u(3))), want: model.T2}),
		},
		{
			name: "unknown turn committed out of its place",
			steps: with(unknown2,
				step{turn: ok(convA, u(3), call(u(3), u(2), a(2), u(1), a(1), u(3))), want: model.T2}),
		},

		// A server retrying the model call within one turn.
		{
			name: "retried model call with the same history",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2),
					call(u(2), u(1), a(1), u(2)),
					call(u(2), u(1), a(1), u(2)),
					call(u(2), u(1), a(1), u(2)))},
			},
			committed: h(u(1), a(1), u(2), a(2)),
		},
		{
			name: "retried model call of a failed turn with the same history",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: fail(convA, u(2),
					call(u(2), u(1), a(1), u(2)),
					call(u(2), u(1), a(1), u(2)))},
			},
			committed: h(u(1), a(1)),
		},
		{
			name: "retried model call loses a committed turn",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2),
					call(u(2), u(1), a(1), u(2)),
					call(u(2), u(2))), want: model.T2},
			},
		},
		{
			name: "retried model call duplicates the user message",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2),
					call(u(2), u(1), a(1), u(2)),
					call(u(2), u(1), a(1), u(2), u(2))), want: model.T1},
			},
		},
		{
			name: "retried model call carries the first attempt's partial reply",
			steps: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
				{turn: ok(convA, u(2),
					call(u(2), u(1), a(1), u(2)),
					call(u(2), u(1), a(1), u(2), a(2), u(2))), want: model.T1},
			},
		},
		{
			name: "retried model call of the same turn, unknown turn both committed and dropped",
			steps: with(unknown2,
				step{turn: ok(convA, u(3),
					call(u(3), u(1), a(1), u(2), a(2), u(3)),
					call(u(3), u(1), a(1), u(3))), want: model.T6}),
		},
		{
			name: "retried model call agrees on an unknown turn's commit",
			steps: with(unknown2,
				step{turn: ok(convA, u(3),
					call(u(3), u(1), a(1), u(2), a(2), u(3)),
					call(u(3), u(1), a(1), u(2), a(2), u(3)))}),
			committed: h(u(1), a(1), u(2), a(2), u(3), a(3)),
		},
		{
			name: "retried model call agrees on an unknown turn's drop",
			steps: with(unknown2,
				step{turn: ok(convA, u(3),
					call(u(3), u(1), a(1), u(3)),
					call(u(3), u(1), a(1), u(3)))}),
			committed: h(u(1), a(1), u(3), a(3)),
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.NotEmpty(t, tt.steps)
			m := run(t, tt.steps)
			last := tt.steps[len(tt.steps)-1]
			if tt.committed != nil {
				require.Empty(t, last.want, "test bug: committed is only checked after a passing step")
				assert.Equal(t, tt.committed, m.Committed(last.turn.Conv))
			}
		})
	}
}

func TestCommittedUnknownConversation(t *testing.T) {
	m := model.New()
	assert.Nil(t, m.Committed(convA))
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	assert.Nil(t, m.Committed(convB))
	assert.Nil(t, m.Committed(model.ConversationRef{Key: "other", ID: convA.ID}))
	assert.Equal(t, h(u(1), a(1)), m.Committed(convA))
}

// An invalid request is not recorded as a conversation: it changes nothing.
func TestInvalidRequestCreatesNoConversation(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(invalid(convA, "", model.Fail, 400)))
	assert.Nil(t, m.Committed(convA))
}

// TestInvalidRequestNamesTheReplay: an invalid request answered as a turn,
// on a conversation with nothing committed, names the message the model
// was sent as the new one: what T3 forbids shows in its reason. A message
// the conversation never held is not called an earlier one, nor a replay.
func TestInvalidRequestNamesTheReplay(t *testing.T) {
	v := model.New().Apply(invalid(convA, "", model.OK, 200, call(u(3), u(3))))
	require.NotNil(t, v)
	assert.Equal(t, model.T3, v.Invariant)
	assert.Contains(t, v.Reason, "; the model was sent tc-u3 as the new user message, though the request did not send it as one")
	assert.NotContains(t, v.Reason, "earlier")
	// Answered without the model, there is no replay to name.
	v = model.New().Apply(invalid(convA, "", model.OK, 200))
	require.NotNil(t, v)
	assert.NotContains(t, v.Reason, "replay")
}

// The violation of a failed turn's duplicate names it, and the expected and
// observed histories show it.
func TestViolationHistories(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	require.Nil(t, m.Apply(fail(convA, u(2), call(u(2), u(1), a(1), u(2)))))
	turn := ok(convA, u(2), call(u(2), u(1), a(1), u(2), u(2)))
	v := m.Apply(turn)
	requireViolation(t, v, model.T1, turn)
	assert.Equal(t, h(u(1), a(1), u(2)), v.Expected)
	assert.Equal(t, h(u(1), a(1), u(2), u(2)), v.Observed)
	assert.Contains(t, v.Reason, string(u(2)))
}

func TestViolationHistoriesT5(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	turn := ok(convB, u(2), call(u(2), u(1), a(1), u(2)))
	v := m.Apply(turn)
	requireViolation(t, v, model.T5, turn)
	assert.Equal(t, h(u(2)), v.Expected)
	assert.Equal(t, h(u(1), a(1), u(2)), v.Observed)
	assert.Contains(t, v.Reason, string(u(1)))
}

// ---------------------------------------------------------------------------
// Checked

func TestChecked(t *testing.T) {
	m := model.New()
	assert.Empty(t, m.Checked())

	// A first turn can break neither T1 (nothing failed yet), T2 (nothing
	// committed) nor T5 (no other conversation).
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	c := m.Checked()
	assert.Zero(t, c[model.T1])
	assert.Zero(t, c[model.T2])
	assert.Zero(t, c[model.T5])

	// Two calls of the turn are two checks; an auxiliary call is none.
	require.Nil(t, m.Apply(ok(convA, u(2), aux(), call(u(2), u(1), a(1), u(2)), call(u(2), u(1), a(1), u(2)))))
	c = m.Checked()
	assert.Equal(t, 2, c[model.T2])
	assert.Zero(t, c[model.T1], "no turn has failed")
	assert.Zero(t, c[model.T5], "one conversation")

	// Invalid requests are T3 checks.
	require.Nil(t, m.Apply(invalid(convA, "", model.Fail, 400)))
	assert.Equal(t, 1, m.Checked()[model.T3])
	assert.Equal(t, 2, m.Checked()[model.T2], "an invalid request checks nothing else")

	// T1 once a turn has failed.
	require.Nil(t, m.Apply(fail(convA, u(9), call(u(9), u(1), a(1), u(2), a(2), u(9)))))
	require.Nil(t, m.Apply(ok(convA, u(10), call(u(10), u(1), a(1), u(2), a(2), u(10)))))
	assert.Equal(t, 1, m.Checked()[model.T1])

	// T6 is checked only while an unknown turn is pending.
	h := []model.Token{u(1), a(1), u(2), a(2), u(10), a(10)}
	require.Nil(t, m.Apply(unknown(convA, u(3), call(u(3), append(h, u(3))...))))
	assert.Equal(t, 0, m.Checked()[model.T6])
	require.Nil(t, m.Apply(ok(convA, u(4), call(u(4), append(h, u(3), a(3), u(4))...))))
	assert.Equal(t, 1, m.Checked()[model.T6])
	require.Nil(t, m.Apply(ok(convA, u(5), call(u(5), append(h, u(3), a(3), u(4), a(4), u(5))...))))
	assert.Equal(t, 1, m.Checked()[model.T6], "nothing pending any more")

	// T5 once there are two conversations; counts only grow.
	before := m.Checked()
	_ = m.Apply(ok(convB, u(6), call(u(6), u(6))))
	after := m.Checked()
	for _, inv := range model.Invariants() {
		assert.GreaterOrEqual(t, after[inv], before[inv], "%s", inv)
	}
	assert.Equal(t, 1, after[model.T5])
}

func TestCheckedReturnsACopy(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	require.Nil(t, m.Apply(invalid(convA, "", model.Fail, 400)))
	c := m.Checked()
	c[model.T3] = 100
	assert.Equal(t, 1, m.Checked()[model.T3])
}

// ---------------------------------------------------------------------------
// Violation.Error

func TestViolationError(t *testing.T) {
	tests := []struct {
		name    string
		v       model.Violation
		want    []string
		notWant []string
	}{
		{
			name: "full",
			v: model.Violation{Invariant: model.T1, Conv: convA, Turn: u(3),
				Reason:   "something broke",
				Expected: h(u(1), a(1), u(3)), Observed: h(u(1), a(1), u(2), u(3))},
			want: []string{"T1", "atomic turns", `"conv-a"`, "tc-u3", "something broke",
				"\n  expected: tc-u1 tc-a1 tc-u3", "\n  observed: tc-u1 tc-a1 tc-u2 tc-u3"},
		},
		{
			name:    "with key",
			v:       model.Violation{Invariant: model.T5, Conv: convK2, Turn: u(2), Reason: "leak"},
			want:    []string{"T5", "isolation", `"shared"`, "key-2", "leak"},
			notWant: []string{"expected:", "observed:"},
		},
		{
			name:    "no turn, no histories",
			v:       model.Violation{Invariant: model.T3, Conv: convB, Reason: "replayed"},
			want:    []string{"T3", "no replay", `"conv-b"`, "replayed"},
			notWant: []string{"turn ", "expected:", "observed:"},
		},
		{
			name:    "only observed",
			v:       model.Violation{Invariant: model.T2, Conv: convA, Reason: "r", Observed: h(a(1))},
			want:    []string{"T2", "\n  observed: tc-a1"},
			notWant: []string{"expected:"},
		},
		{
			name: "empty but non-nil histories",
			v: model.Violation{Invariant: model.T6, Conv: convA, Reason: "r",
				Expected: []model.Token{}, Observed: []model.Token{}},
			want: []string{"T6", "unknown outcomes", "expected: (empty)", "observed: (empty)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.v.Error()
			for _, w := range tt.want {
				assert.Contains(t, s, w)
			}
			for _, w := range tt.notWant {
				assert.NotContains(t, s, w)
			}
		})
	}
}

// A violation returned by Apply renders with its invariant, conversation and
// histories, and works as an error.
func TestApplyViolationError(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	turn := ok(convA, u(2), call(u(2), u(2)))
	v := m.Apply(turn)
	requireViolation(t, v, model.T2, turn)

	var err error = v
	s := err.Error()
	assert.True(t, strings.HasPrefix(s, "T2 (committed turns stay)"), s)
	assert.Contains(t, s, `"conv-a"`)
	assert.Contains(t, s, "turn tc-u2")
	assert.Contains(t, s, "expected: tc-u1 tc-a1 tc-u2")
	assert.Contains(t, s, "observed: tc-u2")
}

// ---------------------------------------------------------------------------
// The most specific invariant

// These histories break more than one rule; the violation must name the
// invariant PROTOCOL.md gives for them, so a report points at the right bug.
func TestMostSpecificInvariant(t *testing.T) {
	unknown2 := []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: unknown(convA, u(2), call(u(2), u(1), a(1), u(2)))},
	}
	tests := []struct {
		name  string
		setup []step
		last  model.Turn
		// want is what PROTOCOL.md names.
		want model.Invariant
		why  string
	}{
		{
			name: "committed turn duplicated",
			setup: []step{
				{turn: ok(convA, u(1), call(u(1), u(1)))},
			},
			last: ok(convA, u(2), call(u(2), u(1), a(1), u(1), a(1), u(2))),
			want: model.T2,
			why:  "T2: an ok turn appears in every later request \"exactly once\"",
		},
		{
			name:  "unknown turn committed twice",
			setup: unknown2,
			last:  ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(2), a(2), u(3))),
			want:  model.T6,
			why:   "T6: an unknown turn is committed \"at most once\"",
		},
		{
			name:  "unknown turn dropped by a call, back in a retried call of the same turn",
			setup: unknown2,
			last: ok(convA, u(3),
				call(u(3), u(1), a(1), u(3)),
				call(u(3), u(1), a(1), u(2), a(2), u(3))),
			want: model.T6,
			why:  "T6: the first call showed tc-u2 was not committed; model.go marks it dropped only after all calls of the turn",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := run(t, tt.setup)
			v := m.Apply(tt.last)
			require.NotNil(t, v, "the history must be rejected")
			assert.NotEmpty(t, v.Reason)
			assert.Equal(t, tt.last.Conv, v.Conv)
			assert.Equal(t, tt.last.User, v.Turn)
			assert.Equal(t, tt.want, v.Invariant, "%s; reason: %s", tt.why, v.Reason)
		})
	}
}

// ---------------------------------------------------------------------------
// Restarts (T7, T8)

// failedBefore is a usable turn refused with status before any model call.
func failedBefore(conv model.ConversationRef, user model.Token, status int) model.Turn {
	return model.Turn{Conv: conv, User: user, Usable: true, Outcome: model.Fail, Status: status}
}

func TestRestartDurability(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(false, false)
	// The committed turn is gone after the restart: T7, not T2.
	v := m.Apply(ok(convA, u(2), call(u(2), u(2))))
	require.NotNil(t, v)
	assert.Equal(t, model.T7, v.Invariant)
	assert.Contains(t, v.Reason, "after a restart")

	// Whole after the restart: fine, and T7 was evaluated.
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(true, false)
	require.Nil(t, m.Apply(ok(convA, u(2), call(u(2), u(1), a(1), u(2)))))
	assert.Equal(t, 1, m.Checked()[model.T7])
	// Once a call showed it whole, a later loss is no longer the restart's.
	v = m.Apply(ok(convA, u(3), call(u(3), u(3))))
	require.NotNil(t, v)
	assert.Equal(t, model.T2, v.Invariant)

	// A conversation that cannot be resumed at all after a plain restart.
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(false, false)
	v = m.Apply(failedBefore(convA, u(2), 500))
	require.NotNil(t, v)
	assert.Equal(t, model.T7, v.Invariant)

	// A committed turn shown twice after a restart is T2's, as it is
	// without one (docker-agent's serve api stores a reply again as a
	// user message): one finding, not one per restart.
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(false, false)
	v = m.Apply(ok(convA, u(2), call(u(2), u(1), a(1), a(1), u(2))))
	require.NotNil(t, v)
	assert.Equal(t, model.T2, v.Invariant, v.Reason)
}

func TestRestartSourceChange(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(false, false)
	require.False(t, m.Survived())
	require.Nil(t, m.Apply(ok(convA, u(2), call(u(2), u(1), a(1), u(2)))))
	require.True(t, m.Survived(), "a conversation resumed after a plain restart")
	m.Restart(true, false)
	// #3410: "agent not found" after the query changed.
	v := m.Apply(failedBefore(convA, u(3), 500))
	require.NotNil(t, v)
	assert.Equal(t, model.T8, v.Invariant)
	assert.Contains(t, v.Reason, "stable key")

	// Lost after a restart that changed the source, on a server not yet
	// seen to keep a conversation across a plain one: durability's.
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(true, false)
	v = m.Apply(failedBefore(convA, u(2), 404))
	require.NotNil(t, v)
	assert.Equal(t, model.T7, v.Invariant, v.Reason)
	assert.False(t, m.Survived())

	// A model error after the resume is the model's, not the resume's.
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(true, false)
	require.Nil(t, m.Apply(fail(convA, u(2), call(u(2), u(1), a(1), u(2)))))
	require.Nil(t, m.Apply(ok(convA, u(3), call(u(3), u(1), a(1), u(3)))))
	assert.Equal(t, 1, m.Checked()[model.T8])

	// Two turns at once after the change (docker-agent's serve a2a: both
	// create the context's session, one fails "already exists"): one
	// resumed, so the other's failure before its model call is the way
	// the server takes two turns at once (T4's), not a failed resume.
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(false, false)
	require.Nil(t, m.Apply(ok(convA, u(2), call(u(2), u(1), a(1), u(2)))))
	m.Restart(true, false)
	lost := at(failedBefore(convA, u(3), 502), 1, 0, 4)
	resumed := at(ok(convA, u(4), call(u(4), u(1), a(1), u(2), a(2), u(4))), 2, 3, 5)
	v = m.ApplyStep([]model.Turn{lost, resumed})
	require.NotNil(t, v, "refused while the other ran, under serialize")
	assert.Equal(t, model.T4, v.Invariant, v.Reason)

	// A conversation with nothing committed binds anew: no resume.
	m = model.New()
	require.Nil(t, m.Apply(fail(convA, u(1), call(u(1), u(1)))))
	m.Restart(true, false)
	require.Nil(t, m.Apply(failedBefore(convA, u(2), 404)))
}

func TestRestartAmbiguousSources(t *testing.T) {
	// A conversation resumed after a plain restart first: the server keeps
	// them across one, so a refusal now is the sources' doing.
	setup := func() *model.Model {
		m := model.New()
		require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
		m.Restart(false, false)
		require.Nil(t, m.Apply(ok(convA, u(6), call(u(6), u(1), a(1), u(6)))))
		m.Restart(true, true)
		return m
	}
	// 409 and nothing changes: fine, again and again; a 409 is no T4
	// deviation here even under serialize.
	m := setup()
	require.Nil(t, m.Apply(failedBefore(convA, u(2), 409)))
	require.Nil(t, m.Apply(failedBefore(convA, u(3), 409)))
	assert.Equal(t, 2, m.Checked()[model.T8])
	// A new conversation may be refused too.
	require.Nil(t, m.Apply(failedBefore(convB, u(4), 409)))
	// Back to one source: the history is whole, the refused turns gone.
	m.Restart(true, false)
	require.Nil(t, m.Apply(ok(convA, u(5), call(u(5), u(1), a(1), u(6), a(6), u(5)))))

	for name, turn := range map[string]model.Turn{
		"a silent pick": ok(convA, u(2), call(u(2), u(1), a(1), u(6), a(6), u(2))),
		"a 500":         failedBefore(convA, u(2), 500),
		"a 404":         failedBefore(convA, u(2), 404),
	} {
		v := setup().Apply(turn)
		require.NotNil(t, v, name)
		assert.Equal(t, model.T8, v.Invariant, name)
	}
	// A conversation the server lost and started afresh is a lost history
	// (T7), decided before the resume: not a silent pick.
	v := setup().Apply(ok(convA, u(2), call(u(2), u(2))))
	require.NotNil(t, v)
	assert.Equal(t, model.T7, v.Invariant, "%v", v)

	// No conversation has resumed after a plain restart yet: a 404 or a
	// 500 may be any restart's loss (T7); a silent pick is T8's still.
	fresh := func() *model.Model {
		m := model.New()
		require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
		m.Restart(true, true)
		return m
	}
	for _, status := range []int{404, 500} {
		v := fresh().Apply(failedBefore(convA, u(2), status))
		require.NotNil(t, v)
		assert.Equal(t, model.T7, v.Invariant, "%d: %v", status, v)
	}
	v = fresh().Apply(ok(convA, u(2), call(u(2), u(1), a(1), u(2))))
	require.NotNil(t, v)
	assert.Equal(t, model.T8, v.Invariant, "%v", v)
	require.Nil(t, fresh().Apply(failedBefore(convA, u(2), 409)))
}

// TestRestartEdges: what a restart must not make the model say.
func TestRestartEdges(t *testing.T) {
	// Under reject, a 409 for a turn sent beside the resuming one is a
	// refusal for a busy conversation, not a failed resume.
	m := model.NewWith(model.Policies{Concurrency: model.Reject})
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(false, false)
	require.Nil(t, m.ApplyStep([]model.Turn{
		at(ok(convA, u(2), call(u(2), u(1), a(1), u(2))), 1, 3, 6),
		at(conflict(convA, u(3)), 2, 0, 4),
	}))

	// A conversation started while two sources share the stable key binds
	// to one of them: its next turn is no resume.
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(true, true)
	require.Nil(t, m.Apply(ok(convB, u(2), call(u(2), u(2)))))
	require.Nil(t, m.Apply(ok(convB, u(3), call(u(3), u(2), a(2), u(3)))))

	// A committed turn lost across a restart that also changed the
	// source is durability's (T7): T8 is about resuming at all.
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(true, false)
	v := m.Apply(ok(convA, u(2), call(u(2), u(2))))
	require.NotNil(t, v)
	assert.Equal(t, model.T7, v.Invariant)

	// Under serialize, a turn sent beside the resuming one that waited out
	// the model timeout and was refused is a bounded wait ending (T4's),
	// and a front's 502 is the front's: neither is a failed resume.
	for name, excuse := range map[string]func(*model.Turn){
		"a bounded wait": func(t *model.Turn) { t.WaitedOut = true },
		"a front's 502":  func(t *model.Turn) { t.Gateway = true },
	} {
		m = model.New()
		require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
		m.Restart(true, false)
		refused := at(failedBefore(convA, u(3), 503), 2, 0, 5)
		excuse(&refused)
		require.Nil(t, m.ApplyStep([]model.Turn{at(ok(convA, u(2), call(u(2), u(1), a(1), u(2))), 1, 3, 6), refused}), name)
	}
	// Nor, while two sources share the stable key (where anything but a
	// 409 is T8's), is a front's 502.
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(true, true)
	gateway := failedBefore(convA, u(2), 502)
	gateway.Gateway = true
	require.Nil(t, m.Apply(gateway))
	require.Nil(t, m.Apply(failedBefore(convA, u(3), 409)), "the resume is judged by the next turn")
	assert.Equal(t, 1, m.Checked()[model.T8])

	// A slow refusal with no other turn to wait behind is a failed resume.
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(false, false)
	slow := failedBefore(convA, u(2), 503)
	slow.WaitedOut = true
	v = m.Apply(slow)
	require.NotNil(t, v)
	assert.Equal(t, model.T7, v.Invariant)

	// A resume that showed nothing (no answer, no call) is not counted.
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(false, false)
	require.Nil(t, m.Apply(unknown(convA, u(2))))
	assert.Zero(t, m.Checked()[model.T7])

	// A refusal sent within the server's declared takeover bound after a
	// kill under a turn of the conversation is no failed resume, nor a
	// refusal to wait beside a running turn (T4): the conversation may
	// still be the dead turn's. The next turn judges the resume.
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(false, false)
	held := failedBefore(convA, u(2), 503)
	held.InTakeover = true
	require.Nil(t, m.Apply(held))
	assert.Zero(t, m.Checked()[model.T7])
	v = m.Apply(failedBefore(convA, u(3), 503))
	require.NotNil(t, v, "past the bound, a refusal is a failed resume")
	assert.Equal(t, model.T7, v.Invariant)
	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	held = at(failedBefore(convA, u(3), 503), 2, 0, 5)
	held.InTakeover = true
	require.Nil(t, m.ApplyStep([]model.Turn{at(ok(convA, u(2), call(u(2), u(1), a(1), u(2))), 1, 3, 6), held}))
}

// TestUnsentIsNoEvidence: a request that never reached the server (the
// protocol's call before it failed, or no server ran) is judged by no
// invariant, whatever it would have been; a refused session/load of a
// durable conversation after a restart is judged as the resume it was
// (T7), never as the outcome of the prompt that was to follow.
func TestUnsentIsNoEvidence(t *testing.T) {
	unsent := func(tr model.Turn, status int) model.Turn {
		tr.Unsent, tr.Status, tr.Calls = true, status, nil
		return tr
	}
	m := model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	// An empty prompt never sent: no T3 (it was not refused with 400).
	require.Nil(t, m.Apply(unsent(invalid(convA, "", model.Fail, 0), 0)))
	assert.Zero(t, m.Checked()[model.T3])
	m.Restart(false, false)
	// Its load not sent either (the agent was down): nothing judged.
	require.Nil(t, m.Apply(unsent(fail(convA, u(2)), 0)))
	assert.Zero(t, m.Checked()[model.T7])
	// An empty prompt whose load was refused: the load is T7's.
	v := m.Apply(unsent(invalid(convA, "", model.Fail, 0), 404))
	require.NotNil(t, v)
	assert.Equal(t, model.T7, v.Invariant)
	assert.Contains(t, v.Reason, "did not resume")

	// The turn it was to carry is no failed turn: its token may come
	// later, and its message is no leftover (T1).
	m = model.New()
	require.Nil(t, m.Apply(unsent(fail(convA, u(1)), 0)))
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	assert.Zero(t, m.Checked()[model.T1])
}

// TestForeignTokensAreALeak: a token of another check's conversation in a
// model request is a leak between conversations (T5), never a leftover of
// this check's turns (T1): its number may be one this check uses too.
func TestForeignTokensAreALeak(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(fail(convA, u(6))))
	c := call(u(7), u(7))
	c.Foreign = h(u(6), a(6))
	v := m.Apply(ok(convA, u(7), c))
	require.NotNil(t, v)
	assert.Equal(t, model.T5, v.Invariant)
	assert.Contains(t, v.Reason, "earlier check")
}

// TestAnyRefusalUnderACP: where refusals carry no HTTP status (ACP), any
// error before a model call refuses a request without a usable message,
// whatever status it was read as; one the agent ran is T3's, in ACP's
// words.
func TestAnyRefusalUnderACP(t *testing.T) {
	acp := func(tr model.Turn) model.Turn {
		tr.AnyRefusal = true
		return tr
	}
	m := model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	require.Nil(t, m.Apply(acp(invalid(convA, "", model.Fail, 500))), "a JSON-RPC error read as 500 refuses it")
	v := m.Apply(acp(invalid(convA, "", model.OK, 0)))
	require.NotNil(t, v)
	assert.Equal(t, model.T3, v.Invariant)
	assert.Contains(t, v.Reason, "ended ok; want it refused (a JSON-RPC error, or stopReason refusal)")
	assert.NotContains(t, v.Reason, "status")

	// A2A, in its own words: a context that holds nothing committed (its
	// only task failed) answered "context not found", read as 404, after
	// a restart, is refused, as any JSON-RPC error before a model call is.
	a2a := func(tr model.Turn) model.Turn {
		tr.AnyRefusal, tr.RefusalSays = true, "a JSON-RPC error, or a task rejected or failed before any model call"
		return tr
	}
	m = model.New()
	require.Nil(t, m.Apply(fail(convA, u(1), call(u(1), u(1)))))
	require.Nil(t, m.Apply(a2a(invalid(convA, "", model.Fail, 404))), "a JSON-RPC error read as 404 refuses it")
	v = m.Apply(a2a(invalid(convA, "", model.OK, 0)))
	require.NotNil(t, v)
	assert.Contains(t, v.Reason, "ended ok; want it refused (a JSON-RPC error, or a task rejected or failed before any model call)")
	// One that reached the model, run as the conversation stands, is
	// held to the same words.
	m2 := model.New()
	require.Nil(t, m2.Apply(ok(convA, u(1), call(u(1), u(1)))))
	v = m2.Apply(a2a(invalid(convA, "", model.OK, 0, call(u(1), u(1), a(1)))))
	require.NotNil(t, v)
	assert.Equal(t, model.T3, v.Invariant)
	assert.Contains(t, v.Reason, "it must be refused (a JSON-RPC error, or a task rejected or failed before any model call)")
	assert.NotContains(t, v.Reason, "400")
	require.Nil(t, m.Apply(invalid(convB, "", model.Fail, 400)))
	v = m.Apply(invalid(convB, "", model.Fail, 404))
	require.NotNil(t, v, "chat refuses with 400")
	assert.Contains(t, v.Reason, "with status 404; want 400")
}
