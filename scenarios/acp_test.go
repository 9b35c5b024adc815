//go:build unix

package scenarios_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/protocol"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// noTimeout is the reference server as an ACP agent that, as docker-agent
// does, has no model timeout the harness can bring forward: a call held
// "until the server's timeout" is held until the client's time runs out
// and the client cancels the prompt (session/cancel).
type noTimeout struct{ reference.Target }

// clientTime is the client's wait for a prompt, in noTimeout's profile:
// the agent's own deadline never passes before it.
const clientTime = 300 * time.Millisecond

func (n noTimeout) Profile() targets.Profile {
	p := n.Target.Profile()
	p.ClientTimeout = clientTime
	return p
}

func (n noTimeout) Start(modelURL string) (targets.Server, error) {
	srv, err := n.Target.Start(modelURL)
	if err != nil {
		return nil, err
	}
	return noDeadlines{srv.(targets.ACPServer), srv.(targets.ActivityReporter)}, nil
}

// noDeadlines is an ACP agent whose deadlines the harness cannot expire
// (no targets.DeadlineController), and which cannot be restarted.
type noDeadlines struct {
	targets.ACPServer
	activity targets.ActivityReporter
}

func (s noDeadlines) Activity() (working, waiting int, changed <-chan struct{}) {
	return s.activity.Activity()
}

// TestACPClientCancelIsInterruption: a prompt held until its agent's
// timeout, on an agent that has none, ends with the client's time and the
// client's session/cancel: the turn is interrupted (T10 judges what
// stays), though the plan drew no abort of it. On the clean agent nothing
// of it stays and nothing is found; on one that commits a cancelled
// prompt, the next turn's model call shows it, and that is T10's, not an
// unknown turn's (T6).
func TestACPClientCancelIsInterruption(t *testing.T) {
	t.Parallel()
	conv := model.ConversationRef{ID: "conv-1"}
	held := plan.TurnSend(conv, model.UserToken(1), true)
	held.Fault = faults.Fault{Kind: faults.Hold}
	plans := []plan.Plan{plan.Single("held", held), plan.Single("next", plan.TurnSend(conv, model.UserToken(2), true))}

	ops, v, err := scenarios.Replay(noTimeout{reference.Target{Protocol: targets.ACP}}, plans)
	require.NoError(t, err)
	require.Nil(t, v, "the clean agent: %v", v)
	require.Len(t, ops, 2)
	first := ops[0]
	assert.Equal(t, model.Unknown, first.Response.Outcome, first.Response.Detail)
	assert.True(t, first.Response.TimedOut, "the client's time ended the prompt: %s", first.Response.Detail)
	assert.True(t, first.Response.Cancelled, "the client cancelled the prompt")
	assert.Equal(t, protocol.CauseTimedOut, first.Response.Cause)
	assert.True(t, first.Turn.Interrupted, "a prompt the client cancelled is an interrupted turn")
	assert.Equal(t, model.OK, ops[1].Response.Outcome, ops[1].Response.Detail)

	_, v, err = scenarios.Replay(noTimeout{reference.Target{Protocol: targets.ACP, Mutant: sut.ACPCancelCommitsPrompt}}, plans)
	require.NoError(t, err)
	require.NotNil(t, v, "the cancelled prompt kept was not seen")
	assert.Equal(t, model.T10, v.Invariant, v.Reason)
	assert.Equal(t, model.LeftoverInterrupted, v.Kind, v.Reason)
}

// TestACPReportInItsOwnWords: a report of an ACP run speaks ACP: every
// JSON-RPC message the harness wrote for a turn (session/new, a
// session/load after a restart, the prompt, session/cancel), each valid
// JSON; a prompt, not a stream; a cancel, not a dropped connection; and no
// address for an agent on stdio.
func TestACPReportInItsOwnWords(t *testing.T) {
	t.Parallel()
	target := reference.Target{Protocol: targets.ACP, Mutant: sut.ACPCancelCommitsPrompt}
	res, err := scenarios.Check(target, scenarios.Options{Checks: 50, Seed: 2, ShrinkTime: 10 * time.Second})
	require.NoError(t, err)
	require.NotNil(t, res.Failure)
	r := res.Failure.Report
	methods := map[string]bool{}
	for _, line := range strings.Split(r, "\n") {
		_, msg, ok := strings.Cut(line, "-> agent: ")
		if !ok {
			continue
		}
		var rpc struct {
			JSONRPC string `json:"jsonrpc"`
			Method  string `json:"method"`
		}
		require.NoError(t, json.Unmarshal([]byte(msg), &rpc), "not JSON: %s", msg)
		assert.Equal(t, "2.0", rpc.JSONRPC, msg)
		methods[rpc.Method] = true
	}
	for _, m := range []string{"session/new", "session/prompt", "session/cancel"} {
		assert.True(t, methods[m], "%s not shown:\n%s", m, r)
	}
	for _, word := range []string{"streamed", "dropped the connection", "curl", "http://"} {
		assert.NotContains(t, r, word, r)
	}
	assert.Contains(t, r, "the client cancelled the prompt (session/cancel)", r)
}
