package history

import (
	"testing"

	"github.com/stretchr/testify/assert"

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
