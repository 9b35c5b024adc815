package history

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
)

// TestTrigger: a failure's trigger is the action of the request that
// showed it, every restart and crash, and every fault that took effect,
// in words the same at every seed; the plain turns between them, and a
// fault drawn but never reached, are not part of it.
func TestTrigger(t *testing.T) {
	ops := []Op{
		{Action: "new conversation"},
		{Action: "continue", Send: plan.Send{Abort: true}},
		{Action: "burst of 3", Send: plan.Send{Abort: true}}, // drawn, not reached
		{Action: "crash", Restart: &plan.Restart{Crash: true}},
		{Action: "one request"},
		{Action: "invalid continuation: blank last user message"},
	}
	ops[1].Turn.Interrupted = true
	assert.Equal(t, []string{"action: crash", "action: invalid continuation: blank last user message", "fault: client-abort"}, Trigger(ops))

	assert.Equal(t, []string{"action: turn"}, ops[4].Drawn(), "one turn of a new user message, whichever action sent it")
	assert.Equal(t, []string{"action: burst of N"}, ops[2].Drawn(), "a burst's size is no part of it; its abort was not reached")
	assert.Equal(t, []string{"action: turn", "fault: client-abort"}, ops[1].Drawn())
	assert.Empty(t, Trigger(nil))
}

// TestTitleFitsTheShrunkSteps: a step's title says what it does in the
// steps kept before it: a retry whose failed attempt is gone, or ended
// ok, a key's conversation with no other key's left, and a continuation
// of a conversation no step started are each named for what they are.
func TestTitleFitsTheShrunkSteps(t *testing.T) {
	a := model.ConversationRef{Key: "key-a", ID: "conv-1"}
	b := model.ConversationRef{Key: "key-b", ID: "conv-1"}
	turn := func(action string, conv model.ConversationRef, tok model.Token, out model.Outcome) Op {
		op := Op{Action: action, Send: plan.Send{Conv: conv, Token: tok}}
		op.Turn.Outcome = out
		return op
	}
	ops := []Op{
		turn("continue", a, "tc-u1", model.OK),
		turn("retry failed turn", a, "tc-u1", model.OK),
		turn("same id, other key", b, "tc-u2", model.OK),
		turn("retry failed turn", a, "tc-u3", model.OK),
	}
	assert.Equal(t, "new conversation", Title(ops, 0), "no step before it started its conversation")
	assert.Equal(t, "the same message again, after a turn that ended ok", Title(ops, 1))
	assert.Equal(t, "same id, other key", Title(ops, 2))
	assert.Equal(t, "continue", Title(ops, 3), "no attempt of it before")
	assert.Equal(t, "new conversation", Title(ops[2:], 0), "no other key's conversation left")

	ops[0].Turn.Outcome = model.Fail
	assert.Equal(t, "retry failed turn", Title(ops, 1))
	assert.Equal(t, "continue", Title(append([]Op{turn("new conversation", a, "tc-u0", model.OK)}, ops...), 1), "its conversation started before it")
}
