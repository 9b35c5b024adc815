package execute

import (
	"fmt"
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

// impatient is the reference server under keep-consistent whose profile
// gives the client 2 s for a turn, and says its model calls time out
// after 1 s, where the server's own bound is its default minute: a turn
// whose model call hangs outlives its client's time, as on docker-agent's
// session API under load.
type impatient struct{ reference.Target }

func (i impatient) Profile() targets.Profile {
	p := i.Target.Profile()
	p.ModelTimeout, p.ClientTimeout = time.Second, 2*time.Second
	return p
}

// Start serves it with no control of its deadlines, as a server a profile
// starts: a held model call lasts until the server's own minute.
func (i impatient) Start(modelURL string) (targets.Server, error) {
	srv, err := i.Target.Start(modelURL)
	if err != nil {
		return nil, err
	}
	return silentServer{srv}, nil
}

// TestClientTimeoutIsAnInterruption: a client whose own time runs out
// closes its connection, and its server sees it go: an interruption at a
// point the harness did not choose, judged by the declared policy (T10),
// never as an unknown outcome (T6). Under keep-consistent, the server
// keeps the turn's user message and its completed tool round, and the
// next turn shows them: no violation.
//
// Streamed, the time runs out after the answer began (200, the stream
// open): the same (docker-agent's serve api, whose event stream opens at
// once).
func TestClientTimeoutIsAnInterruption(t *testing.T) {
	t.Parallel() // its subtests wait on their servers
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			t.Parallel()
			s := newSession(t, impatient{reference.Target{Interruption: sut.KeepConsistent}})
			conv := model.ConversationRef{Key: "key-a", ID: "c"}
			send := plan.TurnSend(conv, model.UserToken(10), stream)
			send.Rounds = []faults.Round{{sut.ToolLookup}}
			send.Fault = faults.Fault{Kind: faults.Hold, Round: 1}
			ops, v := s.Step(plan.Single("outlives its client", send))
			require.Nil(t, v, "%+v", ops)
			require.Len(t, ops, 1)
			require.True(t, ops[0].Response.TimedOut, "%+v", ops[0].Response)
			assert.True(t, ops[0].Turn.Abandoned, "a client's own timeout is an interruption")

			ops, v = s.Step(plan.Single("next", plan.TurnSend(conv, model.UserToken(11), false)))
			require.Nil(t, v, "the user message and completed round kept under keep-consistent: %+v", ops)
			require.Equal(t, model.OK, ops[0].Response.Outcome, ops[0].Response.Detail)
			assert.Contains(t, firstCall(t, ops[0]), model.UserToken(10), "the server kept the turn's user message")
		})
	}
}
