package faults_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/procs"
	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/internal/tmpfs"
	"github.com/turncheck/turncheck/model"
)

// TestMain fails the tests on a leaked goroutine, and on a server process
// that outlived them.
func TestMain(m *testing.M) {
	tmpfs.Use()
	goleak.VerifyTestMain(procs.Checked(m))
}

// guard bounds how long a test waits for something that must happen; it
// only turns a hang into a failure, it never decides an outcome.
const guard = 5 * time.Second

// ---------------------------------------------------------------------------
// Helpers

// fixture is one fake model and a client of its own, both closed when the
// test ends.
type fixture struct {
	t      *testing.T
	m      *faults.Model
	client *http.Client
	tr     *http.Transport
}

func start(t *testing.T, cfg faults.ModelConfig) *fixture {
	t.Helper()
	m, err := faults.StartModel(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, m.Close()) })
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	require.True(t, strings.HasPrefix(m.URL(), "http://127.0.0.1:"), "the model listens on loopback: %s", m.URL())
	return &fixture{t: t, m: m, client: &http.Client{Transport: tr}, tr: tr}
}

func msg(role, content string) openai.Message {
	return openai.Message{Role: role, Content: openai.Content(content)}
}

func user(content string) openai.Message { return msg(openai.RoleUser, content) }

func body(t *testing.T, stream bool, msgs ...openai.Message) []byte {
	t.Helper()
	b, err := json.Marshal(openai.ChatRequest{Model: "fake", Messages: msgs, Stream: stream})
	require.NoError(t, err)
	return b
}

// do sends a request to the model at path (relative to its address) and
// returns the response; the caller closes its body.
func (f *fixture) do(ctx context.Context, method, path string, b []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+f.m.Addr()+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return f.client.Do(req)
}

// post sends a chat completion to /v1/chat/completions and returns the
// status and the whole body, which must read cleanly.
func (f *fixture) post(stream bool, msgs ...openai.Message) (*http.Response, []byte) {
	f.t.Helper()
	return f.send(http.MethodPost, "/v1/chat/completions", body(f.t, stream, msgs...))
}

func (f *fixture) send(method, path string, b []byte) (*http.Response, []byte) {
	f.t.Helper()
	resp, err := f.do(context.Background(), method, path, b)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	return resp, got
}

// events reads an event stream to its end: the data payloads, and the error
// that ended it (io.EOF for a clean end).
func events(r io.Reader) ([]string, error) {
	sr := sse.NewReader(r)
	var out []string
	for {
		d, err := sr.Next()
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
}

// decode decodes stream payloads; the [DONE] sentinel and undecodable
// payloads are left as nil entries.
func decode(payloads []string) []*openai.Completion {
	out := make([]*openai.Completion, len(payloads))
	for i, p := range payloads {
		var c openai.Completion
		if p != openai.DoneSentinel && json.Unmarshal([]byte(p), &c) == nil {
			out[i] = &c
		}
	}
	return out
}

// contentChunks returns the delta texts of the chunks that carry some.
func contentChunks(cs []*openai.Completion) []string {
	out := []string{}
	for _, c := range cs {
		if c != nil && c.Text() != "" {
			out = append(out, unmark(c.Text()))
		}
	}
	return out
}

// unmark is text without the call marks the model names its replies' calls
// with: tests of what else a reply says compare it with ReplyChunks.
func unmark(text string) string { return model.WithoutCallMarks(text) }

func hasFinishStop(cs []*openai.Completion) bool {
	for _, c := range cs {
		if c != nil && c.Finish() == openai.FinishStop {
			return true
		}
	}
	return false
}

func errorBody(t *testing.T, b []byte) openai.ErrorDetail {
	t.Helper()
	var e openai.ErrorBody
	require.NoError(t, json.Unmarshal(b, &e), "error body %q", b)
	return e.Error
}

func reply(tok model.Token) string { return strings.Join(faults.ReplyChunks(tok), "") }

// result is what a client call in a goroutine ended with.
type result struct {
	status int
	body   []byte
	err    error
}

// goDo sends b in a goroutine and reports how it ended on the returned
// channel.
func (f *fixture) goDo(ctx context.Context, b []byte) <-chan result {
	return f.goSend(ctx, http.MethodPost, "/v1/chat/completions", b)
}

// goSend sends a request in a goroutine and reports how it ended on the
// returned channel.
func (f *fixture) goSend(ctx context.Context, method, path string, b []byte) <-chan result {
	done := make(chan result, 1)
	go func() {
		resp, err := f.do(ctx, method, path, b)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		done <- result{status: resp.StatusCode, body: got, err: err}
	}()
	return done
}

// requireHeld requires that no answer to what comes on done for a while:
// the model holds it.
func requireHeld(t *testing.T, done <-chan result, what string) {
	t.Helper()
	select {
	case r := <-done:
		require.FailNow(t, what+" was answered", "%+v", r)
	case <-time.After(50 * time.Millisecond):
	}
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(guard):
		require.FailNow(t, "timed out waiting for "+what)
	}
}

func waitResult(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(guard):
		require.FailNow(t, "timed out waiting for the client call to end")
	}
	return result{}
}

// ---------------------------------------------------------------------------
// Recording

func TestRecordsTokensOfAllMessagesInOrder(t *testing.T) {
	f := start(t, faults.ModelConfig{})

	resp, _ := f.post(false,
		msg(openai.RoleSystem, "You are helpful. tc-a90"),
		user("first tc-u1"),
		msg(openai.RoleAssistant, "tc-a1 acknowledges"),
		user("tc-a77 second tc-u2, also tc-u3"),
		msg(openai.RoleTool, "tool output tc-a8"),
		msg(openai.RoleAssistant, "no token here"),
	)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	calls := f.m.CallsAfter(0)
	require.Len(t, calls, 1)
	assert.Equal(t, []model.Token{"tc-a90", "tc-u1", "tc-a1", "tc-a77", "tc-u2", "tc-u3", "tc-a8"}, calls[0].History)
	// The turn is the last user token of the last run of user messages,
	// even when assistant and tool messages follow it.
	assert.Equal(t, model.Token("tc-u3"), calls[0].Turn)
}

func TestRecordsContentParts(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	b := []byte(`{"model":"fake","messages":[
		{"role":"system","content":null},
		{"role":"user","content":[{"type":"text","text":"hello "},{"type":"text","text":"tc-u4"}]}]}`)
	resp, got := f.send(http.MethodPost, "/v1/chat/completions", b)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", got)
	calls := f.m.CallsAfter(0)
	require.Len(t, calls, 1)
	assert.Equal(t, []model.Token{"tc-u4"}, calls[0].History)
	assert.Equal(t, model.Token("tc-u4"), calls[0].Turn)
}

// TestTurnIsTheLastUserToken: a call belongs to the last user token of its
// last run of user messages, whether the server merged the user's
// messages or appended a tokenless one after them (Tail says so).
// Trailing says that any tokenless message comes after the last token:
// a history run as it stands, ending in its reply, has none.
func TestTurnIsTheLastUserToken(t *testing.T) {
	for name, tc := range map[string]struct {
		msgs           []openai.Message
		turn           model.Token
		tail, trailing bool
	}{
		"plain":             {[]openai.Message{user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), user("tc-u2")}, "tc-u2", false, false},
		"merged":            {[]openai.Message{user("tc-u1 and then tc-u2")}, "tc-u2", false, false},
		"appended context":  {[]openai.Message{user("tc-u2"), user("<context>the time is 12:00</context>")}, "tc-u2", true, true},
		"blank passed on":   {[]openai.Message{user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), user("  ")}, "", true, true},
		"context then user": {[]openai.Message{user("<context/>"), user("tc-u3")}, "tc-u3", false, false},
		"run as it stands":  {[]openai.Message{user("tc-u1"), msg(openai.RoleAssistant, "tc-a1")}, "tc-u1", false, false},
		"the harness's own": {[]openai.Message{user("Please remember tc-u2. (tcab12cd-3)")}, "tc-u2", false, false},
		"merged into it": {[]openai.Message{user("Please remember tc-u2. (tcab12cd-3)\nnoon")},
			"tc-u2", true, true},
		"merged into it, then answered": {[]openai.Message{user("Please remember tc-u2. (tcab12cd-3)\nnoon"), msg(openai.RoleAssistant, "tc-a2")},
			"tc-u2", true, false},
		"merged into an earlier one": {[]openai.Message{user("Please remember tc-u1.\nnoon"), msg(openai.RoleAssistant, "tc-a1"), user("Please remember tc-u2.")},
			"tc-u2", false, false},
		"assistant appended": {[]openai.Message{user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), msg(openai.RoleAssistant, "Noted.")},
			"tc-u1", false, true},
	} {
		f := start(t, faults.ModelConfig{})
		resp, got := f.post(false, tc.msgs...)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", name, got)
		calls := f.m.CallsAfter(0)
		require.Len(t, calls, 1, name)
		assert.Equal(t, tc.turn, calls[0].Turn, name)
		assert.Equal(t, tc.tail, calls[0].Tail, name)
		assert.Equal(t, tc.trailing, calls[0].Trailing, name)
	}
}

func TestTurnIsEmptyWithoutUserToken(t *testing.T) {
	cases := []struct {
		name    string
		msgs    []openai.Message
		history []model.Token
	}{
		{"no messages", nil, []model.Token{}},
		{"no tokens", []openai.Message{user("hi")}, []model.Token{}},
		{"only system and assistant tokens", []openai.Message{
			msg(openai.RoleSystem, "tc-u7 in a system prompt"),
			msg(openai.RoleAssistant, "tc-a7"),
		}, []model.Token{"tc-u7", "tc-a7"}},
		{"last user message has no token", []openai.Message{
			user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), user("a title please"),
		}, []model.Token{"tc-u1", "tc-a1"}},
		{"last user message has only a reply token", []openai.Message{
			user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), user("quoting tc-a1"),
		}, []model.Token{"tc-u1", "tc-a1", "tc-a1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := start(t, faults.ModelConfig{})
			for _, stream := range []bool{false, true} {
				before := f.m.CallCount()
				resp, got := f.post(stream, tc.msgs...)
				require.Equal(t, http.StatusOK, resp.StatusCode, "%s", got)
				calls := f.m.CallsAfter(int64(before))
				require.Len(t, calls, 1)
				assert.Equal(t, model.Token(""), calls[0].Turn)
				assert.NotNil(t, calls[0].History, "an empty history is recorded as empty, not nil")
				assert.Equal(t, tc.history, calls[0].History)
				assert.NotContains(t, string(got), "tc-a", "a call without a turn gets no reply token")
			}
		})
	}
}

func TestScriptForUnrelatedTokenDoesNotApply(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 500})
	// tc-u1 is in the history but the turn is tc-u2.
	resp, got := f.post(false, user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), user("tc-u2"))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(got), "tc-a2")
	// A request without a turn is not matched by any script, not even one
	// set for the empty token.
	f.m.Script("", faults.Fault{Kind: faults.Status, Status: 500})
	resp, _ = f.post(false, user("no token"))
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestBothPaths(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	for i, path := range []string{"/v1/chat/completions", "/chat/completions"} {
		tok := model.UserToken(i + 1)
		resp, got := f.send(http.MethodPost, path, body(t, false, user("hi "+string(tok))))
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Contains(t, string(got), string(tok.Reply()), path)
	}
	assert.True(t, strings.HasSuffix(f.m.URL(), "/v1"))
	calls := f.m.CallsAfter(0)
	require.Len(t, calls, 2)
	assert.Equal(t, model.Token("tc-u1"), calls[0].Turn)
	assert.Equal(t, model.Token("tc-u2"), calls[1].Turn)
}

// TestServedBy: a replica given the model's ReplicaURL is served as at
// the base URL, tools and agents included, and the model tells which
// replica made a turn's latest call.
func TestServedBy(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	base := strings.TrimPrefix(faults.ReplicaURL(f.m.URL(), 2), "http://"+f.m.Addr())
	assert.Equal(t, "/replica/2/v1", base)
	resp, got := f.send(http.MethodPost, base+"/chat/completions", body(t, false, user("hi tc-u1")))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(got), string(model.Token("tc-u1").Reply()))
	r, ok := f.m.ServedBy("tc-u1")
	assert.True(t, ok)
	assert.Equal(t, 2, r)
	resp, _ = f.send(http.MethodGet, base+"/tools/lookup?key=tc-k1-1-1", nil)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the lookup tool under a replica's base URL")

	f.post(false, user("hi tc-u2"))
	_, ok = f.m.ServedBy("tc-u2")
	assert.False(t, ok, "a call at the base URL names no replica")
	f.m.Reset("")
	_, ok = f.m.ServedBy("tc-u1")
	assert.False(t, ok, "forgotten with the rest")
}

// ---------------------------------------------------------------------------
// Replies

func TestReplyNonStream(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	resp, got := f.post(false, user("hello tc-u5"))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))

	var c openai.Completion
	require.NoError(t, json.Unmarshal(got, &c), "%s", got)
	assert.Equal(t, openai.ObjectCompletion, c.Object)
	require.Len(t, c.Choices, 1)
	require.NotNil(t, c.Choices[0].Message)
	assert.Equal(t, openai.RoleAssistant, c.Choices[0].Message.Role)
	assert.Equal(t, reply("tc-u5"), unmark(c.Text()))
	assert.True(t, strings.HasPrefix(c.Text(), "tc-a5"))
	assert.Equal(t, []model.Token{"tc-a5"}, model.Tokens(c.Text()))
	assert.Equal(t, openai.FinishStop, c.Finish())
}

// TestNothingNewToAnswer: a call whose last user message has its reply
// already in the history (a client tool's output, or a system message,
// after it) is answered with no token; one that carries that message
// again after its reply is the turn's, and is answered with its token.
func TestNothingNewToAnswer(t *testing.T) {
	call := openai.Message{Role: openai.RoleAssistant, ToolCalls: []openai.ToolCall{{ID: "call_1", Type: openai.TypeFunction,
		Function: openai.FunctionCall{Name: "clock", Arguments: "{}"}}}}
	result := openai.Message{Role: openai.RoleTool, ToolCallID: "call_1", Content: "noon"}
	for name, tc := range map[string]struct {
		msgs []openai.Message
		want []model.Token
	}{
		"a client tool's output": {[]openai.Message{user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), call, result}, nil},
		"a system message":       {[]openai.Message{user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), msg(openai.RoleSystem, "be brief")}, nil},
		"the message again":      {[]openai.Message{user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), user("tc-u1")}, []model.Token{"tc-a1"}},
		"a tool loop":            {[]openai.Message{user("tc-u1"), call, result}, []model.Token{"tc-a1"}},
	} {
		f := start(t, faults.ModelConfig{})
		resp, got := f.post(false, tc.msgs...)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", name, got)
		var c openai.Completion
		require.NoError(t, json.Unmarshal(got, &c), "%s", got)
		assert.Equal(t, tc.want, model.Tokens(c.Text()), name)
		assert.Equal(t, openai.FinishStop, c.Finish(), name)
	}
}

func TestReplyStream(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	resp, err := f.do(context.Background(), http.MethodPost, "/v1/chat/completions", body(t, true, user("hello tc-u5")))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))

	payloads, err := events(resp.Body)
	require.ErrorIs(t, err, io.EOF, "the stream ends cleanly")
	require.NotEmpty(t, payloads)
	assert.Equal(t, openai.DoneSentinel, payloads[len(payloads)-1], "the stream ends with data: [DONE]")

	cs := decode(payloads[:len(payloads)-1])
	for i, c := range cs {
		require.NotNil(t, c, "chunk %d is valid JSON: %s", i, payloads[i])
		assert.Equal(t, openai.ObjectChunk, c.Object)
	}
	// The first chunk names the role, the last carries finish_reason "stop".
	require.NotNil(t, cs[0].Choices[0].Delta)
	assert.Equal(t, openai.RoleAssistant, cs[0].Choices[0].Delta.Role)
	assert.Equal(t, openai.FinishStop, cs[len(cs)-1].Finish())
	for _, c := range cs[:len(cs)-1] {
		assert.Empty(t, c.Finish(), "only the last chunk finishes")
	}

	content := contentChunks(cs)
	assert.Equal(t, faults.ReplyChunks("tc-u5"), content)
	assert.Equal(t, "tc-a5", content[0], "the reply token comes in the first content chunk")
	assert.Equal(t, reply("tc-u5"), strings.Join(content, ""))
}

// TestStreamUsage: a request with stream_options.include_usage gets, after
// the finishing chunk, a chunk with no choices and the usage, as OpenAI
// sends it (some servers wait for it); one without gets none.
func TestStreamUsage(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	for _, include := range []bool{true, false} {
		b, err := json.Marshal(openai.ChatRequest{Model: "fake", Stream: true,
			Messages:      []openai.Message{user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), user("tc-u2")},
			StreamOptions: &openai.StreamOptions{IncludeUsage: include}})
		require.NoError(t, err)
		resp, err := f.do(context.Background(), http.MethodPost, "/v1/chat/completions", b)
		require.NoError(t, err)
		payloads, err := events(resp.Body)
		_ = resp.Body.Close()
		require.ErrorIs(t, err, io.EOF)
		require.Equal(t, openai.DoneSentinel, payloads[len(payloads)-1])
		cs := decode(payloads[:len(payloads)-1])
		last := cs[len(cs)-1]
		if !include {
			assert.Nil(t, last.Usage)
			assert.Equal(t, openai.FinishStop, last.Finish())
			continue
		}
		require.NotNil(t, last.Usage, "no usage chunk")
		assert.Empty(t, last.Choices)
		assert.Equal(t, 3, last.Usage.PromptTokens)
		assert.Equal(t, last.Usage.PromptTokens+last.Usage.CompletionTokens, last.Usage.TotalTokens)
		assert.Equal(t, openai.FinishStop, cs[len(cs)-2].Finish(), "the finish comes before the usage")
	}
}

func TestReplyChunks(t *testing.T) {
	cs := faults.ReplyChunks("tc-u12")
	require.NotEmpty(t, cs)
	assert.Equal(t, "tc-a12", cs[0])
	assert.Equal(t, []model.Token{"tc-a12"}, model.Tokens(strings.Join(cs, "")))
}

// ---------------------------------------------------------------------------
// Status faults

func TestStatusFault(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	n := 0
	for _, status := range []int{500, 502, 503, 429} {
		for _, hint := range []bool{false, true} {
			for _, stream := range []bool{false, true} {
				n++
				tok := model.UserToken(n)
				name := fmt.Sprintf("%d hint=%t stream=%t", status, hint, stream)
				f.m.Script(tok, faults.Fault{Kind: faults.Status, Status: status, RetryHint: hint})
				resp, got := f.post(stream, user("hi "+string(tok)))
				assert.Equal(t, status, resp.StatusCode, name)
				assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), name)
				e := errorBody(t, got)
				assert.NotEmpty(t, e.Message, name)
				assert.NotEmpty(t, e.Type, name)
				assert.NotContains(t, string(got), string(tok.Reply()), name)
				if hint {
					assert.NotEmpty(t, resp.Header.Get("Retry-After"), name)
				} else {
					assert.Empty(t, resp.Header.Values("Retry-After"), name)
				}
			}
		}
	}
	assert.Equal(t, n, f.m.CallCount(), "failed calls are recorded too")
}

func TestTimesLimitsFaultToFirstCalls(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 503, Times: 2})

	statuses := func(n int) []int {
		var out []int
		for range n {
			resp, _ := f.post(false, user("tc-u1"))
			out = append(out, resp.StatusCode)
		}
		return out
	}
	assert.Equal(t, []int{503, 503, 200, 200}, statuses(4))

	// Calls of another turn do not count toward tc-u1's Times.
	f.m.Script("tc-u2", faults.Fault{Kind: faults.Status, Status: 500, Times: 1})
	resp, _ := f.post(false, user("tc-u1"))
	assert.Equal(t, 200, resp.StatusCode)
	resp, _ = f.post(false, user("tc-u2"))
	assert.Equal(t, 500, resp.StatusCode)
	resp, _ = f.post(false, user("tc-u2"))
	assert.Equal(t, 200, resp.StatusCode)

	// A new script resets the count.
	f.m.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 502, Times: 1})
	assert.Equal(t, []int{502, 200}, statuses(2))
	f.m.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 429, Times: 2})
	assert.Equal(t, []int{429, 429, 200}, statuses(3))

	// Times 0: every call.
	f.m.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 500})
	assert.Equal(t, []int{500, 500, 500, 500, 500}, statuses(5))

	// Replacing the script with None answers normally at once.
	f.m.Script("tc-u1", faults.Fault{})
	assert.Equal(t, []int{200}, statuses(1))
}

func TestTimesAppliesToStreamFaults(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.Script("tc-u1", faults.Fault{Kind: faults.Cut, After: 1, Times: 1})

	resp, err := f.do(context.Background(), http.MethodPost, "/v1/chat/completions", body(t, true, user("tc-u1")))
	require.NoError(t, err)
	_, err = events(resp.Body)
	resp.Body.Close()
	assert.NotErrorIs(t, err, io.EOF, "the first call is cut")

	resp, err = f.do(context.Background(), http.MethodPost, "/v1/chat/completions", body(t, true, user("tc-u1")))
	require.NoError(t, err)
	payloads, err := events(resp.Body)
	resp.Body.Close()
	assert.ErrorIs(t, err, io.EOF, "the retry is answered whole")
	require.NotEmpty(t, payloads)
	assert.Equal(t, openai.DoneSentinel, payloads[len(payloads)-1])
}

// ---------------------------------------------------------------------------
// Stream faults

func TestCutStream(t *testing.T) {
	n := len(faults.ReplyChunks("tc-u1"))
	for k := 0; k <= n+1; k++ {
		t.Run(fmt.Sprintf("after %d", k), func(t *testing.T) {
			f := start(t, faults.ModelConfig{})
			f.m.Script("tc-u1", faults.Fault{Kind: faults.Cut, After: k})
			resp, err := f.do(context.Background(), http.MethodPost, "/v1/chat/completions", body(t, true, user("tc-u1")))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)

			payloads, err := events(resp.Body)
			require.Error(t, err)
			assert.NotErrorIs(t, err, io.EOF, "the body breaks rather than ending")
			assert.NotContains(t, payloads, openai.DoneSentinel)

			cs := decode(payloads)
			for i, c := range cs {
				assert.NotNil(t, c, "every chunk before the cut is valid: %s", payloads[i])
			}
			assert.False(t, hasFinishStop(cs), "a cut stream never finishes")
			assert.Equal(t, faults.ReplyChunks("tc-u1")[:min(k, n)], contentChunks(cs),
				"exactly the first %d content chunks arrive", k)
			assert.Equal(t, 1, f.m.CallCount())
		})
	}
}

func TestCutNonStream(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.Script("tc-u1", faults.Fault{Kind: faults.Cut, After: 1})
	resp, err := f.do(context.Background(), http.MethodPost, "/v1/chat/completions", body(t, false, user("tc-u1")))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	got, err := io.ReadAll(resp.Body)
	// The body breaks off: io.ErrUnexpectedEOF, or a reset when the
	// connection is closed without lingering.
	require.Error(t, err, "the body breaks off")
	assert.NotErrorIs(t, err, io.EOF)
	var c openai.Completion
	assert.Error(t, json.Unmarshal(got, &c), "a truncated body is not a completion: %q", got)
}

func TestMalformedStream(t *testing.T) {
	n := len(faults.ReplyChunks("tc-u1"))
	for k := 0; k < n; k++ {
		t.Run(fmt.Sprintf("after %d", k), func(t *testing.T) {
			f := start(t, faults.ModelConfig{})
			f.m.Script("tc-u1", faults.Fault{Kind: faults.Malformed, After: k})
			resp, err := f.do(context.Background(), http.MethodPost, "/v1/chat/completions", body(t, true, user("tc-u1")))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)

			payloads, err := events(resp.Body)
			require.ErrorIs(t, err, io.EOF)
			bad := badChunk(payloads)
			require.GreaterOrEqual(t, bad, 0, "a chunk that is not valid JSON appears: %q", payloads)
			assert.Equal(t, faults.ReplyChunks("tc-u1")[:k], contentChunks(decode(payloads[:bad])),
				"exactly %d good content chunks precede the malformed one", k)
		})
	}
}

// badChunk is the index of the first payload that is neither [DONE] nor
// valid JSON, or -1.
func badChunk(payloads []string) int {
	for i, p := range payloads {
		if p != openai.DoneSentinel && !json.Valid([]byte(p)) {
			return i
		}
	}
	return -1
}

// A Malformed fault whose After equals the number of reply chunks must send
// its malformed chunk after all of them, as Cut does (Fault.After: "how many
// reply chunks go out before a Cut or Malformed fault").
func TestMalformedStreamAfterAllChunks(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	n := len(faults.ReplyChunks("tc-u1"))
	f.m.Script("tc-u1", faults.Fault{Kind: faults.Malformed, After: n})
	resp, err := f.do(context.Background(), http.MethodPost, "/v1/chat/completions", body(t, true, user("tc-u1")))
	require.NoError(t, err)
	defer resp.Body.Close()
	payloads, _ := events(resp.Body)
	assert.GreaterOrEqual(t, badChunk(payloads), 0, "a malformed chunk appears: %q", payloads)
}

func TestMalformedNonStream(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.Script("tc-u1", faults.Fault{Kind: faults.Malformed, After: 1})
	resp, got := f.post(false, user("tc-u1"))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.False(t, json.Valid(got), "the body is not valid JSON: %q", got)
	assert.NotEmpty(t, got)
}

// ---------------------------------------------------------------------------
// Hold and arrival

func TestHoldUntilClientCancels(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			f := start(t, faults.ModelConfig{})
			arrived := f.m.Script("tc-u1", faults.Fault{Kind: faults.Hold})
			baseline := goleak.IgnoreCurrent()

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := f.goDo(ctx, body(t, stream, user("tc-u1")))

			waitClosed(t, arrived, "the held call to arrive")
			select {
			case r := <-done:
				require.FailNow(t, "a held call was answered", "%+v", r)
			default:
			}
			cancel()
			r := waitResult(t, done)
			assert.ErrorIs(t, r.err, context.Canceled)
			assert.Zero(t, r.status, "the model never answered")

			// The model's handler ends once the client has gone, without
			// Close: no goroutine started by the call outlives it.
			f.tr.CloseIdleConnections()
			assert.NoError(t, goleak.Find(baseline), "the held call's goroutines end after the client cancels")
			assert.Equal(t, 1, f.m.CallCount())

			// The model still answers other turns.
			resp, got := f.post(stream, user("tc-u2"))
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Contains(t, string(got), "tc-a2")
		})
	}
}

func TestCloseReleasesHeldCall(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			f := start(t, faults.ModelConfig{})
			arrived := f.m.Script("tc-u1", faults.Fault{Kind: faults.Hold})
			done := f.goDo(context.Background(), body(t, stream, user("tc-u1")))
			waitClosed(t, arrived, "the held call to arrive")

			closed := make(chan error, 1)
			go func() { closed <- f.m.Close() }()
			select {
			case err := <-closed:
				assert.NoError(t, err)
			case <-time.After(guard):
				require.FailNow(t, "Close did not return while a call was held")
			}
			r := waitResult(t, done)
			// The call ends without a reply. Ideally with a transport error:
			// see TestCloseAbortsHeldCall for why that is not asserted here.
			assert.False(t, r.err == nil && r.status == http.StatusOK && len(r.body) > 0,
				"a released held call carries no reply: %+v", r)
			assert.NotContains(t, string(r.body), "tc-a1")

			// Close is idempotent, and a closed model refuses calls.
			assert.NoError(t, f.m.Close())
			_, err := f.do(context.Background(), http.MethodPost, "/v1/chat/completions", body(t, false, user("tc-u2")))
			assert.Error(t, err)
		})
	}
}

// Close must release a held call without answering it: the client sees a
// broken call, never a 200.
func TestCloseAbortsHeldCall(t *testing.T) {
	for i := range 20 {
		for _, stream := range []bool{false, true} {
			f := start(t, faults.ModelConfig{})
			arrived := f.m.Script("tc-u1", faults.Fault{Kind: faults.Hold})
			done := f.goDo(context.Background(), body(t, stream, user("tc-u1")))
			waitClosed(t, arrived, "the held call to arrive")
			require.NoError(t, f.m.Close())
			r := waitResult(t, done)
			assert.Error(t, r.err, "run %d stream=%t: the client of a held call sees an error when the model closes", i, stream)
			assert.Zero(t, r.status, "run %d stream=%t: the model never answered", i, stream)
		}
	}
}

func TestCloseWithoutCalls(t *testing.T) {
	m, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	assert.NoError(t, m.Close())
	assert.NoError(t, m.Close())
}

func TestStartModelBadAddr(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	_, err := faults.StartModel(faults.ModelConfig{Addr: f.m.Addr()})
	assert.Error(t, err, "the address is in use")
}

func TestArrivalChannel(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	arrived := f.m.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 500, Times: 1})
	isClosed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	assert.False(t, isClosed(arrived), "no call yet")

	// Calls of other turns, and calls carrying tc-u1 only in their history,
	// are not its arrival.
	f.post(false, user("tc-u2"))
	f.post(false, user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), user("tc-u3"))
	f.post(false, user("no token"))
	assert.False(t, isClosed(arrived))

	// The channel is closed before the first call of the turn is answered.
	resp, _ := f.post(false, user("tc-u1"))
	assert.Equal(t, 500, resp.StatusCode)
	assert.True(t, isClosed(arrived))

	// Later calls do not close it again (a double close would panic the
	// handler and break the call).
	resp, _ = f.post(false, user("tc-u1"))
	assert.Equal(t, 200, resp.StatusCode)
	resp, _ = f.post(true, user("tc-u1"))
	assert.Equal(t, 200, resp.StatusCode)

	// A new script gives a new channel, open until the next call.
	again := f.m.Script("tc-u1", faults.Fault{})
	assert.False(t, isClosed(again))
	f.post(false, user("tc-u1"))
	assert.True(t, isClosed(again))
}

func TestArrivalUnderConcurrentCalls(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	const n = 16
	arrived := f.m.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 503, Times: 3})
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Go(func() {
			resp, err := f.do(context.Background(), http.MethodPost, "/v1/chat/completions", body(t, i%2 == 0, user("tc-u1")))
			if !assert.NoError(t, err) {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	wg.Wait()
	waitClosed(t, arrived, "the arrival")
	failed := 0
	for _, s := range statuses {
		if s == 503 {
			failed++
		} else {
			assert.Equal(t, 200, s)
		}
	}
	assert.Equal(t, 3, failed, "exactly Times calls fail, whatever their order")
	assert.Equal(t, n, f.m.CallCount())
}

// ---------------------------------------------------------------------------
// Call log

func TestCallsAfterAndCallCount(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	assert.Equal(t, 0, f.m.CallCount())
	assert.Empty(t, f.m.CallsAfter(0))

	f.post(false, user("tc-u1"))
	f.post(true, user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), user("tc-u2"))
	f.m.Script("tc-u3", faults.Fault{Kind: faults.Status, Status: 500})
	f.post(false, user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), user("tc-u3"))
	require.Equal(t, 3, f.m.CallCount())

	all := f.m.CallsAfter(0)
	assert.Equal(t, []model.Call{
		{History: []model.Token{"tc-u1"}, Turn: "tc-u1", At: 1, Unanswered: 1},
		{History: []model.Token{"tc-u1", "tc-a1", "tc-u2"}, Turn: "tc-u2", At: 2, Unanswered: 2},
		{History: []model.Token{"tc-u1", "tc-a1", "tc-u3"}, Turn: "tc-u3", At: 3, Unanswered: 3},
	}, all)
	assert.Equal(t, all[1:], f.m.CallsAfter(1))
	assert.Equal(t, all[2:], f.m.CallsAfter(2))
	assert.Empty(t, f.m.CallsAfter(3))
	assert.Empty(t, f.m.CallsAfter(100))

	// The returned slice is a copy.
	got := f.m.CallsAfter(0)
	got[0] = model.Call{Turn: "tc-u99"}
	assert.Equal(t, model.Token("tc-u1"), f.m.CallsAfter(0)[0].Turn)
}

// TestClockStampsCalls: with a clock, calls fall on the caller's timeline.
func TestClockStampsCalls(t *testing.T) {
	var now int64 = 100
	f := start(t, faults.ModelConfig{Clock: func() int64 { now += 10; return now }})
	f.post(false, user("tc-u1"))
	f.post(false, user("tc-u2"))
	calls := f.m.CallsAfter(0)
	require.Len(t, calls, 2)
	assert.Equal(t, []int64{110, 120}, []int64{calls[0].At, calls[1].At})
	assert.Len(t, f.m.CallsAfter(110), 1)
}

// TestGate: a gated call is held where it arrives until released, then
// gets its script; a call whose server gives up ends unanswered.
func TestGate(t *testing.T) {
	t.Run("released", func(t *testing.T) {
		f := start(t, faults.ModelConfig{})
		f.m.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 503})
		g := f.m.Gate("tc-u1")
		done := f.goDo(context.Background(), body(t, false, user("tc-u1")))
		<-g.Arrived()
		select {
		case <-done:
			t.Fatal("the gated call was answered before its release")
		default:
		}
		g.Release()
		g.Release() // twice is harmless
		assert.Equal(t, 503, (<-done).status)
		// Only the first call is gated: a retry gets the script at once.
		resp, _ := f.post(false, user("tc-u1"))
		assert.Equal(t, 503, resp.StatusCode)
	})
	t.Run("the server gives up", func(t *testing.T) {
		f := start(t, faults.ModelConfig{})
		g := f.m.Gate("tc-u1")
		ctx, cancel := context.WithCancel(context.Background())
		done := f.goDo(ctx, body(t, false, user("tc-u1")))
		<-g.Arrived()
		cancel()
		require.Error(t, (<-done).err)
	})
	t.Run("without a script", func(t *testing.T) {
		f := start(t, faults.ModelConfig{})
		g := f.m.Gate("tc-u1")
		g.Release() // before the call arrives
		resp, _ := f.post(false, user("tc-u1"))
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		<-g.Arrived()
	})
}

func TestConcurrentCallsAllRecorded(t *testing.T) {
	f := start(t, faults.ModelConfig{Log: &syncbuf.Buffer{}})
	const n = 32
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			tok := model.UserToken(i + 1)
			resp, err := f.do(context.Background(), http.MethodPost, "/v1/chat/completions", body(t, i%2 == 1, user(string(tok))))
			if !assert.NoError(t, err) {
				return
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.NoError(t, err)
			assert.Contains(t, string(got), string(tok.Reply()))
		})
	}
	wg.Wait()
	calls := f.m.CallsAfter(0)
	require.Len(t, calls, n)
	seen := map[model.Token]bool{}
	for _, c := range calls {
		assert.Equal(t, []model.Token{c.Turn}, c.History)
		seen[c.Turn] = true
	}
	assert.Len(t, seen, n)
}

// ---------------------------------------------------------------------------
// Bad requests

func TestMalformedRequest(t *testing.T) {
	log := &syncbuf.Buffer{}
	f := start(t, faults.ModelConfig{Log: log})
	for _, b := range []string{
		``,
		`{`,
		`not json`,
		`[]`,
		`{"messages":"tc-u1"}`,
		`{"messages":[{"role":"user","content":42}]}`,
		`{"messages":[{"role":"user","content":{"text":"tc-u1"}}]}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text"}]}]}`,
		`{"messages":[{"role":"user","content":"tc-u1"}`,
	} {
		resp, got := f.send(http.MethodPost, "/v1/chat/completions", []byte(b))
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%q", b)
		assert.Equal(t, "invalid_request_error", errorBody(t, got).Type, "%q", b)
	}
	assert.Equal(t, 0, f.m.CallCount(), "malformed requests record nothing")
	assert.Empty(t, log.String(), "malformed requests log nothing")
}

// A body with data after the request object is not valid JSON either; the
// reference server refuses it (sut/server.go), the fake model should too.
func TestRequestWithTrailingData(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	for _, b := range []string{
		`{"messages":[{"role":"user","content":"tc-u1"}]} garbage`,
		`{"messages":[{"role":"user","content":"tc-u1"}]}{"messages":[]}`,
	} {
		resp, _ := f.send(http.MethodPost, "/v1/chat/completions", []byte(b))
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%q", b)
	}
	assert.Equal(t, 0, f.m.CallCount())
}

func TestMethodAndPath(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	for _, path := range []string{"/v1/chat/completions", "/chat/completions"} {
		for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
			resp, got := f.send(method, path, nil)
			assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s", method, path)
			assert.NotEmpty(t, errorBody(t, got).Message)
		}
	}
	for _, path := range []string{"/", "/v1/models", "/v1/completions", "/v1/chat/completions/", "/v2/chat/completions"} {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			resp, got := f.send(method, path, body(t, false, user("tc-u1")))
			assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s %s", method, path)
			assert.Equal(t, "not_found", errorBody(t, got).Type)
		}
	}
	assert.Equal(t, 0, f.m.CallCount())
}

// ---------------------------------------------------------------------------
// Log

func TestLogOneLinePerCall(t *testing.T) {
	log := &syncbuf.Buffer{}
	f := start(t, faults.ModelConfig{Log: log})
	f.m.Script("tc-u2", faults.Fault{Kind: faults.Status, Status: 503, RetryHint: true})

	f.post(false, user("tc-u1"))
	f.post(true, user("tc-u1"), msg(openai.RoleAssistant, "tc-a1"), user("tc-u2"))
	f.post(false, user("no token"))
	f.send(http.MethodGet, "/v1/chat/completions", nil) // not a call: no line
	f.send(http.MethodPost, "/nowhere", nil)            // not a call: no line

	out := log.String()
	require.True(t, strings.HasSuffix(out, "\n"))
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 3, "%s", out)
	assert.Contains(t, lines[0], "turn=tc-u1")
	assert.Contains(t, lines[0], "stream=false")
	assert.Contains(t, lines[1], "turn=tc-u2")
	assert.Contains(t, lines[1], "stream=true")
	assert.Contains(t, lines[1], "503")
	for _, tok := range []string{"tc-u1", "tc-a1", "tc-u2"} {
		assert.Contains(t, lines[1], tok)
	}
	assert.Contains(t, lines[2], "turn=-")
}

// Faults print what they inject, for the log and for reports.
func TestFaultString(t *testing.T) {
	cases := map[string]faults.Fault{
		"none":            {},
		"model-error 503": {Kind: faults.Status, Status: 503},
		"model-error 429 with Retry-After on the first 2 call(s)":      {Kind: faults.Status, Status: 429, RetryHint: true, Times: 2},
		"stream-cut after 3 chunk(s)":                                  {Kind: faults.Cut, After: 3},
		"malformed-chunk after 0 chunk(s)":                             {Kind: faults.Malformed},
		"model-error 503 after 1 tool round(s) on the first 2 call(s)": {Kind: faults.Status, Status: 503, Round: 1, Times: 2},
	}
	for want, f := range cases {
		assert.Equal(t, want, f.String())
	}
	assert.Contains(t, faults.Fault{Kind: faults.Hold}.String(), "model-timeout")
	assert.Equal(t, "Kind(99)", faults.Kind(99).String())
	assert.Equal(t, "stream-cut", faults.Cut.String())
}

// TestForgetDropsTheScript: after Forget, a turn's token is answered
// normally, so a server that replays an old message gets a reply rather
// than that turn's fault again.
func TestForgetDropsTheScript(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 503})
	resp, _ := f.post(false, user("tc-u1"))
	assert.Equal(t, 503, resp.StatusCode)
	f.m.Forget("tc-u1")
	resp, _ = f.post(false, user("tc-u1"))
	assert.Equal(t, 200, resp.StatusCode)
	f.m.Forget("tc-u9") // never scripted: nothing to do
}

// TestResetForgetsEverything: after Reset the model has no calls and no
// scripts, and a call held at a gate goes on, so that one model can serve
// check after check.
func TestResetForgetsEverything(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 503})
	resp, _ := f.post(false, user("tc-u1"))
	require.Equal(t, 503, resp.StatusCode)
	gate := f.m.Gate("tc-u2")
	held := make(chan int, 1)
	go func() {
		resp, _ := f.post(false, user("tc-u2"))
		held <- resp.StatusCode
	}()
	<-gate.Arrived()
	f.m.Reset("")
	assert.Equal(t, 200, <-held, "a held call goes on after Reset")
	assert.Zero(t, f.m.CallCount())
	resp, _ = f.post(false, user("tc-u1"))
	assert.Equal(t, 200, resp.StatusCode, "scripts are forgotten")
	assert.Equal(t, 1, f.m.CallCount())
}

// ---------------------------------------------------------------------------
// Agent definitions

// agentDef fetches path from the model and decodes the agent definition.
func (f *fixture) agentDef(path string) (int, faults.AgentDefinition) {
	f.t.Helper()
	resp, got := f.send(http.MethodGet, path, nil)
	var def faults.AgentDefinition
	if resp.StatusCode == http.StatusOK {
		assert.Contains(f.t, resp.Header.Get("Content-Type"), "yaml")
		dec := yaml.NewDecoder(bytes.NewReader(got))
		dec.KnownFields(true)
		require.NoError(f.t, dec.Decode(&def), "%s", got)
	}
	return resp.StatusCode, def
}

// TestServesAgentDefinitions: GET /agents/NAME.yaml, and the same under
// /v1, is a definition whose instruction echoes the raw query, so that a
// changed query shows in what the server sends the model. It is no call.
func TestServesAgentDefinitions(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	for _, tc := range []struct{ path, name, instruction string }{
		{"/agents/helper.yaml?tag=v1", "helper", "You are helper, loaded from /agents/helper.yaml?tag=v1."},
		{"/v1/agents/helper.yaml?tag=v2&x=1", "helper", "You are helper, loaded from /agents/helper.yaml?tag=v2&x=1."},
		{"/agents/Re_view-2.yaml", "Re_view-2", "You are Re_view-2, loaded from /agents/Re_view-2.yaml."},
		// YAML syntax in the query is quoted, not read; the fragment never
		// reaches the model.
		{`/agents/q.yaml?a="b":%20c#frag`, "q", `You are q, loaded from /agents/q.yaml?a="b":%20c.`},
	} {
		code, def := f.agentDef(tc.path)
		require.Equal(t, http.StatusOK, code, tc.path)
		assert.Equal(t, faults.AgentDefinition{Name: tc.name, Instruction: tc.instruction}, def, tc.path)
	}
	assert.Equal(t, 0, f.m.CallCount(), "an agent definition is not a model call")
}

// TestAgentNamesAreRestricted: a name outside [A-Za-z0-9_-]+ or another
// path is 404; a method other than GET is 405.
func TestAgentNamesAreRestricted(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	for _, path := range []string{"/agents/.yaml", "/agents/a.b.yaml", "/agents/a%20b.yaml", "/agents/a%2Fb.yaml",
		"/agents/helper.yml", "/agents/helper", "/v2/agents/helper.yaml", "/agents/sub/helper.yaml", "/x/agents/helper.yaml"} {
		code, _ := f.agentDef(path)
		assert.Equal(t, http.StatusNotFound, code, path)
	}
	resp, _ := f.send(http.MethodPost, "/agents/helper.yaml", nil)
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, http.MethodGet, resp.Header.Get("Allow"))
}

// TestResetEpoch: after Reset with an epoch, a call that does not carry it
// (a late call about an earlier check's conversation) is answered but
// neither recorded nor scripted; one that carries it is both.
func TestResetEpoch(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.Reset("ep-2")
	f.m.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 503})
	resp, got := f.post(false, user("tc-u1 from an earlier check (ep-1)"))
	require.Equal(t, http.StatusOK, resp.StatusCode, "not scripted: %s", got)
	assert.Contains(t, string(got), "tc-a1")
	assert.Zero(t, f.m.CallCount(), "not recorded")
	resp, _ = f.post(false, user("tc-u1 of this check (ep-2)"))
	assert.Equal(t, 503, resp.StatusCode)
	assert.Equal(t, 1, f.m.CallCount())
}

// TestForeignTokens: on a shared server, a call of this check that also
// carries a message of an earlier check's conversation (a server that
// leaks one into another) has that message's tokens, and its reply's, as
// Foreign, not as its history: tc-u6 of another check is never read as
// this check's tc-u6. The other check is named by its tag, so that its
// steps can be run again before this check's.
func TestForeignTokens(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	f.m.Reset("(tc0a1b2c-2)")
	resp, _ := f.post(false, user("tc-u6 (tc0a1b2c-1)"), msg(openai.RoleAssistant, "tc-a6 [call 3]"),
		user("tc-u1 (tc0a1b2c-2)"))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	calls := f.m.CallsAfter(0)
	require.Len(t, calls, 1)
	assert.Equal(t, []model.Token{"tc-u1"}, calls[0].History)
	assert.Equal(t, []model.Token{"tc-u6", "tc-a6"}, calls[0].Foreign)
	assert.Equal(t, []string{"(tc0a1b2c-1)"}, calls[0].ForeignFrom)
	assert.Equal(t, model.Token("tc-u1"), calls[0].Turn)
}

// waitFor waits until cond holds, at most guard: what it waits for is
// the model's own doing, which nothing announces.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for end := time.Now().Add(guard); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			require.FailNow(t, "timed out waiting for "+what)
		}
	}
}

// TestGateHoldsACallBesideTheTurns: a server may call the model for a
// title beside the turn's own call, with the same user message. Whichever
// arrives first takes the gate; the other arrives at the same point and
// is held with it, so nothing of the turn is answered before the release.
func TestGateHoldsACallBesideTheTurns(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	g := f.m.Gate("tc-u1")
	turn := f.goDo(context.Background(), body(t, true, user("tc-a0 tc-u1")))
	<-g.Arrived()
	title := f.goDo(context.Background(), body(t, false, user("title for: tc-u1")))
	// The second call of the turn is held beside the first: waited for
	// with no bound of its own (the test's is the bound), however slow
	// the machine; a model that answers it fails the select below first.
	for f.m.Holding() < 2 {
		select {
		case r := <-title:
			t.Fatalf("a call at a held point was answered before the release: %+v", r)
		case <-time.After(time.Millisecond):
		}
	}
	select {
	case r := <-title:
		t.Fatalf("a call at a held point was answered before the release: %+v", r)
	case r := <-turn:
		t.Fatalf("the gated call was answered before the release: %+v", r)
	default:
	}
	g.Release()
	assert.Equal(t, http.StatusOK, (<-turn).status)
	assert.Equal(t, http.StatusOK, (<-title).status)
	// Once released, the point holds nothing more.
	resp, _ := f.post(false, user("tc-u1"))
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestGatePassesKnownAuxiliaryCalls: a call whose instruction the
// harness knows to be a title call's (ModelConfig.Auxiliary) is never held
// at a gate, however early it comes: the gate holds the turn's own call,
// so that a client drawn to leave at the turn's first model call leaves
// at one of the turn's own. Once the client went away (Drop), it is held
// as every arrival of the turn is.
func TestGatePassesKnownAuxiliaryCalls(t *testing.T) {
	const titlePrompt = "Write a title."
	f := start(t, faults.ModelConfig{Auxiliary: func(p uint32) bool {
		h := fnv.New32a()
		_, _ = h.Write([]byte(titlePrompt))
		return p == h.Sum32()
	}})
	g := f.m.Gate("tc-u1")
	first := f.goDo(context.Background(), body(t, false, msg(openai.RoleSystem, titlePrompt), user("tc-u1")))
	select {
	case r := <-first:
		assert.Equal(t, http.StatusOK, r.status, "the title call is answered, not held")
	case <-g.Arrived():
		g.Release()
		t.Fatal("the gate took the title call")
	}
	turn := f.goDo(context.Background(), body(t, true, msg(openai.RoleSystem, "Be brief."), user("tc-u1")))
	<-g.Arrived()
	assert.Equal(t, 1, f.m.HoldingTurn("tc-u1"), "the turn's own call is held")
	f.m.Drop("tc-u1")
	title := f.goDo(context.Background(), body(t, false, msg(openai.RoleSystem, titlePrompt), user("tc-u1")))
	waitFor(t, func() bool { return f.m.HoldingTurn("tc-u1") == 2 }, "a title call after the drop held")
	g.Release()
	f.m.ReleaseDrop("tc-u1")
	assert.Equal(t, http.StatusOK, waitResult(t, turn).status)
	assert.Equal(t, http.StatusOK, waitResult(t, title).status)
}

// TestReplyNamesItsCall: each reply names the call it answers
// (model.CallMark of its arrival), so that the harness tells which call's
// reply reached the client; the mark is no token.
func TestReplyNamesItsCall(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	_, first := f.post(false, user("tc-u1"))
	streamed := f.goDo(context.Background(), body(t, true, user("tc-u1")))
	second := (<-streamed).body
	calls := f.m.CallsAfter(0)
	require.Len(t, calls, 2)
	require.NotEqual(t, calls[0].At, calls[1].At)
	assert.Contains(t, string(first), model.CallMark(calls[0].At))
	assert.NotContains(t, string(first), model.CallMark(calls[1].At))
	assert.Contains(t, string(second), model.CallMark(calls[1].At))
	var c openai.Completion
	require.NoError(t, json.Unmarshal(first, &c))
	assert.Equal(t, []model.Token{"tc-a1"}, model.Tokens(c.Text()))
}

// A call held while others arrive says so: Unanswered is the arrival of
// the latest call the model had seen when it began to answer it, so that
// a turn whose call came meanwhile ran while it was at the model.
func TestUnansweredWhileHeld(t *testing.T) {
	f := start(t, faults.ModelConfig{})
	g := f.m.Gate("tc-u1")
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.post(false, user("tc-u1"))
	}()
	<-g.Arrived()
	f.post(false, user("tc-u2"))
	f.post(false, user("tc-u3"))
	g.Release()
	<-done
	calls := f.m.CallsAfter(0)
	require.Len(t, calls, 3)
	assert.Equal(t, model.Token("tc-u1"), calls[0].Turn)
	assert.Equal(t, calls[2].At, calls[0].Unanswered, "held while tc-u2 and tc-u3 came")
	assert.Equal(t, calls[1].At, calls[1].Unanswered)
}
