package execute

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// silent is a target whose servers say nothing of their activity or of
// the requests they are done with, as most servers a profile starts, and
// whose profile declares a model timeout of 3 s: the harness lets go of a
// dropped turn its server still holds on to 1 s past it, ten times the
// longest a slow server below takes to see its client go.
type silent struct{ targets.Target }

type silentServer struct{ srv targets.Server }

func (s silentServer) URL() string  { return s.srv.URL() }
func (s silentServer) Close() error { return s.srv.Close() }
func (s silent) Profile() targets.Profile {
	p := s.Target.Profile()
	p.ModelTimeout = 3 * time.Second
	return p
}
func (s silent) Start(modelURL string) (targets.Server, error) {
	srv, err := s.Target.Start(modelURL)
	if err != nil {
		return nil, err
	}
	return silentServer{srv}, nil
}

// droppedAtALookup is a turn on conv whose model asks for two lookups at
// once, and whose client drops the connection while the first runs: a
// server that carried the turn on would start the second.
func droppedAtALookup(conv model.ConversationRef, tok model.Token) plan.Plan {
	s := plan.TurnSend(conv, tok, false)
	s.Rounds = []faults.Round{{sut.ToolLookup, sut.ToolLookup}}
	s.Abort, s.AbortAt = true, &faults.Point{Round: 1, Tool: 1}
	return plan.Single("drop", s)
}

// TestSlowServerStopsADroppedTurn: a clean server slow to see that its
// client went away (its turn notices a random 0..400 ms late, as on a busy
// machine) stops the turn all the same, and is judged to have: the model
// answers nothing of a dropped turn until the server gives up on it, or
// says it saw the disconnect, however long that takes. A harness that let
// go after a grace would have it start the turn's second lookup.
func TestSlowServerStopsADroppedTurn(t *testing.T) {
	t.Parallel() // its subtests wait on their servers
	slow := reference.Target{Stall: 400 * time.Millisecond}
	for name, target := range map[string]targets.Target{"says when": slow, "silent": silent{slow}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newSession(t, target)
			conv := model.ConversationRef{Key: "key-a", ID: "c"}
			for i := range 4 {
				ops, v := s.Step(droppedAtALookup(conv, model.UserToken(10+i)))
				require.Nil(t, v, "%+v", ops)
				require.Len(t, ops, 1)
				turn := ops[0].Turn
				require.True(t, turn.Interrupted)
				assert.NotZero(t, turn.Dropped, "when the client left is on the timeline")
				require.Len(t, turn.Runs, 1, "the second lookup started after the client left")
			}
			ops, v := s.Step(plan.Single("next", plan.TurnSend(conv, model.UserToken(20), false)))
			require.Nil(t, v, "%+v", ops)
			assert.Equal(t, model.OK, ops[0].Response.Outcome, ops[0].Response.Detail)
		})
	}
}

// TestDroppedTurnCarriedOnIsCaught: a server that runs the tools left in
// a round after its client went away (goose #7785/#7827) is T10's, with
// activity reports or without, whatever the speed at which it gave up on
// the lookup the model held. A server that says nothing of its activity
// may start the tool past the quiet period on a loaded machine: the run
// is then seen in one of the next steps, and judged the same
// (model.Turn.LateRuns).
func TestDroppedTurnCarriedOnIsCaught(t *testing.T) {
	t.Parallel() // its subtests wait on their servers
	bug := reference.Target{Mutant: sut.ToolRunsAfterCancel}
	for name, target := range map[string]targets.Target{"says when": bug, "silent": silent{bug}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := newSession(t, target)
			conv := model.ConversationRef{Key: "key-a", ID: "c"}
			ops, v := s.Step(droppedAtALookup(conv, model.UserToken(1)))
			if _, isSilent := target.(silent); isSilent {
				for i := 0; v == nil && i < 3; i++ {
					ops, v = s.Step(plan.Single("next", plan.TurnSend(model.ConversationRef{Key: "key-a", ID: "d"}, model.UserToken(2+i), false)))
				}
			}
			require.NotNil(t, v, "%+v", ops)
			assert.Equal(t, model.T10, v.Invariant, v.Reason)
			assert.Contains(t, v.Reason, "the tool call "+model.ToolCallID(model.UserToken(1), 1, 2))
		})
	}
}

// TestEveryDroppedTurnOfAStepIsWaitedFor: of two turns dropped in one
// burst, each is let go of only once its own server is done with it: a
// server that says when is let go of for each, never left to the end of
// the step.
func TestEveryDroppedTurnOfAStepIsWaitedFor(t *testing.T) {
	t.Parallel() // it mostly waits on its server
	s := newSession(t, reference.Target{Stall: 400 * time.Millisecond})
	for i := range 3 {
		p := plan.Burst(model.ConversationRef{Key: "key-a", ID: "c"}, 10*i+1, 2, 0, 1)
		p.Sends[0].Conv.ID, p.Sends[1].Conv.ID = "a", "b" // two conversations: neither waits on the other
		p.Sends[0].Abort, p.Sends[1].Abort = true, true
		ops, v := s.Step(p)
		require.Nil(t, v, "%+v", ops)
		for _, op := range ops {
			require.True(t, op.Turn.Interrupted, "%+v", op)
			assert.NotZero(t, op.Turn.Released, "turn %s was not let go of when its server said it was done with it", op.Send.Token)
		}
	}
}
