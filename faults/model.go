package faults

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/turncheck/turncheck/internal/loopback"
	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/model"
)

// maxModelRequest bounds the body of a request to the fake model.
const maxModelRequest = 8 << 20

// ModelConfig configures a fake model.
type ModelConfig struct {
	// Addr is the address to listen on; "" means 127.0.0.1:0.
	Addr string
	// Log, if set, receives one line per call: the tokens it carried and the
	// fault injected; and one per agent definition served.
	Log io.Writer
	// Clock, if set, stamps every call's arrival (model.Call.At), so that
	// calls fall on the same timeline as what the harness records; nil
	// numbers calls 1, 2, 3...
	Clock func() int64
}

// Model is a fake OpenAI-compatible model provider on loopback. It records
// every chat-completion request as the tokens it carries, and answers each by
// the script set for the token of the request's last user message: a reply
// carrying the matching reply token, or a fault.
type Model struct {
	cfg     ModelConfig
	ln      net.Listener
	srv     *http.Server
	serving chan struct{}
	closing chan struct{}
	once    sync.Once
	active  sync.WaitGroup // calls in flight; none starts once closed
	logMu   sync.Mutex

	mu      sync.Mutex
	calls   []model.Call
	scripts map[model.Token]*script
	// holding are the gates of calls being held now, for Reset to let go.
	holding map[*Gate]bool
	// epoch, if not "", is the text a call must carry to be recorded.
	epoch string
}

type script struct {
	fault   Fault
	calls   int
	arrived chan struct{}
	gate    *Gate
}

// Gate holds the first call of one turn where it arrives, until the
// harness releases it. Concurrent turns then reach the model, and go on
// from it, in an order the harness chooses, not in one the scheduler
// happens to pick: an interleaving replays. A gated call whose server gives
// up on it (the client went away, a deadline passed) ends unanswered. Safe
// for concurrent use.
type Gate struct {
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
}

// Arrived is closed when the gated call has arrived and is being held.
func (g *Gate) Arrived() <-chan struct{} { return g.arrived }

// Release lets the held call go on, to its script's answer or fault. It
// may be called before the call arrives, and more than once.
func (g *Gate) Release() { g.once.Do(func() { close(g.release) }) }

// StartModel starts a fake model and returns once it is listening.
func StartModel(cfg ModelConfig) (*Model, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	ln, err := loopback.Listen(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("fake model: %w", err)
	}
	m := &Model{
		cfg:     cfg,
		ln:      ln,
		serving: make(chan struct{}),
		closing: make(chan struct{}),
		scripts: map[model.Token]*script{},
		holding: map[*Gate]bool{},
	}
	m.srv = &http.Server{Handler: m, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(m.serving)
		_ = m.srv.Serve(ln)
	}()
	return m, nil
}

// URL is the base URL to configure a server with, ending in /v1; the model
// answers POST {URL}/chat/completions (and the same path without /v1).
func (m *Model) URL() string { return "http://" + m.ln.Addr().String() + "/v1" }

// Addr is the address the model listens on.
func (m *Model) Addr() string { return m.ln.Addr().String() }

// Close releases held calls, closes every connection and waits for the
// model's goroutines to end.
func (m *Model) Close() error {
	m.once.Do(func() {
		m.mu.Lock()
		close(m.closing)
		m.mu.Unlock()
		_ = m.srv.Close()
		<-m.serving
		m.active.Wait()
	})
	return nil
}

// Script sets the fault for the next calls of the turn whose user token is
// tok, replacing any earlier script for it and resetting its call count. The
// returned channel is closed when the first call of tok arrives, so that a
// client can abort at a known point rather than after a guessed delay.
func (m *Model) Script(tok model.Token, f Fault) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &script{fault: f, arrived: make(chan struct{})}
	m.scripts[tok] = s
	return s.arrived
}

// Gate holds the next first call of tok (the first after its latest
// Script) until the returned gate is released; the call then gets tok's
// scripted answer or fault. Without a script, tok gets a normal answer.
func (m *Model) Gate(tok model.Token) *Gate {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.scripts[tok]
	if s == nil {
		s = &script{arrived: make(chan struct{})}
		m.scripts[tok] = s
	}
	s.gate = &Gate{arrived: make(chan struct{}), release: make(chan struct{})}
	return s.gate
}

// Forget drops the script for tok: later calls of it are answered
// normally. A server that replays an old message then gets a reply, not
// that message's fault all over again.
func (m *Model) Forget(tok model.Token) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.scripts, tok)
}

// Reset forgets every script and recorded call, and lets any held call go
// on: the model is as new, on the same address. A server started once,
// pointed at this model, can then serve check after check. With an epoch,
// only calls that carry it in the text of some message are recorded and
// scripted from now on; any other call (a late one, about a conversation
// of an earlier check) is answered as a plain reply and otherwise
// ignored, so that it cannot pass for a call of this check's turn with
// the same token. "" records every call.
func (m *Model) Reset(epoch string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.epoch = epoch
	for _, s := range m.scripts {
		if s.gate != nil {
			s.gate.Release()
		}
	}
	for g := range m.holding {
		g.Release()
	}
	m.scripts = map[model.Token]*script{}
	m.calls = nil
}

// CallCount is how many calls the model has recorded.
func (m *Model) CallCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.calls)
}

// CallsAfter returns the calls that arrived after at, on the model's
// timeline (ModelConfig.Clock), in arrival order.
func (m *Model) CallsAfter(at int64) []model.Call {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, _ := slices.BinarySearchFunc(m.calls, at, func(c model.Call, at int64) int { return cmp.Compare(c.At, at+1) })
	return slices.Clone(m.calls[i:])
}

// ServeHTTP answers the chat-completion endpoint, and serves agent
// definitions at GET /agents/NAME.yaml (see AgentDefinition).
func (m *Model) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	select {
	case <-m.closing:
		m.mu.Unlock()
		panic(http.ErrAbortHandler) // closed: no call starts
	default:
	}
	m.active.Add(1)
	m.mu.Unlock()
	defer m.active.Done()
	if strings.Contains(r.URL.Path, "/agents/") {
		m.serveAgent(w, r)
		return
	}
	if r.URL.Path != "/v1/chat/completions" && r.URL.Path != "/chat/completions" {
		openai.WriteError(w, http.StatusNotFound, "not_found", "the fake model serves POST /v1/chat/completions")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		openai.WriteError(w, http.StatusMethodNotAllowed, "invalid_request_error", "use POST")
		return
	}
	req, err := decodeRequest(r.Body)
	if err != nil {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", "malformed request: "+err.Error())
		return
	}
	call := readCall(req.Messages)
	if !m.ofEpoch(req.Messages) {
		m.answer(w, r, req, call, Fault{})
		return
	}
	fault, arrived, gate := m.record(call)
	if m.cfg.Log != nil {
		m.logMu.Lock()
		fmt.Fprintf(m.cfg.Log, "call turn=%s stream=%t fault=%q history=%s\n",
			orDash(call.Turn), req.Stream, fault, model.FormatTokens(call.History))
		m.logMu.Unlock()
	}
	if arrived != nil {
		close(arrived)
	}
	if gate != nil {
		close(gate.arrived)
		defer m.unhold(gate)
		select {
		case <-gate.release:
		case <-r.Context().Done():
			return // the server gave up on the call
		case <-m.closing:
			panic(http.ErrAbortHandler)
		}
	}
	m.answer(w, r, req, call, fault)
}

// agentPath matches the paths agent definitions are served at: under the
// model's address, and under its base URL (/v1) for servers that are only
// given that.
var agentPath = regexp.MustCompile(`^(?:/v1)?/agents/([A-Za-z0-9_-]+)\.yaml$`)

// serveAgent answers GET /agents/NAME.yaml (or /v1/agents/NAME.yaml) with
// an agent definition, so that a server under test can load its agents
// from URLs on loopback (PROTOCOL.md, "Agent sources"):
//
//	name: NAME
//	instruction: You are NAME, loaded from /agents/NAME.yaml?QUERY.
//
// The request's raw query is echoed into the instruction (with no "?" when
// there is none), so that a server restarted with a changed query visibly
// sends the model a different instruction. It is not a model call and is not
// recorded as one. A NAME outside [A-Za-z0-9_-]+ is 404: nothing else in a
// name can be echoed unquoted into a path.
func (m *Model) serveAgent(w http.ResponseWriter, r *http.Request) {
	match := agentPath.FindStringSubmatch(r.URL.Path)
	if match == nil {
		openai.WriteError(w, http.StatusNotFound, "not_found", "the fake model serves agents at GET /agents/NAME.yaml, NAME in [A-Za-z0-9_-]+")
		return
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		openai.WriteError(w, http.StatusMethodNotAllowed, "invalid_request_error", "use GET")
		return
	}
	name := match[1]
	from := "/agents/" + name + ".yaml"
	if r.URL.RawQuery != "" {
		from += "?" + r.URL.RawQuery
	}
	// Marshalled, not formatted: the query is the client's and may hold
	// anything YAML would read as syntax.
	body, err := yaml.Marshal(AgentDefinition{Name: name, Instruction: "You are " + name + ", loaded from " + from + "."})
	if err != nil {
		openai.WriteError(w, http.StatusInternalServerError, "server_error", err.Error())
		return
	}
	if m.cfg.Log != nil {
		m.logMu.Lock()
		fmt.Fprintf(m.cfg.Log, "agent %s query=%q\n", name, r.URL.RawQuery)
		m.logMu.Unlock()
	}
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(body)
}

// AgentDefinition is the agent definition the fake model serves at GET
// /agents/NAME.yaml, as YAML.
type AgentDefinition struct {
	// Name is NAME from the path.
	Name string `yaml:"name"`
	// Instruction is "You are NAME, loaded from /agents/NAME.yaml?QUERY.",
	// QUERY the request's raw query.
	Instruction string `yaml:"instruction"`
}

// record stamps and appends call and returns the fault to inject for it,
// and, if this is the first call of its turn, the arrival channel to close
// and the gate to hold it at.
func (m *Model) record(call model.Call) (Fault, chan struct{}, *Gate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cfg.Clock != nil {
		call.At = m.cfg.Clock()
	} else {
		call.At = int64(len(m.calls) + 1)
	}
	m.calls = append(m.calls, call)
	s := m.scripts[call.Turn]
	if s == nil || call.Turn == "" {
		return Fault{}, nil, nil
	}
	s.calls++
	arrived, gate := s.arrived, s.gate
	s.arrived, s.gate = nil, nil
	if gate != nil {
		m.holding[gate] = true
	}
	if s.fault.Times > 0 && s.calls > s.fault.Times {
		return Fault{}, arrived, gate
	}
	return s.fault, arrived, gate
}

// ofEpoch reports whether a request carries the current epoch (see Reset).
func (m *Model) ofEpoch(msgs []openai.Message) bool {
	m.mu.Lock()
	epoch := m.epoch
	m.mu.Unlock()
	if epoch == "" {
		return true
	}
	for _, msg := range msgs {
		if strings.Contains(string(msg.Content), epoch) {
			return true
		}
	}
	return false
}

// unhold forgets a gate whose call is no longer held.
func (m *Model) unhold(g *Gate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.holding, g)
}

// decodeRequest reads a chat request that is one JSON object and nothing
// more.
func decodeRequest(body io.Reader) (*openai.ChatRequest, error) {
	raw, err := io.ReadAll(io.LimitReader(body, maxModelRequest+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > maxModelRequest {
		return nil, fmt.Errorf("body over %d bytes", maxModelRequest)
	}
	var req openai.ChatRequest
	if err := openai.DecodeObject(raw, &req); err != nil {
		return nil, err
	}
	return &req, nil
}

// readCall reads a request as tokens: all of them in message order, and the
// token of the last user message.
func readCall(msgs []openai.Message) model.Call {
	var call model.Call
	prevUser := false
	for _, msg := range msgs {
		toks := model.Tokens(string(msg.Content))
		call.History = append(call.History, toks...)
		isUser := msg.Role == openai.RoleUser
		if isUser && !prevUser {
			// A new run of user messages: the call's turn is read from the
			// last run. Within it, a server may have merged the user's
			// messages into one, or appended messages without a token (an
			// internal context block) after the user's (PROTOCOL.md); a
			// message after an assistant's reply is a new one.
			call.Turn, call.Tail = "", false
		}
		prevUser = isUser
		if !isUser {
			continue
		}
		tokened := false
		for _, t := range toks {
			if t.IsUser() {
				call.Turn, tokened = t, true
			}
		}
		if !tokened {
			call.Tail = true
		} else {
			call.Tail = false
		}
	}
	if call.History == nil {
		call.History = []model.Token{}
	}
	return call
}

// ReplyChunks is the reply the fake model writes for the turn tok, as the
// chunks it streams. The reply token comes first, so that a reply cut after
// one chunk still carries it.
func ReplyChunks(tok model.Token) []string {
	return []string{string(tok.Reply()), " acknowledges", " your", " message."}
}

func (m *Model) answer(w http.ResponseWriter, r *http.Request, req *openai.ChatRequest, call model.Call, f Fault) {
	turn, stream := call.Turn, req.Stream
	switch f.Kind {
	case Status:
		if f.Status < 400 {
			f.Status = http.StatusInternalServerError
		}
		if f.RetryHint {
			w.Header().Set("Retry-After", "0")
		}
		openai.WriteError(w, f.Status, "server_error", fmt.Sprintf("injected model error %d", f.Status))
		return
	case Hold:
		select {
		case <-r.Context().Done():
		case <-m.closing:
			// Shutting down: drop the call rather than let net/http end it
			// with an empty 200 the server would take for a reply.
			panic(http.ErrAbortHandler)
		}
		return
	}
	chunks := ReplyChunks(turn)
	if turn == "" {
		chunks = []string{"no turn token in the last user message"}
	}
	usage := &openai.Usage{PromptTokens: len(call.History), CompletionTokens: len(chunks)}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	if !stream {
		m.answerWhole(w, chunks, usage, f)
		return
	}
	sw := sse.NewWriter(w)
	w.WriteHeader(http.StatusOK)
	_ = sw.Data(openai.Encode(chunk("", openai.RoleAssistant, nil)))
	for i, c := range chunks {
		if i == f.After {
			switch f.Kind {
			case Cut:
				panic(http.ErrAbortHandler) // the connection drops mid-stream
			case Malformed:
				_ = sw.Data(malformedChunk)
			}
		}
		_ = sw.Data(openai.Encode(chunk(c, "", nil)))
	}
	if f.After >= len(chunks) {
		switch f.Kind {
		case Cut:
			panic(http.ErrAbortHandler)
		case Malformed:
			_ = sw.Data(malformedChunk)
		}
	}
	_ = sw.Data(openai.Encode(chunk("", "", openai.Ptr(openai.FinishStop))))
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		// As OpenAI sends it: after the finish, no choices, then [DONE].
		_ = sw.Data(openai.Encode(openai.Completion{ID: "fake", Object: openai.ObjectChunk, Model: "fake",
			Choices: []openai.Choice{}, Usage: usage}))
	}
	_ = sw.Data(openai.DoneSentinel)
}

func (m *Model) answerWhole(w http.ResponseWriter, chunks []string, usage *openai.Usage, f Fault) {
	body := openai.Encode(openai.Completion{
		ID: "fake", Object: openai.ObjectCompletion, Model: "fake", Usage: usage,
		Choices: []openai.Choice{{
			Message:      &openai.Message{Role: openai.RoleAssistant, Content: openai.Content(strings.Join(chunks, ""))},
			FinishReason: openai.Ptr(openai.FinishStop),
		}},
	})
	w.Header().Set("Content-Type", "application/json")
	switch f.Kind {
	case Cut:
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, body[:len(body)/2])
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		panic(http.ErrAbortHandler)
	case Malformed:
		body = body[:len(body)/2]
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, body)
}

// malformedChunk is a chunk cut off mid-JSON.
const malformedChunk = `{"id":"fake","object":"chat.completion.chunk","choices":[{"delta":`

func chunk(content, role string, finish *string) openai.Completion {
	return openai.Completion{
		ID: "fake", Object: openai.ObjectChunk, Model: "fake",
		Choices: []openai.Choice{{Delta: &openai.Delta{Role: role, Content: content}, FinishReason: finish}},
	}
}

func orDash(t model.Token) string {
	if t == "" {
		return "-"
	}
	return string(t)
}
