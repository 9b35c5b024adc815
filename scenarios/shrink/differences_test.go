package shrink

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/protocol"
)

// burstOp is request index of a burst at step 2 on conversation c,
// answered ok with status 200 at return on the run's timeline.
func burstOp(index int, tok model.Token, ret int64) history.Op {
	conv := model.ConversationRef{Key: "key-a", ID: "c"}
	return history.Op{Step: 2, Index: index, Send: plan.TurnSend(conv, tok, false),
		Response: protocol.Response{Outcome: model.OK, Status: 200},
		Turn:     model.Turn{Conv: conv, User: tok, Outcome: model.OK, Status: 200, Calls: []model.Call{{}}, Return: ret}}
}

// TestDifferencesSayEachKind: each way a replay may go otherwise than the
// failing run is named once, where it first happened, and a replay that
// went the same way has none.
func TestDifferencesSayEachKind(t *testing.T) {
	one, two := 1, 2
	failing := []history.Op{burstOp(0, "tc-u1", 10), burstOp(1, "tc-u2", 20)}
	failing[0].Served, failing[1].Served = &one, &one
	assert.Empty(t, Differences(failing, failing))

	replay := []history.Op{burstOp(0, "tc-u1", 30), burstOp(1, "tc-u2", 20)}
	replay[0].Served, replay[1].Served = &one, &two
	replay[0].Response, replay[0].Turn.Outcome = protocol.Response{Outcome: model.Unknown, Cause: "no response within the client's time"}, model.Unknown
	replay[0].Turn.TimedOut, replay[0].Turn.Calls = true, nil
	replay[1].Net = history.NetBroken
	assert.Equal(t, []string{
		"at step 2, request 1 (c, tc-u1): the failing run got ok 200, the replay unknown with no status (no response within the client's time)",
		"at step 2, request 1 (c, tc-u1): the request reached the model 1 time(s) in the failing run, 0 in the replay",
		"at step 2, request 1 (c, tc-u1): the turn ended plainly in the failing run, got no answer within the client's time in the replay",
		"at step 2, request 2 (c, tc-u2): served by replica 1 in the failing run, by replica 2 in the replay",
		`at step 2, request 2 (c, tc-u2): its network fault was "" in the failing run, "broken while the turn was in flight" in the replay`,
		"at step 2: its requests were answered in the order [1 2] in the failing run, [2 1] in the replay",
	}, Differences(failing, replay))

	assert.Equal(t, []string{"the replay ended before step 2"}, Differences(failing, nil))
}
