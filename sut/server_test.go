package sut_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/sut"
)

// requestDeadline bounds every request a test sends: a server that hangs
// fails the test instead of stalling the package.
const requestDeadline = 10 * time.Second

// ---------------------------------------------------------------------------
// Harness: a fake model, a reference server in front of it, and a client.

// startModel starts a fake model that the test closes when it ends.
func startModel(t testing.TB) *faults.Model {
	t.Helper()
	m, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// server is a running reference server whose Close may be called early (to
// restart on the same data dir) and is called again, harmlessly, at cleanup.
type server struct {
	*sut.Running
	once sync.Once
	err  error
}

func (s *server) Close() error {
	s.once.Do(func() { s.err = s.Running.Close() })
	return s.err
}

// startServer starts a reference server in front of m. ModelURL and DataDir
// default to m's URL and a fresh temporary directory.
func startServer(t testing.TB, m *faults.Model, cfg sut.Config) *server {
	t.Helper()
	if cfg.ModelURL == "" {
		cfg.ModelURL = m.URL()
	}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	r, err := sut.Start(cfg, "")
	require.NoError(t, err)
	s := &server{Running: r}
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// newClient returns an HTTP client with its own transport, whose idle
// connections are closed when the test ends.
func newClient(t testing.TB) *http.Client {
	t.Helper()
	c := &http.Client{Timeout: requestDeadline, Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// env is one test's fake model, server and client.
type env struct {
	model  *faults.Model
	srv    *server
	client *http.Client
}

func newEnv(t testing.TB, cfg sut.Config) *env {
	t.Helper()
	m := startModel(t)
	s := startServer(t, m, cfg)
	return &env{model: m, srv: s, client: newClient(t)}
}

// reply is a response as the client read it.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// post sends body to the chat endpoint with the given headers
// ("Authorization" and the conversation header, typically).
func (e *env) post(t testing.TB, body string, hdr map[string]string) reply {
	t.Helper()
	return post(t, e.client, e.srv.URL(), body, hdr)
}

func post(t testing.TB, c *http.Client, base, body string, hdr map[string]string) reply {
	t.Helper()
	return postURL(t, c, base+"/v1/chat/completions", body, hdr)
}

// postURL sends body to url with the given headers and reads the whole
// answer.
func postURL(t testing.TB, c *http.Client, url, body string, hdr map[string]string) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	require.NoError(t, err, "the server must answer, not hang or drop the connection")
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	require.NoError(t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: buf.Bytes()}
}

// msg is a request message; content is any JSON value, so that tests can
// send null, numbers or arrays of parts.
type msg struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

func user(content any) msg      { return msg{Role: "user", Content: content} }
func assistant(content any) msg { return msg{Role: "assistant", Content: content} }

// chatBody encodes a chat request.
func chatBody(t testing.TB, stream bool, msgs ...msg) string {
	t.Helper()
	if msgs == nil {
		msgs = []msg{}
	}
	b, err := json.Marshal(map[string]any{"model": "turncheck-test", "messages": msgs, "stream": stream})
	require.NoError(t, err)
	return string(b)
}

// headers builds the request headers for conversation conv under key
// ("" for none of either).
func headers(key, conv string) map[string]string {
	h := map[string]string{}
	if conv != "" {
		h[sut.DefaultConversationHeader] = conv
	}
	if key != "" {
		h["Authorization"] = "Bearer " + key
	}
	return h
}

// turn sends the user message "<tok> ..." as a new turn of conv.
func (e *env) turn(t testing.TB, key, conv string, tok model.Token, stream bool) reply {
	t.Helper()
	return e.post(t, chatBody(t, stream, user(fmt.Sprintf("%s hello from the test", tok))), headers(key, conv))
}

// ok sends a non-stream turn that must succeed and returns the history the
// model was sent for it.
func (e *env) ok(t testing.TB, key, conv string, tok model.Token) []model.Token {
	t.Helper()
	n := e.model.CallCount()
	r := e.turn(t, key, conv, tok, false)
	require.Equal(t, http.StatusOK, r.status, "turn %s: %s", tok, r.body)
	requireCompletion(t, r, tok)
	return oneCall(t, e.model, n, tok)
}

// oneCall requires exactly one model call since the first n, for turn tok,
// and returns its history.
func oneCall(t testing.TB, m *faults.Model, n int, tok model.Token) []model.Token {
	t.Helper()
	calls := callsSince(m, n)
	require.Len(t, calls, 1, "want exactly one model call for %s", tok)
	require.Equal(t, tok, calls[0].Turn)
	return calls[0].History
}

// callsSince returns the model's calls after its first n. The fake model
// stamps calls 1, 2, 3... when it has no clock of its own, so the calls
// after stamp n are those after the first n.
func callsSince(m *faults.Model, n int) []model.Call {
	return m.CallsAfter(int64(n))
}

// toks builds a token sequence: toks("u1", "a1") is [tc-u1 tc-a1].
func toks(short ...string) []model.Token {
	out := make([]model.Token, len(short))
	for i, s := range short {
		out[i] = model.Token("tc-" + s)
	}
	return out
}

// requireErrorBody checks an OpenAI error response.
func requireErrorBody(t testing.TB, r reply, status int, typ string) {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	assert.Contains(t, r.header.Get("Content-Type"), "application/json")
	var eb struct {
		Error *struct {
			Message *string `json:"message"`
			Type    *string `json:"type"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(r.body, &eb), "error body must be JSON: %s", r.body)
	require.NotNil(t, eb.Error, "error body must carry an error object: %s", r.body)
	require.NotNil(t, eb.Error.Message, "error.message: %s", r.body)
	require.NotNil(t, eb.Error.Type, "error.type: %s", r.body)
	assert.NotEmpty(t, *eb.Error.Message)
	if typ != "" {
		assert.Equal(t, typ, *eb.Error.Type)
	} else {
		assert.NotEmpty(t, *eb.Error.Type)
	}
}

// requireCompletion checks a non-stream chat.completion carrying tok's reply.
func requireCompletion(t testing.TB, r reply, tok model.Token) {
	t.Helper()
	assert.Contains(t, r.header.Get("Content-Type"), "application/json")
	var c struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(r.body, &c), "body: %s", r.body)
	assert.Equal(t, "chat.completion", c.Object)
	require.Len(t, c.Choices, 1)
	assert.Equal(t, "assistant", c.Choices[0].Message.Role)
	assert.Equal(t, strings.Join(faults.ReplyChunks(tok), ""), model.WithoutCallMarks(c.Choices[0].Message.Content))
	require.NotNil(t, c.Choices[0].FinishReason)
	assert.Equal(t, "stop", *c.Choices[0].FinishReason)
}

// stream is an SSE response as the client read it.
type stream struct {
	chunks   []streamChunk
	done     bool // the last data line was [DONE]
	afterEnd int  // data lines after [DONE]
}

type streamChunk struct {
	Object  string `json:"object"`
	Choices []struct {
		Delta *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
	} `json:"error"`
}

func (s stream) text() string {
	var b strings.Builder
	for _, c := range s.chunks {
		for _, ch := range c.Choices {
			if ch.Delta != nil {
				b.WriteString(ch.Delta.Content)
			}
		}
	}
	return b.String()
}

func (s stream) errors() int {
	n := 0
	for _, c := range s.chunks {
		if c.Error != nil {
			n++
		}
	}
	return n
}

func (s stream) stopped() bool {
	for _, c := range s.chunks {
		for _, ch := range c.Choices {
			if ch.FinishReason != nil && *ch.FinishReason == "stop" {
				return true
			}
		}
	}
	return false
}

// parseStream reads an event stream: every data line must be a chunk JSON
// object or the [DONE] sentinel.
func parseStream(t testing.TB, r reply) stream {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Contains(t, r.header.Get("Content-Type"), "text/event-stream")
	var s stream
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		require.True(t, ok, "unexpected stream line %q", line)
		if s.done {
			s.afterEnd++
			continue
		}
		if data == "[DONE]" {
			s.done = true
			continue
		}
		var c streamChunk
		require.NoError(t, json.Unmarshal([]byte(data), &c), "chunk %q", data)
		s.chunks = append(s.chunks, c)
	}
	require.NoError(t, sc.Err())
	return s
}

// ---------------------------------------------------------------------------
// Bad input: 400 / 413 with an OpenAI error body, no model call, no change.

func TestBadInputIsRefusedBeforeAnyModelCall(t *testing.T) {
	e := newEnv(t, sut.Config{})
	// A committed turn first, so that every bad request below is also a
	// continuation of an existing conversation with a usable earlier user
	// message in its array.
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))

	u := user("tc-u5 an earlier, usable user message")
	cases := []struct {
		name string
		body string
	}{
		{"empty body", ``},
		{"malformed JSON", `{"messages":[{"role":"user","content":"tc-u5"}]`},
		{"not JSON", `tc-u5 hello`},
		{"JSON array", `[{"role":"user","content":"tc-u5"}]`},
		{"JSON string", `"tc-u5"`},
		{"JSON null", `null`},
		{"messages a string", `{"model":"m","messages":"tc-u5 hello"}`},
		{"messages an object", `{"model":"m","messages":{"role":"user","content":"tc-u5"}}`},
		{"message a string", `{"model":"m","messages":["tc-u5"]}`},
		{"content a number", `{"model":"m","messages":[{"role":"user","content":5}]}`},
		{"content an object", `{"model":"m","messages":[{"role":"user","content":{"text":"tc-u5"}}]}`},
		{"content an image part", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`},
		{"role a number", `{"model":"m","messages":[{"role":1,"content":"tc-u5"}]}`},
		{"stream a string", `{"model":"m","messages":[{"role":"user","content":"tc-u5"}],"stream":"yes"}`},
		{"model a number", `{"model":5,"messages":[{"role":"user","content":"tc-u5"}]}`},
		{"missing messages", `{"model":"m","stream":false}`},
		{"null messages", `{"model":"m","messages":null}`},
		{"empty object", `{}`},
		{"unknown role", `{"model":"m","messages":[{"role":"wizard","content":"tc-u5"}]}`},
		{"unknown role before a user", `{"model":"m","messages":[{"role":"developer","content":"x"},{"role":"user","content":"tc-u5"}]}`},
		{"missing role", `{"model":"m","messages":[{"content":"tc-u5"}]}`},
		{"role in capitals", `{"model":"m","messages":[{"role":"USER","content":"tc-u5"}]}`},
		{"trailing garbage", `{"model":"m","messages":[{"role":"user","content":"tc-u5"}]} garbage`},
		{"trailing second object", `{"model":"m","messages":[{"role":"user","content":"tc-u5"}]}{"model":"m"}`},
		{"trailing number", `{"model":"m","messages":[{"role":"user","content":"tc-u5"}]} 1`},
		{"empty messages", chatBody(t, false)},
		{"empty messages, stream", chatBody(t, true)},
		{"last assistant", chatBody(t, false, u, assistant("tc-a5 a reply"))},
		{"last system", chatBody(t, false, u, msg{Role: "system", Content: "be brief"})},
		{"last tool", chatBody(t, false, u, msg{Role: "tool", Content: "42"})},
		{"last assistant, stream", chatBody(t, true, u, assistant("tc-a5"))},
		{"only assistant", chatBody(t, false, assistant("tc-a5"))},
		{"blank last user", chatBody(t, false, u, user(""))},
		{"whitespace last user", chatBody(t, false, u, user(" \t\r\n "))},
		{"unicode whitespace last user", chatBody(t, false, u, user("\u00a0\u2003\u3000\u2028"))},
		{"null last user", chatBody(t, false, u, user(nil))},
		{"empty parts last user", chatBody(t, false, u, user([]any{}))},
		{"blank part last user", chatBody(t, false, u, user([]any{map[string]any{"type": "text", "text": "  "}}))},
		{"blank last user, stream", chatBody(t, true, u, user("   "))},
		{"only a blank user", chatBody(t, false, user("\n"))},
	}
	calls := e.model.CallCount()
	for _, tc := range cases {
		for _, conv := range []string{"c1", "c-new", ""} {
			t.Run(fmt.Sprintf("%s/conv=%q", tc.name, conv), func(t *testing.T) {
				r := e.post(t, tc.body, headers("", conv))
				requireErrorBody(t, r, http.StatusBadRequest, "invalid_request_error")
			})
		}
	}
	assert.Equal(t, calls, e.model.CallCount(), "no bad request may reach the model")
	for _, c := range callsSince(e.model, calls) {
		t.Logf("unexpected model call: turn %s history %s", c.Turn, model.FormatTokens(c.History))
	}

	// Nothing changed: the conversation goes on from its one committed turn,
	// and the conversation only named by bad requests is still empty.
	assert.Equal(t, toks("u1", "a1", "u2"), e.ok(t, "", "c1", "tc-u2"))
	assert.Equal(t, toks("u3"), e.ok(t, "", "c-new", "tc-u3"))
}

// TestTrailingJSONCloserIsRefused covers trailing data that starts with a
// closing bracket, which encoding/json's Decoder.More does not report.
func TestTrailingJSONCloserIsRefused(t *testing.T) {
	e := newEnv(t, sut.Config{})
	for i, trailer := range []string{"}", "]", "}}}", "] garbage"} {
		tok := model.UserToken(10 + i)
		t.Run(fmt.Sprintf("%q", trailer), func(t *testing.T) {
			n := e.model.CallCount()
			body := chatBody(t, false, user(string(tok))) + trailer
			r := e.post(t, body, headers("", "c-trailer"))
			requireErrorBody(t, r, http.StatusBadRequest, "invalid_request_error")
			assert.Equal(t, n, e.model.CallCount())
		})
	}
}

func TestBodyOverTheLimitIs413(t *testing.T) {
	const limit = 512
	e := newEnv(t, sut.Config{MaxBodyBytes: limit})
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	calls := e.model.CallCount()

	big := chatBody(t, false, user("tc-u2 "+strings.Repeat("x", 4*limit)))
	for _, conv := range []string{"c1", ""} {
		for _, stream := range []bool{false, true} {
			body := big
			if stream {
				body = chatBody(t, true, user("tc-u2 "+strings.Repeat("x", 4*limit)))
			}
			r := e.post(t, body, headers("", conv))
			requireErrorBody(t, r, http.StatusRequestEntityTooLarge, "")
		}
	}
	// Just over the limit, and just at it: the limit is exact.
	pad := func(n int) string {
		base := chatBody(t, false, user("tc-u3 "))
		return chatBody(t, false, user("tc-u3 "+strings.Repeat("y", n-len(base))))
	}
	r := e.post(t, pad(limit+1), headers("", "c1"))
	requireErrorBody(t, r, http.StatusRequestEntityTooLarge, "")
	assert.Equal(t, calls, e.model.CallCount(), "an oversized body must not reach the model")

	body := pad(limit)
	require.Len(t, body, limit)
	n := e.model.CallCount()
	r = e.post(t, body, headers("", "c1"))
	require.Equal(t, http.StatusOK, r.status, "a body of exactly the limit is fine: %s", r.body)
	assert.Equal(t, toks("u1", "a1", "u3"), oneCall(t, e.model, n, "tc-u3"))
}

func TestOtherRefusals(t *testing.T) {
	e := newEnv(t, sut.Config{})
	good := chatBody(t, false, user("tc-u1"))

	t.Run("conversation id too long", func(t *testing.T) {
		r := e.post(t, good, headers("", strings.Repeat("c", 257)))
		requireErrorBody(t, r, http.StatusBadRequest, "invalid_request_error")
	})
	t.Run("conversation id with a tab", func(t *testing.T) {
		r := e.post(t, good, headers("", "c\t1"))
		requireErrorBody(t, r, http.StatusBadRequest, "invalid_request_error")
	})
	t.Run("GET", func(t *testing.T) {
		resp, err := e.client.Get(e.srv.URL() + "/v1/chat/completions")
		require.NoError(t, err)
		defer resp.Body.Close()
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		requireErrorBody(t, reply{resp.StatusCode, resp.Header, buf.Bytes()}, http.StatusMethodNotAllowed, "")
	})
	t.Run("unknown path", func(t *testing.T) {
		r := post(t, e.client, e.srv.URL()+"/nope", good, nil)
		requireErrorBody(t, r, http.StatusNotFound, "not_found")
	})
	assert.Zero(t, e.model.CallCount())

	// The longest id allowed works.
	assert.Equal(t, toks("u2"), e.ok(t, "", strings.Repeat("c", 256), "tc-u2"))
}

// ---------------------------------------------------------------------------
// Auth and per-key scoping.

func TestAuth(t *testing.T) {
	e := newEnv(t, sut.Config{Keys: []string{"key-a", "key-b"}})
	body := chatBody(t, false, user("tc-u9"))
	for name, hdr := range map[string]map[string]string{
		"no key":        {sut.DefaultConversationHeader: "c1"},
		"wrong key":     headers("key-c", "c1"),
		"prefix of key": headers("key-", "c1"),
		"key extended":  headers("key-aa", "c1"),
		"no Bearer":     {sut.DefaultConversationHeader: "c1", "Authorization": "key-a"},
		"Basic":         {sut.DefaultConversationHeader: "c1", "Authorization": "Basic a2V5LWE6"},
		"empty bearer":  {sut.DefaultConversationHeader: "c1", "Authorization": "Bearer "},
		"stateless":     {"Authorization": "Bearer nope"},
	} {
		t.Run(name, func(t *testing.T) {
			r := e.post(t, body, hdr)
			requireErrorBody(t, r, http.StatusUnauthorized, "unauthorized")
		})
	}
	// A bad key is refused before the body is even judged.
	r := e.post(t, `{not json`, headers("key-c", "c1"))
	requireErrorBody(t, r, http.StatusUnauthorized, "unauthorized")
	require.Zero(t, e.model.CallCount(), "an unauthorized request must not reach the model")

	// Conversations are scoped per key: the same id is two conversations.
	assert.Equal(t, toks("u1"), e.ok(t, "key-a", "c1", "tc-u1"))
	assert.Equal(t, toks("u1", "a1", "u2"), e.ok(t, "key-a", "c1", "tc-u2"))
	assert.Equal(t, toks("u3"), e.ok(t, "key-b", "c1", "tc-u3"), "key B's c1 must carry none of key A's tokens")
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u4"), e.ok(t, "key-a", "c1", "tc-u4"))
	assert.Equal(t, toks("u3", "a3", "u5"), e.ok(t, "key-b", "c1", "tc-u5"))
	// An unauthorized turn on c1 changed nothing.
	r = e.post(t, chatBody(t, false, user("tc-u6")), headers("key-c", "c1"))
	requireErrorBody(t, r, http.StatusUnauthorized, "unauthorized")
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u4", "a4", "u7"), e.ok(t, "key-a", "c1", "tc-u7"))
}

// ---------------------------------------------------------------------------
// Transactional turns: a failed turn leaves nothing behind.

func TestFailedModelCallIsNotCommitted(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			e := newEnv(t, sut.Config{})
			require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))

			for _, status := range []int{500, 502, 503, 429} {
				e.model.Script("tc-u2", faults.Fault{Kind: faults.Status, Status: status})
				n := e.model.CallCount()
				r := e.turn(t, "", "c1", "tc-u2", stream)
				// The model failed before any reply: a status, even when
				// the client asked for a stream.
				requireErrorBody(t, r, http.StatusBadGateway, "upstream_error")
				assert.Equal(t, toks("u1", "a1", "u2"), oneCall(t, e.model, n, "tc-u2"),
					"each attempt of the failed turn sees the committed history")
			}

			// The next turn sees exactly the committed history.
			assert.Equal(t, toks("u1", "a1", "u3"), e.ok(t, "", "c1", "tc-u3"))
			// A retry of the failed turn, now answered, is not duplicated.
			e.model.Script("tc-u2", faults.Fault{})
			assert.Equal(t, toks("u1", "a1", "u3", "a3", "u2"), e.ok(t, "", "c1", "tc-u2"))
			assert.Equal(t, toks("u1", "a1", "u3", "a3", "u2", "a2", "u4"), e.ok(t, "", "c1", "tc-u4"))
		})
	}
}

func TestFailedFirstTurnLeavesNoConversation(t *testing.T) {
	e := newEnv(t, sut.Config{})
	e.model.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 500})
	r := e.turn(t, "", "c1", "tc-u1", false)
	requireErrorBody(t, r, http.StatusBadGateway, "upstream_error")
	assert.Equal(t, toks("u2"), e.ok(t, "", "c1", "tc-u2"))
}

func TestBrokenStreamIsNotCommitted(t *testing.T) {
	n := len(faults.ReplyChunks("tc-u0"))
	for _, f := range []faults.Fault{
		{Kind: faults.Cut, After: 0},
		{Kind: faults.Cut, After: 1},
		{Kind: faults.Cut, After: n}, // the whole text, then no end
		{Kind: faults.Malformed, After: 0},
		{Kind: faults.Malformed, After: 2},
	} {
		t.Run(f.String(), func(t *testing.T) {
			e := newEnv(t, sut.Config{})
			require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))

			// Streamed: the client has its 200 already, so the failure is
			// an error chunk.
			e.model.Script("tc-u2", f)
			calls := e.model.CallCount()
			s := parseStream(t, e.turn(t, "", "c1", "tc-u2", true))
			assert.Equal(t, 1, s.errors(), "want one error chunk")
			assert.False(t, s.stopped(), "a failed stream must not finish with stop")
			assert.Equal(t, toks("u1", "a1", "u2"), oneCall(t, e.model, calls, "tc-u2"))
			want := strings.Join(faults.ReplyChunks("tc-u2")[:min(f.After, n)], "")
			assert.Equal(t, want, model.WithoutCallMarks(s.text()), "the client sees what the model sent before it broke")
			for _, c := range s.chunks {
				if c.Error != nil {
					assert.NotEmpty(t, c.Error.Message)
					assert.Equal(t, "upstream_error", c.Error.Type)
				}
			}

			// Not streamed: a plain 502.
			e.model.Script("tc-u3", f)
			r := e.turn(t, "", "c1", "tc-u3", false)
			requireErrorBody(t, r, http.StatusBadGateway, "upstream_error")

			// Neither turn, nor any partial reply, was committed.
			assert.Equal(t, toks("u1", "a1", "u4"), e.ok(t, "", "c1", "tc-u4"))
		})
	}
}

func TestModelTimeoutIs504AndNotCommitted(t *testing.T) {
	t.Parallel()
	// Small enough to keep the test fast, large enough for a loopback turn
	// under -race on a small machine.
	e := newEnv(t, sut.Config{RequestTimeout: 200 * time.Millisecond})
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))

	for _, stream := range []bool{false, true} {
		e.model.Script("tc-u2", faults.Fault{Kind: faults.Hold})
		n := e.model.CallCount()
		start := time.Now()
		r := e.turn(t, "", "c1", "tc-u2", stream)
		requireErrorBody(t, r, http.StatusGatewayTimeout, "upstream_timeout")
		assert.Less(t, time.Since(start), 5*time.Second, "the timeout must end the turn")
		assert.Equal(t, toks("u1", "a1", "u2"), oneCall(t, e.model, n, "tc-u2"))
	}
	assert.Equal(t, toks("u1", "a1", "u3"), e.ok(t, "", "c1", "tc-u3"))
}

// ---------------------------------------------------------------------------
// Success paths.

func TestStreamSuccess(t *testing.T) {
	e := newEnv(t, sut.Config{})
	n := e.model.CallCount()
	r := e.turn(t, "", "c1", "tc-u1", true)
	s := parseStream(t, r)
	assert.Equal(t, toks("u1"), oneCall(t, e.model, n, "tc-u1"))
	assert.True(t, s.done, "the stream must end with data: [DONE]")
	assert.Zero(t, s.afterEnd, "nothing after [DONE]")
	assert.Zero(t, s.errors())
	assert.True(t, s.stopped(), "a chunk must carry finish_reason stop")
	assert.Greater(t, len(s.chunks), 2)
	for _, c := range s.chunks {
		assert.Equal(t, "chat.completion.chunk", c.Object)
	}
	// The finish chunk is the last one.
	last := s.chunks[len(s.chunks)-1]
	require.Len(t, last.Choices, 1)
	require.NotNil(t, last.Choices[0].FinishReason)
	assert.Equal(t, "stop", *last.Choices[0].FinishReason)
	assert.Equal(t, strings.Join(faults.ReplyChunks("tc-u1"), ""), model.WithoutCallMarks(s.text()))
	assert.True(t, strings.HasSuffix(string(r.body), "data: [DONE]\n\n"), "body ends %q", r.body[max(0, len(r.body)-40):])

	// The streamed turn was committed.
	assert.Equal(t, toks("u1", "a1", "u2"), e.ok(t, "", "c1", "tc-u2"))
}

func TestStatelessTurnUsesTheWholeArrayAndKeepsNothing(t *testing.T) {
	e := newEnv(t, sut.Config{})
	n := e.model.CallCount()
	body := chatBody(t, false, user("tc-u1"), assistant("tc-a1"), user("tc-u2"))
	r := e.post(t, body, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	requireCompletion(t, r, "tc-u2")
	assert.Equal(t, toks("u1", "a1", "u2"), oneCall(t, e.model, n, "tc-u2"))
	// Content as text parts is accepted.
	n = e.model.CallCount()
	r = e.post(t, chatBody(t, false, user([]any{map[string]any{"type": "text", "text": "tc-u3 "}, map[string]any{"type": "text", "text": "parts"}})), nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, toks("u3"), oneCall(t, e.model, n, "tc-u3"))
}

func TestConcurrentTurnsOnOneConversationAreSerialized(t *testing.T) {
	e := newEnv(t, sut.Config{})
	const k = 6
	var wg sync.WaitGroup
	statuses := make([]int, k)
	for i := range k {
		wg.Go(func() {
			body := chatBody(t, false, user(string(model.UserToken(i+1))))
			ctx, cancel := context.WithTimeout(context.Background(), requestDeadline)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL()+"/v1/chat/completions", strings.NewReader(body))
			if !assert.NoError(t, err) {
				return
			}
			req.Header.Set(sut.DefaultConversationHeader, "c1")
			resp, err := e.client.Do(req)
			if !assert.NoError(t, err) {
				return
			}
			_, _ = new(bytes.Buffer).ReadFrom(resp.Body)
			_ = resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	wg.Wait()
	for i, s := range statuses {
		assert.Equal(t, http.StatusOK, s, "turn %d", i+1)
	}
	// The calls form one chain: each extends the one before by one whole turn.
	calls := callsSince(e.model, 0)
	require.Len(t, calls, k)
	var line []model.Token
	for _, c := range calls {
		want := append(append([]model.Token(nil), line...), c.Turn)
		require.Equal(t, want, c.History, "histories must form one line")
		line = append(want, c.Turn.Reply())
	}
	final := e.ok(t, "", "c1", "tc-u99")
	assert.Equal(t, append(line, "tc-u99"), final)
}

// ---------------------------------------------------------------------------
// Durability and eviction.

func TestCommittedTurnsSurviveRestart(t *testing.T) {
	m := startModel(t)
	c := newClient(t)
	dir := t.TempDir()
	cfg := sut.Config{DataDir: dir, Keys: []string{"key-a"}}

	s1 := startServer(t, m, cfg)
	e1 := &env{model: m, srv: s1, client: c}
	require.Equal(t, toks("u1"), e1.ok(t, "key-a", "c1", "tc-u1"))
	require.Equal(t, toks("u1", "a1", "u2"), e1.ok(t, "key-a", "c1", "tc-u2"))
	// A failed and a streamed turn, too.
	m.Script("tc-u3", faults.Fault{Kind: faults.Status, Status: 500})
	requireErrorBody(t, e1.turn(t, "key-a", "c1", "tc-u3", false), http.StatusBadGateway, "upstream_error")
	s := parseStream(t, e1.turn(t, "key-a", "c1", "tc-u4", true))
	require.True(t, s.done && s.stopped() && s.errors() == 0)
	require.NoError(t, s1.Close())
	c.CloseIdleConnections()

	s2 := startServer(t, m, cfg)
	e2 := &env{model: m, srv: s2, client: c}
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u4", "a4", "u5"), e2.ok(t, "key-a", "c1", "tc-u5"))
	require.NoError(t, s2.Close())
	c.CloseIdleConnections()

	// And once more, so that a turn committed after a restart also stays.
	s3 := startServer(t, m, cfg)
	e3 := &env{model: m, srv: s3, client: c}
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u4", "a4", "u5", "a5", "u6"), e3.ok(t, "key-a", "c1", "tc-u6"))
}

func TestEvictionKeepsHistoriesWhole(t *testing.T) {
	e := newEnv(t, sut.Config{ConversationsMax: 1})
	want := map[string][]model.Token{}
	next := 1
	for round := range 4 {
		for _, conv := range []string{"c1", "c2", "c3"} {
			tok := model.UserToken(next)
			next++
			expect := append(append([]model.Token(nil), want[conv]...), tok)
			got := e.ok(t, "", conv, tok)
			require.Equal(t, expect, got, "round %d, conversation %s", round, conv)
			want[conv] = append(expect, tok.Reply())
		}
	}
	// A failed turn on an evicted conversation changes nothing either.
	e.model.Script("tc-u50", faults.Fault{Kind: faults.Status, Status: 500})
	requireErrorBody(t, e.turn(t, "", "c1", "tc-u50", false), http.StatusBadGateway, "upstream_error")
	e.ok(t, "", "c2", "tc-u51")
	assert.Equal(t, append(want["c1"], "tc-u52"), e.ok(t, "", "c1", "tc-u52"))
}

// ---------------------------------------------------------------------------
// Mutants: each bug in the catalogue shows at the server level, and the
// clean server does not have it.

type mutantCase struct {
	mutant sut.Mutant
	keys   []string
	// run drives the server and reports whether the bug showed.
	run func(t *testing.T, e *env) bool
}

var mutantCases = []mutantCase{
	{
		// docker-agent's serve api, sent an empty list: the session runs
		// as it is, and its last user message is the newest again.
		mutant: sut.SessionEmptyRuns,
		run: func(t *testing.T, e *env) bool {
			s := e.newSession(t, "")
			require.Equal(t, toks("u1"), e.okSession(t, "", s, "root", "tc-u1"))
			n := e.model.CallCount()
			r := postURL(t, e.client, e.srv.URL()+"/api/sessions/"+s+"/agent/root", `[]`, nil)
			if r.status == http.StatusBadRequest {
				require.Equal(t, n, e.model.CallCount(), "a refused turn reaches no model")
				return false
			}
			_, last := sessionStream(t, r)
			require.Equal(t, "stream_stopped", last.Type, "%+v", last)
			calls := e.model.CallsAfter(0)[n:]
			require.Len(t, calls, 1)
			assert.Equal(t, toks("u1", "a1"), calls[0].History, "the session as it stands")
			return true
		},
	},
	{
		mutant: sut.MutateBeforeRun,
		run: func(t *testing.T, e *env) bool {
			require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
			e.model.Script("tc-u2", faults.Fault{Kind: faults.Status, Status: 500})
			requireErrorBody(t, e.turn(t, "", "c1", "tc-u2", false), http.StatusBadGateway, "upstream_error")
			got := e.ok(t, "", "c1", "tc-u3")
			if assert.ObjectsAreEqual(toks("u1", "a1", "u3"), got) {
				return false
			}
			// The failed turn's user message stayed in the history.
			assert.Equal(t, toks("u1", "a1", "u2", "u3"), got)
			return true
		},
	},
	{
		mutant: sut.ReplayWithoutUser,
		run: func(t *testing.T, e *env) bool {
			require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
			n := e.model.CallCount()
			r := e.post(t, chatBody(t, false, user("tc-u1"), assistant("tc-a1")), headers("", "c1"))
			if r.status == http.StatusBadRequest {
				requireErrorBody(t, r, http.StatusBadRequest, "invalid_request_error")
				assert.Equal(t, n, e.model.CallCount())
				return false
			}
			// The earlier user message was replayed as a new turn.
			require.Equal(t, http.StatusOK, r.status, "%s", r.body)
			assert.Equal(t, toks("u1", "a1", "u1"), oneCall(t, e.model, n, "tc-u1"))
			return true
		},
	},
	{
		mutant: sut.CommitOnStreamError,
		run: func(t *testing.T, e *env) bool {
			require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
			e.model.Script("tc-u2", faults.Fault{Kind: faults.Cut, After: 1})
			s := parseStream(t, e.turn(t, "", "c1", "tc-u2", true))
			require.Equal(t, 1, s.errors(), "the client is told the turn failed")
			got := e.ok(t, "", "c1", "tc-u3")
			if assert.ObjectsAreEqual(toks("u1", "a1", "u3"), got) {
				return false
			}
			// The failed turn and its partial reply were committed.
			assert.Equal(t, toks("u1", "a1", "u2", "a2", "u3"), got)
			return true
		},
	},
	{
		mutant: sut.CrossKeyLeak,
		keys:   []string{"key-a", "key-b"},
		run: func(t *testing.T, e *env) bool {
			require.Equal(t, toks("u1"), e.ok(t, "key-a", "c1", "tc-u1"))
			got := e.ok(t, "key-b", "c1", "tc-u2")
			if assert.ObjectsAreEqual(toks("u2"), got) {
				return false
			}
			// Key B continued key A's conversation.
			assert.Equal(t, toks("u1", "a1", "u2"), got)
			return true
		},
	},
	{
		mutant: sut.FailedResponseChainable,
		run:    func(t *testing.T, e *env) bool { return failedResponseChains(t, e, true) },
	},
	{
		mutant: sut.ResponseCrossKey,
		keys:   []string{"key-a", "key-b"},
		run:    responseCrossKeyChains,
	},
	{
		mutant: sut.BranchMutatesBase,
		run:    branchesMeetEitherWay,
	},
	{
		mutant: sut.ReplayOnToolOutput,
		run: func(t *testing.T, e *env) bool {
			base, _ := e.okResponse(t, respReq{tok: "tc-u1"})
			n := e.model.CallCount()
			tool := []any{
				map[string]any{"type": "function_call", "call_id": "call_1", "name": "clock", "arguments": "{}"},
				map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "noon"},
			}
			decodeResponse(t, e.respond(t, respReq{input: tool, previous: base.ID}))
			calls := callsSince(e.model, n)
			require.Len(t, calls, 1)
			// The last user message of the history ran again as new.
			return assert.ObjectsAreEqual(toks("u1", "a1", "u1"), calls[0].History)
		},
	},
	{
		mutant: sut.StoreFalseKept,
		run: func(t *testing.T, e *env) bool {
			unstored, _ := e.okResponse(t, respReq{tok: "tc-u1", noStore: true})
			r := e.respond(t, respReq{tok: "tc-u2", previous: unstored.ID})
			if r.status == http.StatusNotFound {
				requireErrorBody(t, r, http.StatusNotFound, "invalid_request_error")
				return false
			}
			// The response not stored was a base.
			requireResponse(t, decodeResponse(t, r), "tc-u2", unstored.ID)
			return true
		},
	},
}

func TestMutantsBite(t *testing.T) {
	covered := map[sut.Mutant]bool{}
	for _, mc := range mutantCases {
		covered[mc.mutant] = true
		t.Run(string(mc.mutant), func(t *testing.T) {
			t.Run("mutant", func(t *testing.T) {
				e := newEnv(t, sut.Config{Mutant: mc.mutant, Keys: mc.keys})
				assert.True(t, mc.run(t, e), "the mutant's bug must show")
			})
			t.Run("clean", func(t *testing.T) {
				e := newEnv(t, sut.Config{Keys: mc.keys})
				assert.False(t, mc.run(t, e), "the clean server must not have the bug")
			})
		})
	}
	for _, m := range raceMutants {
		covered[m] = true // shown by the race tests in concurrency_test.go
	}
	for _, rc := range restartCases {
		covered[rc.mutant] = true // shown by TestRestartMutantsBite in crash_test.go
	}
	for _, m := range toolMutants {
		covered[m] = true // shown by the tool tests (interruption_test.go, compaction_test.go)
	}
	for _, rc := range replicaOnlyMutantCases {
		covered[rc.mutant] = true // shown on replicas by TestReplicaOnlyMutantsBite
	}
	for _, mc := range acpMutantCases {
		covered[mc.mutant] = true // shown over ACP by TestACPMutantsBite
	}
	for _, mc := range a2aMutantCases {
		covered[mc.mutant] = true // shown over A2A by TestA2AMutantsBite
	}
	for _, info := range sut.Mutants() {
		assert.True(t, covered[info.Mutant], "mutant %s has no server-level test", info.Mutant)
	}
}

// ---------------------------------------------------------------------------
// Configuration errors.

func TestNewRefusesBadConfig(t *testing.T) {
	m := startModel(t)
	tmp := t.TempDir()
	file := filepath.Join(tmp, "a-file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))

	for name, cfg := range map[string]sut.Config{
		"missing model URL":       {DataDir: t.TempDir()},
		"model URL without http":  {ModelURL: "127.0.0.1:1/v1", DataDir: t.TempDir()},
		"missing data dir":        {ModelURL: m.URL()},
		"data dir under a file":   {ModelURL: m.URL(), DataDir: filepath.Join(file, "data")},
		"data dir is a file":      {ModelURL: m.URL(), DataDir: file},
		"negative cache size":     {ModelURL: m.URL(), DataDir: t.TempDir(), ConversationsMax: -1},
		"negative timeout":        {ModelURL: m.URL(), DataDir: t.TempDir(), RequestTimeout: -time.Second},
		"empty key":               {ModelURL: m.URL(), DataDir: t.TempDir(), Keys: []string{"k", ""}},
		"unknown mutant":          {ModelURL: m.URL(), DataDir: t.TempDir(), Mutant: "no-such-mutant"},
		"unknown concurrency":     {ModelURL: m.URL(), DataDir: t.TempDir(), Concurrency: "queue"},
		"unknown interruption":    {ModelURL: m.URL(), DataDir: t.TempDir(), Interruption: "keep"},
		"negative compact after":  {ModelURL: m.URL(), DataDir: t.TempDir(), CompactAfter: -1},
		"store path is directory": {ModelURL: m.URL(), DataDir: dirWithStoreDir(t)},
	} {
		t.Run(name, func(t *testing.T) {
			var s *sut.Server
			var err error
			require.NotPanics(t, func() { s, err = sut.New(cfg) })
			if s != nil {
				_ = s.Close()
			}
			require.Error(t, err)
			assert.Nil(t, s)
			// Start fails the same way.
			var r *sut.Running
			require.NotPanics(t, func() { r, err = sut.Start(cfg, "") })
			if r != nil {
				_ = r.Close()
			}
			assert.Error(t, err)
		})
	}

	t.Run("address in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		r, err := sut.Start(sut.Config{ModelURL: m.URL(), DataDir: t.TempDir()}, ln.Addr().String())
		if r != nil {
			_ = r.Close()
		}
		assert.Error(t, err)
	})

	t.Run("good config", func(t *testing.T) {
		s, err := sut.New(sut.Config{ModelURL: m.URL(), DataDir: filepath.Join(t.TempDir(), "new", "nested")})
		require.NoError(t, err)
		require.NoError(t, s.Close())
	})
}

// dirWithStoreDir returns a data dir whose store file's path is taken by a
// directory, so that the store cannot be opened.
func dirWithStoreDir(t *testing.T) string {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "conversations.db"), 0o755))
	return dir
}

// TestBearerSchemeIsCaseInsensitive: RFC 9110 makes the auth scheme name
// case-insensitive; the key itself is compared exactly.
func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	e := newEnv(t, sut.Config{Keys: []string{"key-a"}})
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		r := e.post(t, chatBody(t, false, user("hello tc-u1")), map[string]string{"Authorization": scheme + " key-a"})
		assert.Equal(t, http.StatusOK, r.status, "scheme %q: %s", scheme, r.body)
	}
	r := e.post(t, chatBody(t, false, user("hello tc-u2")), map[string]string{"Authorization": "Bearer KEY-A"})
	assert.Equal(t, http.StatusUnauthorized, r.status)
}

// TestManualDeadlines: under ManualDeadlines a held model call times out
// exactly when Expire is called, never on its own, and the turn is a 504
// that commits nothing.
func TestManualDeadlines(t *testing.T) {
	deadlines := &sut.ManualDeadlines{}
	e := newEnv(t, sut.Config{Deadlines: deadlines, RequestTimeout: time.Nanosecond})
	// A nanosecond of clock time would fail every turn; manual deadlines
	// ignore it.
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	assert.Zero(t, deadlines.Expire(), "no model call in flight")

	for _, stream := range []bool{false, true} {
		arrived := e.model.Script("tc-u2", faults.Fault{Kind: faults.Hold})
		go func() {
			<-arrived
			deadlines.Expire()
		}()
		r := e.turn(t, "", "c1", "tc-u2", stream)
		requireErrorBody(t, r, http.StatusGatewayTimeout, "upstream_timeout")
	}
	assert.Equal(t, toks("u1", "a1", "u3"), e.ok(t, "", "c1", "tc-u3"))
}

func TestManualDeadlinesCause(t *testing.T) {
	var d sut.ManualDeadlines
	ctx, cancel := d.WithTimeout(context.Background(), time.Hour)
	gone, cancelGone := d.WithTimeout(context.Background(), time.Hour)
	cancelGone()
	assert.Equal(t, 1, d.Expire(), "a cancelled deadline is no longer pending")
	<-ctx.Done()
	assert.ErrorIs(t, context.Cause(ctx), context.DeadlineExceeded)
	assert.ErrorIs(t, context.Cause(gone), context.Canceled)
	cancel()
	assert.ErrorIs(t, context.Cause(ctx), context.DeadlineExceeded, "cancel after expiry keeps the cause")
}

// TestDataDirWithURIMetacharacters: a data dir whose name holds characters
// that mean something in a URI is still the dir the store lives in, with
// its journal mode, and two such dirs are two stores.
func TestDataDirWithURIMetacharacters(t *testing.T) {
	base := t.TempDir()
	for _, name := range []string{"a?b", "a#b", "a%20b", "a b"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(base, name)
			cfg := sut.Config{DataDir: dir}
			e := newEnv(t, cfg)
			require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
			_, err := os.Stat(filepath.Join(dir, "conversations.db"))
			require.NoError(t, err, "the store is not in %s", dir)
			_, err = os.Stat(filepath.Join(dir, "conversations.db-wal"))
			assert.NoError(t, err, "the store is not in WAL mode")
		})
	}
	// "a" was never named: nothing may have been written there.
	_, err := os.Stat(filepath.Join(base, "a"))
	assert.True(t, os.IsNotExist(err), "a store leaked into %s", filepath.Join(base, "a"))
}

// TestHalfClosedClientIsNotToldSuccess: a client that half-closes its
// connection mid-turn makes the server roll the turn back; if it still
// reads, it must get an error status, never an empty 200.
func TestHalfClosedClientIsNotToldSuccess(t *testing.T) {
	e := newEnv(t, sut.Config{})
	arrived := e.model.Script("tc-u1", faults.Fault{Kind: faults.Hold})
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL(), "http://"))
	require.NoError(t, err)
	defer conn.Close()
	body := chatBody(t, false, user("hello tc-u1"))
	_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"+
		"X-Conversation-Id: c1\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	<-arrived
	require.NoError(t, conn.(*net.TCPConn).CloseWrite())
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(requestDeadline)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.GreaterOrEqual(t, resp.StatusCode, 400, "a rolled-back turn answered %d", resp.StatusCode)
	// Nothing was committed.
	assert.Equal(t, toks("u2"), e.ok(t, "", "c1", "tc-u2"))
}
