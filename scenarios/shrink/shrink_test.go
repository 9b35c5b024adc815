package shrink

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
)

// TestSimplerTools: the shrinker's plainer tool rounds each still fit the
// turn's fault and abort point, and are plainer: fewer rounds or calls, or
// an echo for a lookup; the lookup the client drops the turn in stays.
func TestSimplerTools(t *testing.T) {
	s := plan.TurnSend(model.ConversationRef{ID: "c"}, "tc-u1", false)
	s.Rounds = []faults.Round{{faults.ToolLookup, faults.ToolLookup}, {faults.ToolEcho}}
	s.Abort, s.AbortAt = true, &faults.Point{Round: 1, Tool: 2}
	var got []string
	for _, c := range simplerTools(s) {
		require.NoError(t, c.CheckTools())
		got = append(got, fmt.Sprint(c.Rounds))
	}
	assert.Equal(t, []string{"[[lookup lookup]]", "[[echo lookup] [echo]]"}, got)
	assert.Equal(t, faults.Round{faults.ToolLookup, faults.ToolLookup}, s.Rounds[0], "the send itself is unchanged")
}
