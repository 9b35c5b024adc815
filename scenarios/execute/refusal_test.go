package execute

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// TestRefusalsReadAsTheProtocolSays: a turn is judged by its protocol's
// refusals (targets.Protocols): under A2A and ACP any failure before a
// model call refuses a request without a usable message, in the
// protocol's own words; under chat only a 400 does.
func TestRefusalsReadAsTheProtocolSays(t *testing.T) {
	for _, c := range []struct {
		protocol targets.Protocol
		any      bool
		says     string
	}{
		{targets.Chat, false, ""},
		{targets.Sessions, false, ""},
		{targets.ACP, true, "stopReason refusal"},
		{targets.A2A, true, "a task rejected or failed"},
	} {
		e := &executor{profile: targets.Profile{Protocol: c.protocol}, aux: NewAuxInstructions(nil)}
		ops := []history.Op{{}}
		e.attribute(ops, nil, nil)
		assert.Equal(t, c.any, ops[0].Turn.AnyRefusal, c.protocol)
		assert.Contains(t, ops[0].Turn.RefusalSays, c.says, c.protocol)
	}
}

// A breach printed under another finding of its step is counted: the wire
// finding's SAME CAUSE, with its first example, never a pass.
func TestBreachBesideAFindingIsCounted(t *testing.T) {
	s := &Session{Profile: targets.Profile{Protocol: targets.A2A}, Aside: map[model.ConversationRef]bool{},
		SameCause: map[model.Invariant]int{}, Folded: map[model.Invariant]model.Violation{}}
	conv := model.ConversationRef{ID: "conv-1"}
	ops := []history.Op{{Turn: model.Turn{Conv: conv}}}
	ops[0].Response.Breaches = []string{"tasks/get of task t1 shows tc-a3"}
	s.breachesBeside(&model.Violation{Invariant: model.T3, Conv: conv}, ops)
	assert.Equal(t, 1, s.SameCause[model.Wire])
	assert.Contains(t, s.Folded[model.Wire].Reason, "shows tc-a3")

	// Without a breach, nothing; a wire finding is its own.
	ops[0].Response.Breaches = nil
	s.breachesBeside(&model.Violation{Invariant: model.T3, Conv: conv}, ops)
	assert.Equal(t, 1, s.SameCause[model.Wire])
	ops[0].Response.Breaches = []string{"x"}
	s.breachesBeside(&model.Violation{Invariant: model.Wire, Conv: conv}, ops)
	assert.Equal(t, 1, s.SameCause[model.Wire])
}
