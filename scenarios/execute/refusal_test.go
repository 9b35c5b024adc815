package execute

import (
	"testing"

	"github.com/stretchr/testify/assert"

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
