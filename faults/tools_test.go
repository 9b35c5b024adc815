package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/model"
)

// ---------------------------------------------------------------------------
// Helpers

// toolBody is a chat request that offers the named tools.
func toolBody(t *testing.T, stream bool, tools []string, msgs ...openai.Message) []byte {
	t.Helper()
	req := openai.ChatRequest{Model: "fake", Messages: msgs, Stream: stream,
		StreamOptions: &openai.StreamOptions{IncludeUsage: stream}}
	for _, name := range tools {
		req.Tools = append(req.Tools, openai.Tool{Type: openai.TypeFunction, Function: openai.Function{Name: name}})
	}
	b, err := json.Marshal(req)
	require.NoError(t, err)
	return b
}

var bothTools = []string{faults.ToolEcho, faults.ToolLookup}

// asked is the assistant message that asks for the given tool calls.
func asked(calls ...openai.ToolCall) openai.Message {
	return openai.Message{Role: openai.RoleAssistant, ToolCalls: calls}
}

// result is the tool message that answers the tool call id.
func toolResult(id string) openai.Message {
	return openai.Message{Role: openai.RoleTool, ToolCallID: id, Content: openai.Content("result of " + id)}
}

// answer is what the model answered a request with: the tool calls it
// asked for, its text, and its finish reason.
type answer struct {
	calls  []openai.ToolCall
	text   string
	finish string
}

// ask sends a request and reads the model's answer, whole or streamed; a
// stream must have the shape the model promises: a role chunk, three
// chunks per tool call (id and name, then each half of the arguments) or
// the content chunks, the finish, the usage, [DONE].
func (f *fixture) ask(stream bool, tools []string, msgs ...openai.Message) answer {
	t := f.t
	t.Helper()
	resp, got := f.send(http.MethodPost, "/v1/chat/completions", toolBody(t, stream, tools, msgs...))
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", got)
	if !stream {
		var c openai.Completion
		require.NoError(t, json.Unmarshal(got, &c), "%s", got)
		require.Len(t, c.Choices, 1)
		require.NotNil(t, c.Choices[0].Message)
		return answer{calls: c.Choices[0].Message.ToolCalls, text: unmark(c.Text()), finish: c.Finish()}
	}
	payloads, err := events(strings.NewReader(string(got)))
	require.ErrorIs(t, err, io.EOF)
	require.GreaterOrEqual(t, len(payloads), 4, "%q", payloads)
	require.Equal(t, openai.DoneSentinel, payloads[len(payloads)-1])
	cs := decode(payloads[:len(payloads)-1])
	for i, c := range cs {
		require.NotNil(t, c, "chunk %d: %s", i, payloads[i])
	}
	usage := cs[len(cs)-1]
	require.NotNil(t, usage.Usage, "the usage chunk comes last")
	finish := cs[len(cs)-2]
	require.Len(t, finish.Choices, 1)
	require.Equal(t, openai.RoleAssistant, cs[0].Choices[0].Delta.Role, "a role chunk comes first")
	var a answer
	a.finish = finish.Finish()
	deltas := cs[1 : len(cs)-2]
	assert.Equal(t, len(deltas), usage.Usage.CompletionTokens)
	for i, c := range deltas {
		require.Len(t, c.Choices, 1)
		d := c.Choices[0].Delta
		require.NotNil(t, d)
		assert.Empty(t, c.Finish(), "only the finish chunk finishes")
		a.text += d.Content
		if len(d.ToolCalls) == 0 {
			continue
		}
		require.Len(t, d.ToolCalls, 1, "one piece of one call per chunk")
		tc := d.ToolCalls[0]
		n := i / 3
		require.Equal(t, n, tc.Index, "the pieces of call %d come together, in order", n)
		switch i % 3 {
		case 0:
			require.NotEmpty(t, tc.ID, "the first piece names the call")
			require.Empty(t, tc.Function.Arguments)
			a.calls = append(a.calls, openai.ToolCall{ID: tc.ID, Type: tc.Type, Function: openai.FunctionCall{Name: tc.Function.Name}})
		default:
			require.Empty(t, tc.ID, "later pieces carry arguments only")
			require.NotEmpty(t, tc.Function.Arguments)
			a.calls[n].Function.Arguments += tc.Function.Arguments
		}
	}
	if len(a.calls) > 0 {
		assert.Len(t, deltas, 3*len(a.calls))
	}
	a.text = unmark(a.text)
	return a
}

// toolCall is the tool call the model gives as the i-th of round r of tok.
func toolCall(tok model.Token, r, i int, name, args string) openai.ToolCall {
	return openai.ToolCall{ID: model.ToolCallID(tok, r, i), Type: openai.TypeFunction,
		Function: openai.FunctionCall{Name: name, Arguments: args}}
}

// askedAgain is c as the asking-th asking of its round names it.
func askedAgain(c openai.ToolCall, asking int) openai.ToolCall {
	r, ok := model.ParseToolCallID(c.ID)
	if !ok {
		panic("not a tool call id of the model's: " + c.ID)
	}
	r.Asking = asking
	c.ID = r.ID()
	return c
}

// lookup runs the lookup tool with key in a goroutine and reports how it
// ended on the returned channel.
func (f *fixture) lookup(ctx context.Context, key string) <-chan result {
	return f.goSend(ctx, http.MethodGet, "/tools/lookup?key="+url.QueryEscape(key), nil)
}

// stream sends a streamed request and passes on each payload as it
// arrives; the channel is closed when the stream ends, with the error that
// ended it in *end.
func (f *fixture) stream(ctx context.Context, b []byte, end *error) <-chan string {
	out := make(chan string, 64)
	go func() {
		defer close(out)
		resp, err := f.do(ctx, http.MethodPost, "/v1/chat/completions", b)
		if err != nil {
			*end = err
			return
		}
		defer resp.Body.Close()
		r := sse.NewReader(resp.Body)
		for {
			p, err := r.Next()
			if err != nil {
				*end = err
				return
			}
			out <- p
		}
	}()
	return out
}

// next takes n payloads from a stream, which must come.
func next(t *testing.T, ch <-chan string, n int) []string {
	t.Helper()
	var out []string
	for range n {
		select {
		case p, ok := <-ch:
			require.True(t, ok, "the stream ended after %q", out)
			out = append(out, p)
		case <-time.After(guard):
			require.FailNow(t, "timed out waiting for a chunk", "after %q", out)
		}
	}
	return out
}

// quiet asserts that nothing comes on a stream for a while: a held call
// stays held. A short wait cannot prove it, but a call that is not held
// sends its next chunk at once.
func quiet(t *testing.T, ch <-chan string) {
	t.Helper()
	select {
	case p, ok := <-ch:
		assert.Fail(t, "the held call went on", "got %q (open: %t)", p, ok)
	case <-time.After(50 * time.Millisecond):
	}
}

// rest takes the payloads of a stream to its end.
func rest(t *testing.T, ch <-chan string) []string {
	t.Helper()
	var out []string
	for {
		select {
		case p, ok := <-ch:
			if !ok {
				return out
			}
			out = append(out, p)
		case <-time.After(guard):
			require.FailNow(t, "timed out waiting for the stream to end")
		}
	}
}

// ---------------------------------------------------------------------------
// Tool rounds

// TestToolRoundsInOrder: the model asks for each round's tools until the
// request carries a result for every call of it, then replies; streamed
// and whole alike.
func TestToolRoundsInOrder(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			f := start(t, faults.ModelConfig{})
			f.m.ScriptReply("tc-u1", faults.Reply{Rounds: []faults.Round{{faults.ToolEcho, faults.ToolLookup}, {faults.ToolLookup}}})
			msgs := []openai.Message{msg(openai.RoleSystem, "be brief"), user("hi tc-u1")}

			round1 := []openai.ToolCall{
				toolCall("tc-u1", 1, 1, faults.ToolEcho, `{"text":"tc-k1-1-1"}`),
				toolCall("tc-u1", 1, 2, faults.ToolLookup, `{"key":"tc-k1-1-2"}`),
			}
			a := f.ask(stream, bothTools, msgs...)
			assert.Equal(t, answer{calls: round1, finish: openai.FinishToolCalls}, a)

			// One result of two: round 1 is not done, the model asks again,
			// under ids of that second asking.
			msgs = append(msgs, asked(round1...), toolResult(round1[0].ID))
			a = f.ask(stream, bothTools, msgs...)
			again := []openai.ToolCall{
				askedAgain(toolCall("tc-u1", 1, 1, faults.ToolEcho, `{"text":"tc-k1-1-1x2"}`), 2),
				askedAgain(toolCall("tc-u1", 1, 2, faults.ToolLookup, `{"key":"tc-k1-1-2x2"}`), 2),
			}
			assert.Equal(t, answer{calls: again, finish: openai.FinishToolCalls}, a)

			// The first asking's calls all answered complete the round.
			msgs = append(msgs, toolResult(round1[1].ID))
			round2 := []openai.ToolCall{toolCall("tc-u1", 2, 1, faults.ToolLookup, `{"key":"tc-k1-2-1"}`)}
			a = f.ask(stream, bothTools, msgs...)
			assert.Equal(t, answer{calls: round2, finish: openai.FinishToolCalls}, a)

			msgs = append(msgs, asked(round2...), toolResult(round2[0].ID))
			a = f.ask(stream, bothTools, msgs...)
			assert.Equal(t, answer{text: reply("tc-u1"), finish: openai.FinishStop}, a)

			calls := f.m.CallsAfter(0)
			require.Len(t, calls, 4)
			for _, c := range calls {
				assert.Equal(t, model.Token("tc-u1"), c.Turn, "a tool loop's calls are its turn's")
				assert.Equal(t, []model.Token{"tc-u1"}, c.History, "tool traffic carries no tokens")
			}
		})
	}
}

// TestRetriedToolTurnAskedUnderIDsOfItsOwn: a turn retried under its user
// token, as a client retries a failed turn, is asked for its rounds again
// under ids of their own, so that no request holds an id twice (T9) when
// a server shows it an earlier attempt's calls beside the retry's; a
// round is complete once every call of any one asking of it has its
// result, and the loop goes on to the next round and the reply. Reset
// starts the count again, as a check's tokens do.
func TestRetriedToolTurnAskedUnderIDsOfItsOwn(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	rounds := faults.Reply{Rounds: []faults.Round{{faults.ToolEcho, faults.ToolLookup}, {faults.ToolEcho}}}
	turn := []openai.Message{user("tc-u27"), msg(openai.RoleAssistant, "tc-a27"), user("tc-u28")}
	with := func(msgs ...openai.Message) []openai.Message { return append(slices.Clone(turn), msgs...) }
	results := func(calls []openai.ToolCall) []openai.Message {
		out := []openai.Message{asked(calls...)}
		for _, c := range calls {
			out = append(out, toolResult(c.ID))
		}
		return out
	}

	// The first attempt asks for round 1, then round 2, where it fails.
	f.m.ScriptReply("tc-u28", rounds)
	round1 := []openai.ToolCall{
		toolCall("tc-u28", 1, 1, faults.ToolEcho, `{"text":"tc-k28-1-1"}`),
		toolCall("tc-u28", 1, 2, faults.ToolLookup, `{"key":"tc-k28-1-2"}`),
	}
	require.Equal(t, round1, f.ask(false, bothTools, turn...).calls)
	attempt1 := results(round1)
	require.Equal(t, []openai.ToolCall{toolCall("tc-u28", 2, 1, faults.ToolEcho, `{"text":"tc-k28-2-1"}`)},
		f.ask(false, bothTools, with(attempt1...)...).calls)

	// The retry, scripted anew as the harness scripts it, on a history
	// without the failed attempt: each round is asked for a second time,
	// under other ids, which name the same turn and round.
	f.m.ScriptReply("tc-u28", rounds)
	held := f.m.HoldAt("tc-u28", faults.Point{Round: 1, Tool: 2})
	again := f.ask(true, bothTools, turn...).calls
	assert.Equal(t, []openai.ToolCall{
		askedAgain(toolCall("tc-u28", 1, 1, faults.ToolEcho, `{"text":"tc-k28-1-1x2"}`), 2),
		askedAgain(toolCall("tc-u28", 1, 2, faults.ToolLookup, `{"key":"tc-k28-1-2x2"}`), 2),
	}, again)
	for i, c := range again {
		assert.NotEqual(t, round1[i].ID, c.ID, "a retry's call has an id of its own")
		user, round, ok := model.ToolTurn(c.ID)
		require.True(t, ok, "ToolTurn(%q)", c.ID)
		assert.Equal(t, model.Token("tc-u28"), user)
		assert.Equal(t, 1, round)
	}
	// Its lookup is the run of its own id, and a gate at the round's
	// second call holds it, whichever asking runs.
	lookup := f.lookup(context.Background(), "tc-k28-1-2x2")
	waitClosed(t, held.Arrived(), "the retry's lookup to be held")
	held.Release()
	assert.Equal(t, "value of tc-k28-1-2x2", string(waitResult(t, lookup).body))
	assert.Equal(t, []string{"tc-k28-1-2x2"}, runIDs(f.m.RunsAfter(0)))

	attempt2 := results(again)
	round2 := f.ask(true, bothTools, with(attempt2...)...).calls
	assert.Equal(t, []openai.ToolCall{askedAgain(toolCall("tc-u28", 2, 1, faults.ToolEcho, `{"text":"tc-k28-2-1x2"}`), 2)}, round2)
	assert.Equal(t, answer{text: reply("tc-u28"), finish: openai.FinishStop},
		f.ask(true, bothTools, with(append(attempt2, results(round2)...)...)...))

	// A server that kept the first attempt's completed round 1 and shows
	// it before the retry's message: that asking completes round 1, and
	// round 2 is asked for a third time.
	kept := with(append(attempt1, user("tc-u28"))...)
	f.m.ScriptReply("tc-u28", rounds)
	round2 = f.ask(false, bothTools, kept...).calls
	assert.Equal(t, []openai.ToolCall{askedAgain(toolCall("tc-u28", 2, 1, faults.ToolEcho, `{"text":"tc-k28-2-1x3"}`), 3)}, round2)
	assert.Equal(t, answer{text: reply("tc-u28"), finish: openai.FinishStop},
		f.ask(false, bothTools, append(kept, results(round2)...)...))

	// A retry drawn with a bigger round 1 than the kept attempt answered:
	// round 1 is asked for again, beside the kept calls, and its results
	// complete it.
	f.m.ScriptReply("tc-u28", faults.Reply{Rounds: []faults.Round{{faults.ToolEcho, faults.ToolEcho, faults.ToolEcho}}})
	bigger := f.ask(false, bothTools, kept...).calls
	require.Len(t, bigger, 3)
	assert.Equal(t, "tc-k28-1-1x3", bigger[0].ID)
	assert.Equal(t, answer{text: reply("tc-u28"), finish: openai.FinishStop},
		f.ask(false, bothTools, append(kept, results(bigger)...)...))

	// No request the model saw asks for a tool call twice.
	for _, c := range f.m.CallsAfter(0) {
		seen := map[string]bool{}
		for _, e := range c.Tools {
			if e.Kind == model.ToolCalled {
				assert.False(t, seen[e.ID], "a request asks for %s twice: %v", e.ID, c.Tools)
				seen[e.ID] = true
			}
		}
	}

	// A new check counts afresh: its first asking has the first ids.
	f.m.Reset("")
	f.m.ScriptReply("tc-u28", rounds)
	assert.Equal(t, round1, f.ask(false, bothTools, turn...).calls)
}

// runIDs are the ids of runs, in order.
func runIDs(runs []model.ToolRun) []string {
	var ids []string
	for _, r := range runs {
		ids = append(ids, r.ID)
	}
	return ids
}

// TestToolRoundsNeedOfferedTools: a request that does not offer a round's
// tools gets the reply at once, so that a server without tools is checked
// without tool rounds.
func TestToolRoundsNeedOfferedTools(t *testing.T) {
	for name, tools := range map[string][]string{
		"none":                 nil,
		"others":               {"search"},
		"some of the round's":  {faults.ToolEcho},
		"of the same name too": {"Echo", "lookup2"},
	} {
		for _, stream := range []bool{false, true} {
			f := start(t, faults.ModelConfig{})
			f.m.ScriptReply("tc-u1", faults.Reply{Rounds: []faults.Round{{faults.ToolEcho, faults.ToolLookup}}})
			a := f.ask(stream, tools, user("tc-u1"))
			assert.Equal(t, answer{text: reply("tc-u1"), finish: openai.FinishStop}, a, "%s stream=%t", name, stream)
		}
	}
	// Offering more than the round's tools is fine.
	f := start(t, faults.ModelConfig{})
	f.m.ScriptReply("tc-u1", faults.Reply{Rounds: []faults.Round{{faults.ToolEcho}}})
	a := f.ask(false, []string{"search", faults.ToolEcho}, user("tc-u1"))
	assert.Equal(t, []openai.ToolCall{toolCall("tc-u1", 1, 1, faults.ToolEcho, `{"text":"tc-k1-1-1"}`)}, a.calls)
}

// TestToolEventsOfACall: a call records its tool traffic in message order,
// with each user message as a boundary; a tool loop's later calls keep
// their turn; a call without tool traffic records none.
func TestToolEventsOfACall(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	a := toolCall("tc-u7", 1, 1, faults.ToolEcho, `{}`)
	b := toolCall("tc-u7", 1, 2, faults.ToolEcho, `{}`)
	c := toolCall("tc-u7", 2, 1, faults.ToolLookup, `{}`)
	f.post(false,
		msg(openai.RoleSystem, "sys"), user("tc-u7"),
		asked(a, b), toolResult(a.ID), toolResult(b.ID),
		asked(c), toolResult(c.ID))
	f.post(false,
		user("tc-u1"), openai.Message{Role: openai.RoleAssistant, Content: "tc-a1", ToolCalls: []openai.ToolCall{a}},
		user("tc-u2"), toolResult("orphan"))
	f.post(false, user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), user("tc-u3"))

	calls := f.m.CallsAfter(0)
	require.Len(t, calls, 3)
	assert.Equal(t, model.Token("tc-u7"), calls[0].Turn)
	assert.Equal(t, []model.ToolEvent{
		{Kind: model.UserMessage},
		{Kind: model.ToolCalled, ID: a.ID}, {Kind: model.ToolCalled, ID: b.ID},
		{Kind: model.ToolAnswered, ID: a.ID}, {Kind: model.ToolAnswered, ID: b.ID},
		{Kind: model.ToolCalled, ID: c.ID}, {Kind: model.ToolAnswered, ID: c.ID},
	}, calls[0].Tools)
	assert.Equal(t, model.Token("tc-u2"), calls[1].Turn)
	assert.Equal(t, []model.ToolEvent{
		{Kind: model.UserMessage}, {Kind: model.ToolCalled, ID: a.ID},
		{Kind: model.UserMessage}, {Kind: model.ToolAnswered, ID: "orphan"},
	}, calls[1].Tools)
	assert.Nil(t, calls[2].Tools, "a plain history records no tool events")
}

// TestFaultAtRound: a fault at round k hits only the calls that carry k
// rounds' results, and Times counts those calls only.
func TestFaultAtRound(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	echo := toolCall("tc-u1", 1, 1, faults.ToolEcho, `{"text":"tc-k1-1-1"}`)
	first := []openai.Message{user("tc-u1")}
	second := []openai.Message{user("tc-u1"), asked(echo), toolResult(echo.ID)}
	status := func(msgs []openai.Message) int {
		resp, _ := f.send(http.MethodPost, "/v1/chat/completions", toolBody(t, false, bothTools, msgs...))
		return resp.StatusCode
	}

	f.m.ScriptReply("tc-u1", faults.Reply{Rounds: []faults.Round{{faults.ToolEcho}},
		Fault: faults.Fault{Kind: faults.Status, Status: 503, Round: 1}})
	assert.Equal(t, []openai.ToolCall{echo}, f.ask(false, bothTools, first...).calls, "the first call is answered")
	assert.Equal(t, 503, status(second), "the call after the round fails")
	assert.Equal(t, 503, status(second), "every time, without Times")
	assert.Equal(t, 200, status(first), "a retry of the first call is still answered")

	f.m.ScriptReply("tc-u1", faults.Reply{Rounds: []faults.Round{{faults.ToolEcho}},
		Fault: faults.Fault{Kind: faults.Status, Status: 502, Round: 1, Times: 2}})
	got := []int{status(first), status(second), status(first), status(second), status(second), status(first)}
	assert.Equal(t, []int{200, 502, 200, 502, 200, 200}, got, "Times counts the calls at the fault's round")
	assert.Equal(t, reply("tc-u1"), f.ask(false, bothTools, second...).text)

	// A stream fault at round 0 cuts the tool calls' chunks.
	f.m.ScriptReply("tc-u1", faults.Reply{Rounds: []faults.Round{{faults.ToolEcho}},
		Fault: faults.Fault{Kind: faults.Cut, After: 2}})
	resp, err := f.do(context.Background(), http.MethodPost, "/v1/chat/completions", toolBody(t, true, bothTools, first...))
	require.NoError(t, err)
	payloads, err := events(resp.Body)
	resp.Body.Close()
	assert.NotErrorIs(t, err, io.EOF, "the stream is cut")
	assert.Len(t, payloads, 3, "the role chunk and 2 tool-call chunks: %q", payloads)

	// A Hold at round 1 holds that call until the server gives up.
	arrived := f.m.ScriptReply("tc-u2", faults.Reply{Rounds: []faults.Round{{faults.ToolEcho}},
		Fault: faults.Fault{Kind: faults.Hold, Round: 1}})
	echo2 := toolCall("tc-u2", 1, 1, faults.ToolEcho, `{"text":"tc-k2-1-1"}`)
	assert.Equal(t, []openai.ToolCall{echo2}, f.ask(false, bothTools, user("tc-u2")).calls)
	waitClosed(t, arrived, "the first call")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := f.goDo(ctx, toolBody(t, false, bothTools, user("tc-u2"), asked(echo2), toolResult(echo2.ID)))
	r := waitResult(t, done)
	assert.ErrorIs(t, r.err, context.DeadlineExceeded, "the call after the round is held: %+v", r)
}

// ---------------------------------------------------------------------------
// Holds at points

// TestHoldAtChunks: a call held after k chunks has sent exactly k delta
// chunks, and sends the rest once released.
func TestHoldAtChunks(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	g := f.m.HoldAt("tc-u1", faults.Point{Chunks: 2})
	var end error
	ch := f.stream(context.Background(), body(t, true, user("tc-u1")), &end)
	waitClosed(t, g.Arrived(), "the hold")
	assert.Equal(t, 1, f.m.Holding())
	cs := decode(next(t, ch, 3))
	assert.Equal(t, openai.RoleAssistant, cs[0].Choices[0].Delta.Role)
	assert.Equal(t, faults.ReplyChunks("tc-u1")[:2], contentChunks(cs))
	quiet(t, ch)

	g.Release()
	assert.Zero(t, f.m.Holding(), "a released call is no longer held")
	more := rest(t, ch)
	assert.ErrorIs(t, end, io.EOF)
	require.NotEmpty(t, more)
	assert.Equal(t, openai.DoneSentinel, more[len(more)-1])
	cs = decode(more[:len(more)-1])
	assert.Equal(t, faults.ReplyChunks("tc-u1")[2:], contentChunks(cs))
	assert.True(t, hasFinishStop(cs))

	// Only the first arrival is held: a retry streams at once.
	resp, got := f.post(true, user("tc-u1"))
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(got), openai.DoneSentinel)
}

// TestHoldAtChunksBeyondTheAnswer: a count beyond the answer holds it
// before its finish; a call answered whole is held before it is answered.
func TestHoldAtChunksBeyondTheAnswer(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	n := len(faults.ReplyChunks("tc-u1"))
	g := f.m.HoldAt("tc-u1", faults.Point{Chunks: 99})
	var end error
	ch := f.stream(context.Background(), body(t, true, user("tc-u1")), &end)
	waitClosed(t, g.Arrived(), "the hold")
	cs := decode(next(t, ch, 1+n))
	assert.Equal(t, faults.ReplyChunks("tc-u1"), contentChunks(cs))
	assert.False(t, hasFinishStop(cs))
	quiet(t, ch)
	g.Release()
	assert.True(t, hasFinishStop(decode(rest(t, ch))))
	assert.ErrorIs(t, end, io.EOF)

	g = f.m.HoldAt("tc-u2", faults.Point{Chunks: 2})
	done := f.goDo(context.Background(), body(t, false, user("tc-u2")))
	waitClosed(t, g.Arrived(), "the hold of a call answered whole")
	requireHeld(t, done, "a held call")
	g.Release()
	r := waitResult(t, done)
	assert.Equal(t, http.StatusOK, r.status)
	assert.Contains(t, string(r.body), "tc-a2")
}

// TestHoldAtAToolRound: a point at round k holds the call that carries k
// rounds' results, not the ones before it; its chunks count the tool
// calls' pieces.
func TestHoldAtAToolRound(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.ScriptReply("tc-u1", faults.Reply{Rounds: []faults.Round{{faults.ToolEcho}, {faults.ToolEcho, faults.ToolEcho}}})
	g := f.m.HoldAt("tc-u1", faults.Point{Round: 1, Chunks: 4})
	echo := toolCall("tc-u1", 1, 1, faults.ToolEcho, `{"text":"tc-k1-1-1"}`)
	assert.Equal(t, []openai.ToolCall{echo}, f.ask(true, bothTools, user("tc-u1")).calls, "round 0 is not held")

	var end error
	ch := f.stream(context.Background(), toolBody(t, true, bothTools, user("tc-u1"), asked(echo), toolResult(echo.ID)), &end)
	waitClosed(t, g.Arrived(), "the hold")
	cs := decode(next(t, ch, 5))
	require.NotNil(t, cs[4].Choices[0].Delta)
	require.Len(t, cs[4].Choices[0].Delta.ToolCalls, 1)
	assert.Equal(t, 1, cs[4].Choices[0].Delta.ToolCalls[0].Index, "4 chunks: the first call whole and the second's name")
	assert.Equal(t, model.ToolCallID("tc-u1", 2, 2), cs[4].Choices[0].Delta.ToolCalls[0].ID)
	quiet(t, ch)
	g.Release()
	more := rest(t, ch)
	assert.ErrorIs(t, end, io.EOF)
	assert.Equal(t, openai.DoneSentinel, more[len(more)-1])
}

// TestHeldCallEndsWhenCancelled: a call held mid-stream whose server gives
// up ends unanswered, and is no longer held.
func TestHeldCallEndsWhenCancelled(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	g := f.m.HoldAt("tc-u1", faults.Point{Chunks: 2})
	baseline := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var end error
	ch := f.stream(ctx, body(t, true, user("tc-u1")), &end)
	waitClosed(t, g.Arrived(), "the hold")
	next(t, ch, 3)
	cancel()
	more := rest(t, ch)
	assert.Empty(t, more)
	assert.ErrorIs(t, end, context.Canceled)
	assert.Eventually(t, func() bool { return f.m.Holding() == 0 }, guard, time.Millisecond,
		"a call whose server gave up is no longer held")
	f.tr.CloseIdleConnections()
	assert.NoError(t, goleak.Find(baseline), "the held call's goroutines end after the client cancels")
}

// TestSeveralGatesOnATurn: a turn held before it starts and again
// mid-stream stops at each in turn.
func TestSeveralGatesOnATurn(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	first := f.m.Gate("tc-u1")
	later := f.m.HoldAt("tc-u1", faults.Point{Chunks: 1})
	var end error
	ch := f.stream(context.Background(), body(t, true, user("tc-u1")), &end)
	waitClosed(t, first.Arrived(), "the first hold")
	assert.Equal(t, 1, f.m.Holding())
	quiet(t, ch)
	select {
	case <-later.Arrived():
		require.FailNow(t, "the later gate arrived while the first held")
	default:
	}
	first.Release()
	waitClosed(t, later.Arrived(), "the later hold")
	assert.Equal(t, 1, f.m.Holding())
	assert.Equal(t, faults.ReplyChunks("tc-u1")[:1], contentChunks(decode(next(t, ch, 2))))
	quiet(t, ch)
	later.Release()
	assert.True(t, hasFinishStop(decode(rest(t, ch))))
	assert.Zero(t, f.m.Holding())

	// A call answered whole is held at each of its round's gates before it
	// is answered, in the order of their chunks.
	first = f.m.HoldAt("tc-u3", faults.Point{})
	later = f.m.HoldAt("tc-u3", faults.Point{Chunks: 2})
	done := f.goDo(context.Background(), body(t, false, user("tc-u3")))
	waitClosed(t, first.Arrived(), "the first hold of a call answered whole")
	select {
	case <-later.Arrived():
		require.FailNow(t, "the later gate arrived while the first held")
	case <-time.After(50 * time.Millisecond):
	}
	first.Release()
	waitClosed(t, later.Arrived(), "the later hold of a call answered whole")
	requireHeld(t, done, "a held call")
	later.Release()
	assert.Equal(t, http.StatusOK, waitResult(t, done).status)

	// A new script drops the gates of the old one.
	g := f.m.HoldAt("tc-u2", faults.Point{})
	f.m.Script("tc-u2", faults.Fault{})
	resp, _ := f.post(false, user("tc-u2"))
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	select {
	case <-g.Arrived():
		assert.Fail(t, "a gate of a replaced script held a call")
	default:
	}
}

// ---------------------------------------------------------------------------
// Lookups

// TestLookupAnswersAndRecords: a lookup answers "value of K" and records
// the run of the tool call K names, on the calls' timeline.
func TestLookupAnswersAndRecords(t *testing.T) {
	var now int64 = 100
	f := start(t, faults.ModelConfig{Clock: func() int64 { now++; return now }})
	f.post(false, user("tc-u1"))
	for _, path := range []string{"/tools/lookup", "/v1/tools/lookup"} {
		resp, got := f.send(http.MethodGet, path+"?key=tc-k1-1-2", nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, got)
		assert.Contains(t, resp.Header.Get("Content-Type"), "text/plain")
		assert.Equal(t, "value of tc-k1-1-2", string(got))
	}
	f.post(false, user("tc-u2"))
	r := waitResult(t, f.lookup(context.Background(), "tc-k2-3-1 with more"))
	assert.Equal(t, "value of tc-k2-3-1 with more", string(r.body), "without an epoch, any tail is the key's")

	assert.Equal(t, []model.ToolRun{{ID: "tc-k1-1-2", At: 102}, {ID: "tc-k1-1-2", At: 103}, {ID: "tc-k2-3-1", At: 105}},
		f.m.RunsAfter(0))
	assert.Equal(t, []model.ToolRun{{ID: "tc-k2-3-1", At: 105}}, f.m.RunsAfter(103))
	assert.Empty(t, f.m.RunsAfter(105))
	assert.Len(t, f.m.CallsAfter(0), 2, "a lookup is not a model call")
	assert.Equal(t, 3, f.m.RunCount())
	assert.Equal(t, 2, f.m.CallCount())
	got := f.m.RunsAfter(0)
	got[0].ID = "changed"
	assert.Equal(t, "tc-k1-1-2", f.m.RunsAfter(0)[0].ID, "the returned slice is a copy")

	// Without a clock, calls and runs are numbered on one count.
	g := start(t, faults.ModelConfig{})
	g.post(false, user("tc-u1"))
	waitResult(t, g.lookup(context.Background(), "tc-k1-1-1"))
	g.post(false, user("tc-u1"))
	assert.Equal(t, []model.ToolRun{{ID: "tc-k1-1-1", At: 2}}, g.m.RunsAfter(0))
	assert.Equal(t, int64(3), g.m.CallsAfter(0)[1].At)
}

// TestLookupBadRequests: a method other than GET is 405; a missing or
// unreadable key is 400; neither is a run.
func TestLookupBadRequests(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	for _, method := range []string{http.MethodPost, http.MethodPut} {
		resp, _ := f.send(method, "/tools/lookup?key=tc-k1-1-1", nil)
		assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, method)
		assert.Equal(t, http.MethodGet, resp.Header.Get("Allow"))
	}
	for _, q := range []string{"", "?key=", "?k=tc-k1-1-1", "?key=tc-k1-1-1&key=tc-k1-1-2", "?key=nonsense",
		"?key=tc-k1-0-1", "?key=%20tc-k1-1-1", "?key=tc-k1-1-1%zz"} {
		resp, got := f.send(http.MethodGet, "/v1/tools/lookup"+q, nil)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, q)
		assert.Equal(t, "invalid_request_error", errorBody(t, got).Type, q)
	}
	assert.Empty(t, f.m.RunsAfter(0))
}

// TestLookupEpoch: with an epoch, the model's lookup keys carry it, and a
// lookup without it (of an earlier check) is answered but neither
// recorded nor held.
func TestLookupEpoch(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.Reset("ep-2")
	f.m.ScriptReply("tc-u1", faults.Reply{Rounds: []faults.Round{{faults.ToolLookup}}})
	g := f.m.HoldAt("tc-u1", faults.Point{Round: 1, Tool: 1})
	a := f.ask(false, bothTools, user("tc-u1 (ep-2)"))
	assert.Equal(t, []openai.ToolCall{toolCall("tc-u1", 1, 1, faults.ToolLookup, `{"key":"tc-k1-1-1 ep-2"}`)}, a.calls)

	for _, key := range []string{"tc-k1-1-1 ep-1", "tc-k1-1-1", "tc-k1-1-1 ep-22"} {
		r := waitResult(t, f.lookup(context.Background(), key))
		assert.Equal(t, http.StatusOK, r.status, key)
		assert.Equal(t, "value of "+key, string(r.body))
	}
	assert.Empty(t, f.m.RunsAfter(0), "lookups of another epoch are not runs of this check")
	select {
	case <-g.Arrived():
		require.FailNow(t, "a lookup of another epoch was held")
	default:
	}

	done := f.lookup(context.Background(), "tc-k1-1-1 ep-2")
	waitClosed(t, g.Arrived(), "the lookup of this epoch to be held")
	assert.Equal(t, []model.ToolRun{{ID: "tc-k1-1-1", At: 2}}, f.m.RunsAfter(0))
	g.Release()
	assert.Equal(t, "value of tc-k1-1-1 ep-2", string(waitResult(t, done).body))
}

// TestHoldAtLookup: a point at a tool call holds its lookup, and only it,
// until released; a held lookup whose server gives up ends unanswered.
func TestHoldAtLookup(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	g := f.m.HoldAt("tc-u1", faults.Point{Round: 2, Tool: 2})
	for _, key := range []string{"tc-k1-2-1", "tc-k1-1-2", "tc-k2-2-2"} {
		r := waitResult(t, f.lookup(context.Background(), key))
		assert.Equal(t, http.StatusOK, r.status, "%s is not at the point", key)
	}
	done := f.lookup(context.Background(), "tc-k1-2-2")
	waitClosed(t, g.Arrived(), "the held lookup")
	assert.Equal(t, 1, f.m.Holding())
	assert.Len(t, f.m.RunsAfter(0), 4, "a held lookup has started")
	requireHeld(t, done, "a held lookup")
	g.Release()
	r := waitResult(t, done)
	assert.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "value of tc-k1-2-2", string(r.body))
	assert.Zero(t, f.m.Holding())
	r = waitResult(t, f.lookup(context.Background(), "tc-k1-2-2"))
	assert.Equal(t, http.StatusOK, r.status, "only the first arrival is held")

	g = f.m.HoldAt("tc-u3", faults.Point{Round: 1, Tool: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done = f.lookup(ctx, "tc-k3-1-1")
	waitClosed(t, g.Arrived(), "the held lookup")
	cancel()
	assert.ErrorIs(t, waitResult(t, done).err, context.Canceled)
	assert.Eventually(t, func() bool { return f.m.Holding() == 0 }, guard, time.Millisecond)
}

// TestHoldingCounts: Holding counts the calls and lookups held at gates
// now, and not those released.
func TestHoldingCounts(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	assert.Zero(t, f.m.Holding())
	call := f.m.Gate("tc-u1")
	run := f.m.HoldAt("tc-u2", faults.Point{Round: 1, Tool: 1})
	early := f.m.Gate("tc-u3")
	early.Release()
	hold := f.m.Script("tc-u4", faults.Fault{Kind: faults.Hold})

	calls := f.goDo(context.Background(), body(t, false, user("tc-u1")))
	waitClosed(t, call.Arrived(), "the held call")
	assert.Equal(t, 1, f.m.Holding())
	runs := f.lookup(context.Background(), "tc-k2-1-1")
	waitClosed(t, run.Arrived(), "the held lookup")
	assert.Equal(t, 2, f.m.Holding())
	resp, _ := f.post(false, user("tc-u3"))
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a gate released before its arrival does not hold")
	ctx, cancel := context.WithCancel(context.Background())
	held := f.goDo(ctx, body(t, false, user("tc-u4")))
	waitClosed(t, hold, "the call held by a fault")
	assert.Equal(t, 2, f.m.Holding(), "a call held by a Hold fault is not at a gate")
	cancel()
	waitResult(t, held)

	call.Release()
	assert.Equal(t, 1, f.m.Holding())
	assert.Equal(t, http.StatusOK, waitResult(t, calls).status)
	run.Release()
	assert.Zero(t, f.m.Holding())
	assert.Equal(t, http.StatusOK, waitResult(t, runs).status)
}

// TestDropHoldsWhatArrives: once a turn's client went away, each call and
// lookup of the turn that arrives is held, unanswered, and counted, until
// the harness lets the turn go; other turns are answered as ever, and a
// turn forgotten is answered again.
func TestDropHoldsWhatArrives(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.Script("tc-u1", faults.Fault{})
	f.m.Drop("tc-u1")
	calls := f.goDo(context.Background(), body(t, false, user("tc-u1")))
	runs := f.lookup(context.Background(), "tc-k1-1-1")
	waitFor(t, func() bool { return f.m.HoldingTurn("tc-u1") == 2 }, "the call and the lookup held")
	assert.Equal(t, 2, f.m.Holding())
	resp, _ := f.post(false, user("tc-u2"))
	assert.Equal(t, http.StatusOK, resp.StatusCode, "another turn is answered")
	assert.Zero(t, f.m.HoldingTurn("tc-u2"))

	f.m.ReleaseDrop("tc-u1")
	assert.Equal(t, http.StatusOK, waitResult(t, calls).status)
	assert.Equal(t, http.StatusOK, waitResult(t, runs).status)
	assert.Zero(t, f.m.HoldingTurn("tc-u1"))
	resp, _ = f.post(false, user("tc-u1"))
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a turn let go is answered at once")

	// A server that gives up on a held call ends its hold.
	f.m.Drop("tc-u3")
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := f.goDo(ctx, body(t, false, user("tc-u3")))
	waitFor(t, func() bool { return f.m.HoldingTurn("tc-u3") == 1 }, "the call held")
	cancel()
	waitResult(t, gaveUp)
	waitFor(t, func() bool { return f.m.HoldingTurn("tc-u3") == 0 }, "the hold ended with the request")
	assert.Empty(t, f.m.GaveUpOn("tc-u1"), "the turn let go of was given up on nothing")
	var call3 []int64
	for _, c := range f.m.CallsAfter(0) {
		if c.Turn == "tc-u3" {
			call3 = append(call3, c.At)
		}
	}
	require.Len(t, call3, 1)
	assert.Equal(t, call3, f.m.GaveUpOn("tc-u3"), "the call given up on, named by its arrival")

	// Forget lets go of a dropped turn too.
	f.m.Drop("tc-u4")
	held := f.goDo(context.Background(), body(t, false, user("tc-u4")))
	waitFor(t, func() bool { return f.m.HoldingTurn("tc-u4") == 1 }, "the call held")
	f.m.Forget("tc-u4")
	assert.Equal(t, http.StatusOK, waitResult(t, held).status)
}

// TestCarriedOnAfterAGiveUp: of a dropped turn, a lookup that arrives
// while the call before it is still held is one the server had on its
// way; one that arrives after the server gave up on the held call carried
// the turn on, and says when.
func TestCarriedOnAfterAGiveUp(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.Drop("tc-u1")
	ctx, cancel := context.WithCancel(context.Background())
	held := f.goDo(ctx, body(t, false, user("tc-u1")))
	waitFor(t, func() bool { return f.m.HoldingTurn("tc-u1") == 1 }, "the call held")
	parallel := f.lookup(context.Background(), "tc-k1-1-1")
	waitFor(t, func() bool { return f.m.HoldingTurn("tc-u1") == 2 }, "the lookup held beside it")
	_, _, ok := f.m.CarriedOn("tc-u1")
	assert.False(t, ok, "a lookup beside a call still waited on carried nothing on")

	cancel() // the server gives up on the call
	waitResult(t, held)
	after := f.lookup(context.Background(), "tc-k1-1-2")
	waitFor(t, func() bool { _, _, ok := f.m.CarriedOn("tc-u1"); return ok }, "the lookup after the give-up noted")
	at, gaveUp, _ := f.m.CarriedOn("tc-u1")
	runs := f.m.RunsAfter(0)
	require.Len(t, runs, 2)
	assert.Equal(t, runs[1].At, at, "the lookup after the give-up is the one noted")
	calls := f.m.CallsAfter(0)
	require.Len(t, calls, 1)
	assert.Equal(t, []int64{calls[0].At}, gaveUp, "the call given up on is named by its arrival, the lookup beside it, still held, is not")
	f.m.ReleaseDrop("tc-u1")
	waitResult(t, parallel)
	waitResult(t, after)
}

// pausedLog is a Log that stops the model at its first line until told
// to go on: a call is then recorded but not yet answered.
type pausedLog struct {
	once  sync.Once
	wrote chan struct{}
	goOn  chan struct{}
}

func (l *pausedLog) Write(p []byte) (int, error) {
	l.once.Do(func() {
		close(l.wrote)
		<-l.goOn
	})
	return len(p), nil
}

// TestHoldShowsWithArrival: a gated call counts as held from the moment it
// is recorded, so that a harness that sees the call never sees a gap in
// which nothing holds it.
func TestHoldShowsWithArrival(t *testing.T) {
	log := &pausedLog{wrote: make(chan struct{}), goOn: make(chan struct{})}
	f := start(t, faults.ModelConfig{Log: log})
	var goOn sync.Once
	goOnce := func() { goOn.Do(func() { close(log.goOn) }) }
	t.Cleanup(goOnce) // before the model closes, which waits for the call
	g := f.m.Gate("tc-u1")
	t.Cleanup(g.Release)
	done := f.goDo(context.Background(), body(t, false, user("tc-u1")))
	waitClosed(t, log.wrote, "the call to be recorded")
	assert.Len(t, f.m.CallsAfter(0), 1)
	assert.Equal(t, 1, f.m.Holding(), "a recorded gated call is held")
	goOnce()
	waitClosed(t, g.Arrived(), "the hold")
	g.Release()
	assert.Equal(t, http.StatusOK, waitResult(t, done).status)
}

// TestResetReleasesHeldLookups: Reset lets a held lookup go on and forgets
// every run.
func TestResetReleasesHeldLookups(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	g := f.m.HoldAt("tc-u1", faults.Point{Round: 1, Tool: 1})
	done := f.lookup(context.Background(), "tc-k1-1-1")
	waitClosed(t, g.Arrived(), "the held lookup")
	require.Len(t, f.m.RunsAfter(0), 1)
	f.m.Reset("")
	r := waitResult(t, done)
	assert.Equal(t, http.StatusOK, r.status, "a held lookup goes on after Reset")
	assert.Empty(t, f.m.RunsAfter(0))
	assert.Zero(t, f.m.Holding())

	// An unarrived gate is released by Reset too: it holds nothing after.
	g = f.m.HoldAt("tc-u1", faults.Point{Round: 1, Tool: 1})
	f.m.Reset("")
	assert.Equal(t, http.StatusOK, waitResult(t, f.lookup(context.Background(), "tc-k1-1-1")).status)
}

// TestCloseAbortsHeldLookup: a lookup held when the model closes ends
// without an answer, never with an empty 200 the server would take for
// the tool's result. Run many times: the abort races the listener's close.
func TestCloseAbortsHeldLookup(t *testing.T) {
	for i := range 20 {
		f := start(t, faults.ModelConfig{})
		g := f.m.HoldAt("tc-u1", faults.Point{Round: 1, Tool: 1})
		done := f.lookup(context.Background(), "tc-k1-1-1")
		waitClosed(t, g.Arrived(), "the held lookup")
		require.NoError(t, f.m.Close())
		r := waitResult(t, done)
		assert.Error(t, r.err, "run %d", i)
		assert.Zero(t, r.status, "run %d", i)
	}
}

// TestToolArgumentsSplitOnRunes: a call's arguments stream in two pieces
// that are each valid text, even when the middle falls inside a character
// of the epoch.
func TestToolArgumentsSplitOnRunes(t *testing.T) {
	epoch := "ep-€€€"
	for args := `{"key":"tc-k1-1-1 ` + epoch + `"}`; utf8.RuneStart(args[len(args)/2]); args = `{"key":"tc-k1-1-1 ` + epoch + `"}` {
		epoch += "€" // until the middle is inside one
	}
	f := start(t, faults.ModelConfig{})
	f.m.Reset(epoch)
	f.m.ScriptReply("tc-u1", faults.Reply{Rounds: []faults.Round{{faults.ToolLookup}}})
	a := f.ask(true, bothTools, user("tc-u1 "+epoch))
	want := toolCall("tc-u1", 1, 1, faults.ToolLookup, `{"key":"tc-k1-1-1 `+epoch+`"}`)
	assert.Equal(t, []openai.ToolCall{want}, a.calls)
}

// TestLookupLog: one line per lookup, saying whether it was recorded.
func TestLookupLog(t *testing.T) {
	log := &syncbuf.Buffer{}
	f := start(t, faults.ModelConfig{Log: log})
	f.m.Reset("ep-1")
	waitResult(t, f.lookup(context.Background(), "tc-k1-1-1 ep-1"))
	waitResult(t, f.lookup(context.Background(), "tc-k1-1-2 ep-0"))
	f.send(http.MethodGet, "/tools/lookup", nil) // a bad request: no line
	lines := strings.Split(strings.TrimSuffix(log.String(), "\n"), "\n")
	require.Len(t, lines, 2, "%s", log.String())
	assert.Contains(t, lines[0], "tc-k1-1-1")
	assert.Contains(t, lines[0], "recorded=true")
	assert.Contains(t, lines[1], "tc-k1-1-2")
	assert.Contains(t, lines[1], "recorded=false")
}
