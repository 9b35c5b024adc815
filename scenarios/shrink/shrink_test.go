package shrink

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
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

// TestSimplerKeepsBranches: where turns sent at once on one conversation
// branch (the Responses API), no simpler step puts two of a step's turns
// on one conversation, nor moves a branch off its own: that would be a
// run the server may rightly answer otherwise.
func TestSimplerKeepsBranches(t *testing.T) {
	first, other := model.ConversationRef{ID: "conv-1"}, model.ConversationRef{ID: "conv-2"}
	branch := model.ConversationRef{ID: "conv-3"}
	steps := []plan.Plan{plan.Single("new", plan.TurnSend(first, "tc-u1", false))}
	burst := plan.Plan{Action: plan.BurstAction(2), Release: []int{0, 1}, Sends: []plan.Send{
		plan.TurnSend(first, "tc-u2", false), plan.TurnSend(other, "tc-u3", false)}}
	branched := plan.Plan{Action: plan.BurstAction(2), Release: []int{0, 1}, Sends: []plan.Send{
		plan.TurnSend(other, "tc-u4", false), plan.TurnSend(branch, "tc-u5", false)}}
	branched.Sends[1].From = &other
	moved := func(p plan.Plan, branches bool) int {
		n := 0
		for _, q := range simpler(p, steps, branches) {
			for k := range q.Sends {
				if len(q.Sends) == len(p.Sends) && q.Sends[k].Conv != p.Sends[k].Conv {
					n++
				}
			}
		}
		return n
	}
	assert.Equal(t, 1, moved(burst, false), "under chat, a turn joins the first conversation")
	assert.Zero(t, moved(burst, true), "under the Responses API, not where one of the step's is")
	assert.Equal(t, 1, moved(branched, true), "a turn that is not a branch may")
}

// TestSimplerDropsNetworkFault: a turn whose replica's link broke is
// also tried with the link whole, on the same replica, and the network
// fault survives a save and a load of its plan.
func TestSimplerDropsNetworkFault(t *testing.T) {
	s := plan.TurnSend(model.ConversationRef{ID: "c"}, "tc-u1", false)
	s.Replica, s.Net = 2, &targets.NetFault{Link: targets.StoreLink, Kind: targets.Cut, Millis: 100}
	p := plan.Single("continue", s)
	require.NoError(t, p.Check())
	data, err := json.Marshal(p)
	require.NoError(t, err)
	var loaded plan.Plan
	require.NoError(t, json.Unmarshal(data, &loaded))
	assert.Equal(t, p, loaded)
	assert.Contains(t, p.String(), "network cut of the link to the store (dark, closed after 100ms) of the turn's replica")
	var without []plan.Plan
	for _, q := range simpler(p, []plan.Plan{p}, false) {
		if q.Sends[0].Net == nil && q.Sends[0].Replica == 2 {
			without = append(without, q)
		}
	}
	require.Len(t, without, 1)
	assert.NoError(t, without[0].Check())
	assert.NotNil(t, p.Sends[0].Net, "the plan itself is unchanged")
	burst := plan.Plan{Action: plan.BurstAction(2), Release: []int{0, 1}, Sends: []plan.Send{s, plan.TurnSend(model.ConversationRef{ID: "d"}, "tc-u2", false)}}
	assert.Error(t, burst.Check(), "a network fault holds for a turn sent on its own")
}
