package sut_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// The tool loop (toolloop.go, tools.go).

// TestToolLoopCommitsEveryRound: a turn of two tool rounds, several calls
// each, calls the model three times, each time with the rounds so far; it
// commits the user message, both rounds and the reply, and the next turn's
// model request carries them in order, every call paired with its result.
// A streaming client hears the final reply alone.
func TestToolLoopCommitsEveryRound(t *testing.T) {
	for i, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			e := newToolEnv(t, sut.Config{})
			u1, u2 := fmt.Sprintf("tc-u%d", 10*i+1), fmt.Sprintf("tc-u%d", 10*i+2)
			e.model.script(u1,
				ask(echo("c1", "hi"), lookup("c2", "k1")),
				ask(lookup("c3", "missing-1"), call("c4", "nope", `{}`), call("c5", sut.ToolEcho, `{"text":5}`),
					call("c6", sut.ToolLookup, `{"key":"k2","more":1}`), echo("c7", "bye")),
			)
			reqs := e.ok(t, "conv", u1, stream)
			require.Len(t, reqs, 3, "two rounds of tools, then the reply")
			round1 := lines("user "+u1, "calls c1,c2", "tool c1: hi", "tool c2: value-of-k1")
			round2 := lines("calls c3,c4,c5,c6,c7", "tool c3: error", "tool c4: error", "tool c5: error", "tool c6: error", "tool c7: bye")
			assert.Equal(t, lines("user "+u1), shape(reqs[0].messages))
			assert.Equal(t, round1, shape(reqs[1].messages))
			assert.Equal(t, lines(round1, round2), shape(reqs[2].messages))
			for _, r := range reqs {
				assert.Equal(t, []string{sut.ToolEcho, sut.ToolLookup}, r.tools, "every model call offers the tools")
			}
			assert.Equal(t, []string{"k1", "missing-1"}, e.model.lookupKeys(), "only well-formed lookups run, in order")
			for _, m := range reqs[2].messages {
				if m.Role == openai.RoleTool && strings.HasPrefix(string(m.Content), "error: ") {
					assert.NotContains(t, string(m.Content), e.model.srv.URL, "a tool error names no address")
				}
			}
			// The calls went to the model as it asked for them.
			assert.Equal(t, []openai.ToolCall{echo("c1", "hi"), lookup("c2", "k1")}, reqs[1].messages[2].ToolCalls)

			next := e.history(t, "conv", u2)
			assert.Equal(t, lines(round1, round2, "assistant "+strings.Replace(u1, "tc-u", "tc-a", 1), "user "+u2), shape(next))
			assert.Empty(t, unpaired(next))
		})
	}
}

// TestToolLoopFailureRollsBack: a model failure in the second round fails
// the turn (502, or an error chunk once the stream began) and commits
// nothing of it, its first round included.
func TestToolLoopFailureRollsBack(t *testing.T) {
	e := newToolEnv(t, sut.Config{})
	committed := shape(e.history(t, "conv", "tc-u1"))
	for i, stream := range []bool{false, true} {
		tok := fmt.Sprintf("tc-u%d", 2+i)
		e.model.script(tok, ask(echo("c1", "a"), lookup("c2", "k")), toolStep{fail: true})
		r := e.send(t, "conv", tok, stream).wait(t)
		if stream {
			s := parseStream(t, r)
			assert.Equal(t, 1, s.errors(), "the stream began with the first round: the failure is an error chunk")
			assert.False(t, s.stopped())
			assert.Empty(t, s.text())
		} else {
			requireErrorBody(t, r, http.StatusBadGateway, "upstream_error")
		}
		require.Len(t, e.model.requestsOf(tok), 2)
	}
	assert.Equal(t, lines(committed, "assistant tc-a1", "user tc-u4"), shape(e.history(t, "conv", "tc-u4")))
}

// TestNinthToolRequestFailsTheTurn: a turn runs at most MaxToolRounds
// rounds; a model that asks for tools once more fails it (502) and it
// commits nothing.
func TestNinthToolRequestFailsTheTurn(t *testing.T) {
	e := newToolEnv(t, sut.Config{})
	var steps []toolStep
	for round := range sut.MaxToolRounds + 1 {
		steps = append(steps, ask(echo(fmt.Sprintf("c%d", round), "again")))
	}
	e.model.script("tc-u1", steps...)
	requireErrorBody(t, e.send(t, "conv", "tc-u1", false).wait(t), http.StatusBadGateway, "upstream_error")
	assert.Len(t, e.model.requestsOf("tc-u1"), sut.MaxToolRounds+1)

	// Eight rounds are fine.
	e.model.script("tc-u2", steps[:sut.MaxToolRounds]...)
	assert.Len(t, e.ok(t, "conv", "tc-u2", true), sut.MaxToolRounds+1)
	next := e.history(t, "conv", "tc-u3")
	assert.Equal(t, "user tc-u2", shape(next)[0], "the failed turn left nothing")
	assert.Len(t, next, 1+1+2*sut.MaxToolRounds+2, "system, the user message, 8 rounds, the reply, the next user message")
}

// TestUnanswerableToolCallsFailTheTurn: tool calls without an id, or
// with one id twice, cannot be paired with results (T9); a call without a
// name runs nothing; more calls than the server runs at once is a model
// gone wrong. Each fails the turn (502) before any tool runs.
func TestUnanswerableToolCallsFailTheTurn(t *testing.T) {
	e := newToolEnv(t, sut.Config{})
	var many []openai.ToolCall
	for i := range 33 {
		many = append(many, lookup(fmt.Sprintf("c%d", i), "k"))
	}
	for i, calls := range [][]openai.ToolCall{
		{lookup("", "k")},
		{lookup("c1", "k"), lookup("c1", "k")},
		{call("c1", "", `{"key":"k"}`)},
		many,
	} {
		tok := fmt.Sprintf("tc-u%d", i+1)
		e.model.script(tok, ask(calls...))
		requireErrorBody(t, e.send(t, "conv", tok, false).wait(t), http.StatusBadGateway, "upstream_error")
	}
	assert.Empty(t, e.model.lookupKeys(), "no tool ran")
	assert.Equal(t, lines("user tc-u9"), shape(e.history(t, "conv", "tc-u9")))
}

// TestLookupTimeoutIsAToolResult: a lookup that does not answer within
// its deadline is a failed tool, reported to the model, and the turn goes
// on.
func TestLookupTimeoutIsAToolResult(t *testing.T) {
	deadlines := &sut.ManualDeadlines{}
	e := newToolEnv(t, sut.Config{Deadlines: deadlines})
	e.model.script("tc-u1", ask(lookup("c1", "slow"), lookup("c2", "k")))
	h := e.model.holdLookup("slow")
	f := e.send(t, "conv", "tc-u1", false)
	await(t, h.arrived, "the slow lookup")
	assert.Equal(t, 1, deadlines.Expire(), "the lookup's deadline, and no model call's, is pending")
	await(t, h.gone, "the server to give up the slow lookup")
	r := f.wait(t)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	reqs := e.model.requestsOf("tc-u1")
	require.Len(t, reqs, 2)
	assert.Equal(t, lines("user tc-u1", "calls c1,c2", "tool c1: error", "tool c2: value-of-k"), shape(reqs[1].messages))
	assert.Contains(t, string(reqs[1].messages[3].Content), "timed out")
}

// TestStatelessTurnRunsTools: a turn without a conversation runs its tool
// loop too, and keeps nothing.
func TestStatelessTurnRunsTools(t *testing.T) {
	e := newToolEnv(t, sut.Config{})
	e.model.script("tc-u1", ask(echo("c1", "hi")))
	r := post(t, e.client, e.srv.URL(), chatBody(t, false, user("tc-u1")), nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	reqs := e.model.requestsOf("tc-u1")
	require.Len(t, reqs, 2)
	assert.Equal(t, lines("user tc-u1", "calls c1", "tool c1: hi"), shape(reqs[1].messages))
}
