package sut_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Harness: a fake model that asks for tool calls by script and serves the
// lookup tool, and a reference server in front of it.

// toolModel is a fake model provider. A turn's script says, round by
// round, what the model answers: tool calls, a failure, or a held call;
// past its script, or with none, the model gives the final reply. It also
// serves GET /v1/tools/lookup, and records every request of either kind.
type toolModel struct {
	srv *httptest.Server

	mu       sync.Mutex
	scripts  map[string][]toolStep // by the turn's user token
	requests []toolRequest
	lookups  []string          // the keys of the lookups, in arrival order
	holds    map[string]*held  // lookups to hold, by key
	all      []*held           // every hold, to open at cleanup
	arrivals map[string]*held  // lookups to signal, by key, not held
	bodies   map[string]string // lookup answers other than the default
}

// toolStep is the model's answer in one round of a turn.
type toolStep struct {
	calls []openai.ToolCall // ask for these tool calls
	fail  bool              // answer 500
	hold  *held             // hold the call, then answer as above
}

// toolRequest is one model request as the fake model read it.
type toolRequest struct {
	turn     string // the last user message's token
	round    int    // the tool rounds of the turn it carried
	messages []openai.Message
	tools    []string // the names of the tools offered
}

// held is a call (to the model, or a lookup) held where it arrives.
type held struct {
	arrived chan struct{} // closed when the call has arrived
	release chan struct{} // closed to let it go on
	gone    chan struct{} // closed if the server gave up on it while held
	once    sync.Once
}

func newHeld() *held {
	return &held{arrived: make(chan struct{}), release: make(chan struct{}), gone: make(chan struct{})}
}

// open lets the held call go on; it may come before the call does.
func (h *held) open() { h.once.Do(func() { close(h.release) }) }

// wait holds the call of r until it is released (true) or the server gives
// up on it (false).
func (h *held) wait(r *http.Request) bool {
	close(h.arrived)
	select {
	case <-h.release:
		return true
	case <-r.Context().Done():
		close(h.gone)
		return false
	}
}

// await waits for a channel of a held call, failing the test if it never
// closes.
func await(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(requestDeadline):
		require.FailNow(t, "timed out", "waiting for %s", what)
	}
}

var userTokenRE = regexp.MustCompile(`tc-u[0-9]+`)

func startToolModel(t testing.TB) *toolModel {
	t.Helper()
	m := &toolModel{scripts: map[string][]toolStep{}, holds: map[string]*held{}, arrivals: map[string]*held{}, bodies: map[string]string{}}
	m.srv = httptest.NewServer(m)
	t.Cleanup(m.srv.Close)
	// Cleanups run last first: every held call goes on before the model
	// closes, which waits for them.
	t.Cleanup(func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, h := range m.all {
			h.open()
		}
	})
	return m
}

func (m *toolModel) URL() string { return m.srv.URL + "/v1" }

// script sets what the model answers in each round of turn tok.
func (m *toolModel) script(tok string, steps ...toolStep) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range steps {
		if s.hold != nil {
			m.all = append(m.all, s.hold)
		}
	}
	m.scripts[tok] = steps
}

// holdLookup holds the next lookup of key.
func (m *toolModel) holdLookup(key string) *held {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := newHeld()
	m.holds[key] = h
	m.all = append(m.all, h)
	return h
}

// watchLookup signals the next lookup of key without holding it.
func (m *toolModel) watchLookup(key string) *held {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := newHeld()
	h.open()
	m.arrivals[key] = h
	return h
}

// requestsOf returns the model requests of turn tok, in arrival order.
func (m *toolModel) requestsOf(tok string) []toolRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []toolRequest
	for _, r := range m.requests {
		if r.turn == tok {
			out = append(out, r)
		}
	}
	return out
}

// lookupKeys returns the keys of every lookup so far, in arrival order.
func (m *toolModel) lookupKeys() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string{}, m.lookups...)
}

func (m *toolModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/tools/lookup" {
		m.lookup(w, r)
		return
	}
	var req openai.ChatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	rec := toolRequest{messages: req.Messages}
	for _, tool := range req.Tools {
		rec.tools = append(rec.tools, tool.Function.Name)
	}
	for _, msg := range req.Messages {
		switch {
		case msg.Role == openai.RoleUser:
			rec.turn, rec.round = userTokenRE.FindString(string(msg.Content)), 0
		case msg.Role == openai.RoleAssistant && len(msg.ToolCalls) > 0:
			rec.round++
		}
	}
	m.mu.Lock()
	m.requests = append(m.requests, rec)
	var step toolStep
	if steps := m.scripts[rec.turn]; rec.round < len(steps) {
		step = steps[rec.round]
	}
	m.mu.Unlock()
	if step.hold != nil && !step.hold.wait(r) {
		return
	}
	if step.fail {
		openai.WriteError(w, http.StatusInternalServerError, "server_error", "injected model error")
		return
	}
	out := sse.NewWriter(w)
	w.WriteHeader(http.StatusOK)
	send := func(d openai.Delta, finish string) {
		c := openai.Completion{Object: openai.ObjectChunk, Choices: []openai.Choice{{Delta: &d}}}
		if finish != "" {
			c.Choices[0].FinishReason = openai.Ptr(finish)
		}
		_ = out.Data(openai.Encode(c))
	}
	send(openai.Delta{Role: openai.RoleAssistant}, "")
	if len(step.calls) == 0 {
		text := strings.Replace(rec.turn, "tc-u", "tc-a", 1)
		send(openai.Delta{Content: text[:3]}, "")
		send(openai.Delta{Content: text[3:]}, "")
		send(openai.Delta{}, openai.FinishStop)
	} else {
		// Every call's id and name first, with some text the client must
		// not hear; then the arguments in two pieces each, the calls'
		// pieces interleaved, so that only their indexes put them
		// together.
		head := openai.Delta{Content: "let me look"}
		for i, c := range step.calls {
			head.ToolCalls = append(head.ToolCalls, openai.ToolCallDelta{Index: i, ID: c.ID, Type: openai.TypeFunction,
				Function: openai.FunctionDelta{Name: c.Function.Name}})
		}
		send(head, "")
		for half := range 2 {
			var d openai.Delta
			for i, c := range step.calls {
				args := c.Function.Arguments
				piece := args[:len(args)/2]
				if half == 1 {
					piece = args[len(args)/2:]
				}
				d.ToolCalls = append(d.ToolCalls, openai.ToolCallDelta{Index: i, Function: openai.FunctionDelta{Arguments: piece}})
			}
			send(d, "")
		}
		send(openai.Delta{}, openai.FinishToolCalls)
	}
	_ = out.Data(openai.Encode(openai.Completion{Object: openai.ObjectChunk, Choices: []openai.Choice{}, Usage: &openai.Usage{}}))
	_ = out.Data(openai.DoneSentinel)
}

// lookup serves the lookup tool: the value of a key is "value-of-KEY",
// and a key starting "missing" is not found.
func (m *toolModel) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	m.mu.Lock()
	m.lookups = append(m.lookups, key)
	h := m.holds[key]
	delete(m.holds, key)
	seen := m.arrivals[key]
	delete(m.arrivals, key)
	m.mu.Unlock()
	if seen != nil {
		close(seen.arrived)
	}
	if h != nil && !h.wait(r) {
		return
	}
	if strings.HasPrefix(key, "missing") {
		http.Error(w, "no such key", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, "value-of-"+key)
}

// call is a tool call of the script.
func call(id, name, args string) openai.ToolCall {
	return openai.ToolCall{ID: id, Type: openai.TypeFunction, Function: openai.FunctionCall{Name: name, Arguments: args}}
}

// echo and lookup are calls of the built-in tools.
func echo(id, text string) openai.ToolCall {
	return call(id, sut.ToolEcho, fmt.Sprintf(`{"text":%q}`, text))
}

func lookup(id, key string) openai.ToolCall {
	return call(id, sut.ToolLookup, fmt.Sprintf(`{"key":%q}`, key))
}

// ask is a round that asks for calls.
func ask(calls ...openai.ToolCall) toolStep { return toolStep{calls: calls} }

// shape is a request's messages, the system prompt left out, one line
// each: "user tc-u1", "assistant tc-a1", "calls c1,c2" (an assistant tool
// call message), "tool c1: hi" (a result; "tool c1: error" for any failed
// one).
func shape(msgs []openai.Message) []string {
	out := []string{}
	for _, m := range msgs {
		switch {
		case m.Role == openai.RoleSystem:
		case len(m.ToolCalls) > 0:
			ids := make([]string, len(m.ToolCalls))
			for i, c := range m.ToolCalls {
				ids[i] = c.ID
			}
			line := "calls " + strings.Join(ids, ",")
			if m.Content != "" || m.Role != openai.RoleAssistant {
				line += fmt.Sprintf(" (role %s, content %q)", m.Role, m.Content)
			}
			out = append(out, line)
		case m.Role == openai.RoleTool:
			result := string(m.Content)
			if strings.HasPrefix(result, "error: ") {
				result = "error"
			}
			out = append(out, "tool "+m.ToolCallID+": "+result)
		default:
			out = append(out, m.Role+" "+string(m.Content))
		}
	}
	return out
}

// lines joins shapes: lines([]string{"user tc-u1"}, "assistant tc-a1").
func lines(parts ...any) []string {
	out := []string{}
	for _, p := range parts {
		switch p := p.(type) {
		case string:
			out = append(out, p)
		case []string:
			out = append(out, p...)
		default:
			panic(fmt.Sprintf("lines: %T", p))
		}
	}
	return out
}

// unpaired returns what breaks T9 in msgs, "" if nothing: every assistant
// tool call must be answered by exactly one tool result with its id before
// the next user message, and every result must answer a call.
func unpaired(msgs []openai.Message) string {
	open := map[string]bool{}
	var problems []string
	closeTurn := func() {
		for id := range open {
			problems = append(problems, "call "+id+" without its result")
		}
		clear(open)
	}
	answered := map[string]bool{}
	for _, m := range msgs {
		switch m.Role {
		case openai.RoleUser:
			closeTurn()
		case openai.RoleAssistant:
			for _, c := range m.ToolCalls {
				open[c.ID] = true
			}
		case openai.RoleTool:
			switch {
			case open[m.ToolCallID]:
				delete(open, m.ToolCallID)
				answered[m.ToolCallID] = true
			case answered[m.ToolCallID]:
				problems = append(problems, "a second result for "+m.ToolCallID)
			default:
				problems = append(problems, "result "+m.ToolCallID+" without its call")
			}
		}
	}
	closeTurn()
	return strings.Join(problems, "; ")
}

// toolEnv is a reference server in front of a tool model, restartable on
// its data dir.
type toolEnv struct {
	model  *toolModel
	srv    *server
	gauge  *sut.Gauge
	client *http.Client
	dir    string
	t      testing.TB
}

// newToolEnv starts a server with cfg in front of a new tool model, on
// cfg.DataDir or a new temporary directory.
func newToolEnv(t testing.TB, cfg sut.Config) *toolEnv {
	t.Helper()
	e := &toolEnv{model: startToolModel(t), client: newClient(t), dir: cfg.DataDir, t: t}
	if e.dir == "" {
		e.dir = t.TempDir()
	}
	e.start(cfg)
	return e
}

// start stops the running server, if any, gracefully and starts cfg on the
// same data dir, in front of the same model.
func (e *toolEnv) start(cfg sut.Config) {
	e.t.Helper()
	if e.srv != nil {
		require.NoError(e.t, e.srv.Close())
		e.client.CloseIdleConnections()
	}
	e.gauge = &sut.Gauge{}
	cfg.ModelURL, cfg.DataDir, cfg.Gauge = e.model.URL(), e.dir, e.gauge
	e.srv = startServer(e.t, nil, cfg)
}

// send sends the turn tok (its user message is tok alone) on conv in the
// background.
func (e *toolEnv) send(t testing.TB, conv, tok string, stream bool) *inFlight {
	t.Helper()
	return sendChat(t, e.client, e.srv.URL(), conv, chatBody(t, stream, user(tok)))
}

// ok sends the turn tok, requires it to end ok with tok's reply, and
// returns the model requests it made.
func (e *toolEnv) ok(t testing.TB, conv, tok string, stream bool) []toolRequest {
	t.Helper()
	n := len(e.model.requestsOf(tok))
	r := e.send(t, conv, tok, stream).wait(t)
	want := strings.Replace(tok, "tc-u", "tc-a", 1)
	if stream {
		s := parseStream(t, r)
		require.True(t, s.done && s.stopped() && s.errors() == 0, "the stream must end ok: %s", r.body)
		assert.Equal(t, want, s.text(), "the client hears the final reply, and only it")
	} else {
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		var c openai.Completion
		require.NoError(t, json.Unmarshal(r.body, &c))
		assert.Equal(t, want, c.Text())
	}
	return e.model.requestsOf(tok)[n:]
}

// history is what the first model request of the plain turn tok carried:
// the conversation as committed, then tok.
func (e *toolEnv) history(t testing.TB, conv, tok string) []openai.Message {
	t.Helper()
	reqs := e.ok(t, conv, tok, false)
	require.Len(t, reqs, 1, "a turn without tools makes one model call")
	return reqs[0].messages
}

// interrupt sends the turn tok, waits for h to arrive, disconnects the
// client, and waits until the server gave up on h and came to rest.
func (e *toolEnv) interrupt(t testing.TB, conv, tok string, stream bool, h *held) {
	t.Helper()
	f := e.send(t, conv, tok, stream)
	await(t, h.arrived, "the held call of "+tok)
	f.cancel()
	await(t, h.gone, "the server to give up the held call of "+tok)
	<-f.done
	awaitIdle(t, e.gauge)
}
