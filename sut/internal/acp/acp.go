// Package acp is the adapter of the Agent Client Protocol, JSON-RPC over
// an agent's stdin and stdout.
package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	acp "github.com/coder/acp-go-sdk"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/acp/stdio"
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/store"
	"github.com/turncheck/turncheck/sut/internal/turn"
)

// The Agent Client Protocol (https://agentclientprotocol.com): an editor
// starts the agent as a child process and drives it with JSON-RPC 2.0 over
// its stdin and stdout, one message a line. ServeACP is the reference
// server speaking it, over the store and the turn machinery the HTTP
// protocols use (run): a session is a conversation under a namespace of
// its own (nsACP), a session/prompt is a turn with the conversation's
// lock, concurrency policy, agent binding, tool loop and durability, and
// session/cancel is its client going away (the interruption policy
// decides what stays). The SDK (github.com/coder/acp-go-sdk) frames and
// dispatches the messages; acpwire.go guards both ends of the pipe.

// nsACP holds the sessions of ACP; see the namespaces in items.go.
const nsACP = "\x1eacp:"

// acpAgentName is the name the server gives itself in initialize.
const acpAgentName = "turncheck-reference"

// Serve serves one ACP client on in and out; see ServeACP.
func Serve(ctx context.Context, s *turn.Engine, closeServer func() error, in io.Reader, out io.Writer) error {
	w := stdio.NewLineWriter(out, stdio.WriteTimeout)
	sdkIn, toSDK := io.Pipe()
	a := &acpAgent{s: s, sessions: map[acp.SessionId]*acpSession{}}
	answers := stdio.NewAnswerCount(w)
	a.conn = acp.NewAgentSideConnection(a, answers, sdkIn)
	a.conn.SetLogger(slog.New(clientCaused{s.Log.Handler()}))
	// A client may wait for this line (on stderr, in 'turncheck serve
	// acp') as a sign the store is open; initialize is the protocol's own.
	s.Log.Info("acp: serving the Agent Client Protocol on stdin and stdout", "protocol_version", acp.ProtocolVersionNumber)
	go stdio.ReadLines(in, toSDK, w, s.Cfg.MaxBodyBytes, answers.Owe, func(reason string) {
		s.Log.Info("acp: a line that is no JSON-RPC message was answered with an error and skipped", "reason", reason)
	})
	select {
	case <-a.conn.Done():
		s.Log.Info("acp: the client closed its end")
		a.stop(true)
	case <-w.Broken:
		s.Log.Info("acp: the client stopped reading; taken for gone")
		a.stop(true)
	case <-ctx.Done():
		s.Log.Info("acp: stopping; the prompts in flight are dropped")
		a.stop(false)
		s.DropTurns(turn.DropAnswerWait)
	}
	a.prompts.Wait()
	// The SDK writes a request's answer once its handler has returned:
	// the output stays open until every request read is answered, or the
	// client stops reading.
	answers.Settle(turn.DropAnswerWait)
	// The SDK's reader ends with its pipe. The goroutine reading in ends
	// when in does: it may be the caller's to close.
	_ = sdkIn.CloseWithError(errors.New("the server is stopping"))
	<-a.conn.Done()
	w.Close()
	return closeServer()
}

// acpAgent is the server's side of one ACP connection: the sessions the
// client created or loaded on it, and their prompts in flight. It is safe
// for concurrent use: the SDK runs every request in a goroutine of its own.
type acpAgent struct {
	s    *turn.Engine
	conn *acp.AgentSideConnection
	// prompts counts the prompt handlers running.
	prompts sync.WaitGroup

	mu       sync.Mutex
	sessions map[acp.SessionId]*acpSession
	// ending is set once the connection ends: no prompt starts after.
	ending bool
}

// acpSession is a session the client created or loaded on this
// connection, with its prompts in flight.
type acpSession struct {
	mu      sync.Mutex
	running map[*acpPrompt]struct{}
}

// acpPrompt is one session/prompt in flight.
type acpPrompt struct {
	// cancel ends the prompt's turn as a client that goes away does.
	cancel context.CancelFunc
	// cancelled is set by session/cancel: the prompt's answer is then
	// stopReason cancelled, whatever became of the turn.
	cancelled atomic.Bool
}

// Key is the conversation of session id.
func acpKey(id acp.SessionId) store.Key { return store.Key{ID: nsACP + string(id)} }

// session returns session id if the client created or loaded it on this
// connection.
func (a *acpAgent) session(id acp.SessionId) (*acpSession, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if sess := a.sessions[id]; sess != nil {
		return sess, nil
	}
	return nil, rpcErr(-32002, "Resource not found", http.StatusNotFound, "not_found",
		fmt.Sprintf("no session %q on this connection: create one with session/new, or load it with session/load", id))
}

// Open records session id on this connection.
func (a *acpAgent) open(id acp.SessionId) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sessions[id] == nil {
		a.sessions[id] = &acpSession{running: map[*acpPrompt]struct{}{}}
	}
}

// Stop refuses the prompts that come from now on; with clientGone, it
// ends every prompt in flight as a client that went away does: each turn
// settles by the interruption policy.
func (a *acpAgent) stop(clientGone bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ending = true
	if !clientGone {
		return
	}
	for _, sess := range a.sessions {
		sess.cancelAll(false)
	}
}

// cancelAll ends the session's prompts in flight; cancelled marks their
// answers so (session/cancel).
func (sess *acpSession) cancelAll(cancelled bool) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	for p := range sess.running {
		if cancelled {
			p.cancelled.Store(true)
		}
		p.cancel()
	}
}

// rpcErr is a JSON-RPC error whose data says what an HTTP client of the
// server would have been answered: the status and the error type.
func rpcErr(code int, message string, status int, typ, detail string) *acp.RequestError {
	return &acp.RequestError{Code: code, Message: message, Data: map[string]any{"status": status, "type": typ, "detail": detail}}
}

// Initialize answers initialize: protocol version 1 (the only one), and
// loadSession. The prompt takes text (and resource links, whose text is
// not read); the client's capabilities are not used: the agent never
// calls the client back.
func (a *acpAgent) Initialize(_ context.Context, p acp.InitializeRequest) (acp.InitializeResponse, error) {
	return acp.InitializeResponse{
		ProtocolVersion:   acp.ProtocolVersionNumber,
		AgentInfo:         &acp.Implementation{Name: acpAgentName, Version: "1"},
		AgentCapabilities: acp.AgentCapabilities{LoadSession: true},
		AuthMethods:       []acp.AuthMethod{},
	}, nil
}

// NewSession answers session/new: a new empty session, stored durably
// before its id is answered, so that it can be loaded after a restart.
func (a *acpAgent) NewSession(_ context.Context, p acp.NewSessionRequest) (acp.NewSessionResponse, error) {
	if err := checkCwd(p.Cwd); err != nil {
		return acp.NewSessionResponse{}, err
	}
	if !a.s.Gate.In() {
		return acp.NewSessionResponse{}, errACPStopping()
	}
	defer a.s.Gate.Out()
	id := acp.SessionId(turn.NewID("sess_"))
	if err := a.s.Store.CreateSession(acpKey(id)); err != nil {
		a.s.Log.Error("acp: create session", "err", err)
		return acp.NewSessionResponse{}, rpcErr(-32603, "Internal error", http.StatusInternalServerError, "server_error", "the session could not be created")
	}
	a.open(id)
	return acp.NewSessionResponse{SessionId: id}, nil
}

// checkCwd refuses a working directory that is not absolute, as ACP
// requires; the server works in none.
func checkCwd(cwd string) error {
	if !filepath.IsAbs(cwd) {
		return acp.NewInvalidParams(map[string]any{"detail": fmt.Sprintf("cwd %q: want an absolute path", cwd)})
	}
	return nil
}

// LoadSession answers session/load: it replays the session's committed
// history as session/update notifications (replay), then answers, and
// the session takes prompts on this connection from then on. A session
// never created is -32002.
func (a *acpAgent) LoadSession(ctx context.Context, p acp.LoadSessionRequest) (acp.LoadSessionResponse, error) {
	if err := checkCwd(p.Cwd); err != nil {
		return acp.LoadSessionResponse{}, err
	}
	if !a.s.Gate.In() {
		return acp.LoadSessionResponse{}, errACPStopping()
	}
	defer a.s.Gate.Out()
	key := acpKey(p.SessionId)
	found, err := a.s.Store.SessionExists(ctx, key)
	if err == nil && !found {
		return acp.LoadSessionResponse{}, rpcErr(-32002, "Resource not found", http.StatusNotFound, "not_found",
			fmt.Sprintf("no session %q: create one with session/new", p.SessionId))
	}
	var conv *store.Conversation
	if err == nil {
		conv, err = a.s.Convs.Peek(ctx, key)
	}
	if err != nil {
		a.s.Log.Error("acp: load session", "session", p.SessionId, "err", err)
		return acp.LoadSessionResponse{}, rpcErr(-32603, "Internal error", http.StatusInternalServerError, "server_error", "cannot load the session")
	}
	msgs := conv.Messages
	if a.s.Cfg.Mutant == config.ACPLoadDiffers {
		// The bug: the replay stops before the last committed turn.
		msgs = msgs[:lastUserIndex(msgs)]
	}
	if err := a.replay(p.SessionId, msgs); err != nil {
		return acp.LoadSessionResponse{}, err
	}
	a.open(p.SessionId)
	return acp.LoadSessionResponse{}, nil
}

// lastUserIndex is the index of the last user message of msgs: where the
// last turn starts; 0 if there is none.
func lastUserIndex(msgs []*store.Message) int {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == openai.RoleUser {
			return i
		}
	}
	return 0
}

// replay sends msgs, a committed history, as session/update
// notifications: a user message as user_message_chunk, a reply as
// agent_message_chunk, each tool call as tool_call and its result as
// tool_call_update (status completed, the result as its text content).
// Tool rounds compaction hides from the model are replayed too: they are
// part of the session.
func (a *acpAgent) replay(id acp.SessionId, msgs []*store.Message) error {
	for _, m := range msgs {
		var updates []acp.SessionUpdate
		switch m.Role {
		case openai.RoleUser:
			updates = append(updates, acp.UpdateUserMessageText(string(m.Content)))
		case openai.RoleAssistant:
			for _, c := range m.ToolCalls {
				updates = append(updates, toolCallStarted(c))
			}
			if m.Content != "" {
				updates = append(updates, acp.UpdateAgentMessageText(string(m.Content)))
			}
		case openai.RoleTool:
			updates = append(updates, toolCallDone(m.ToolCallID, string(m.Content)))
		}
		for _, u := range updates {
			if err := a.update(id, u); err != nil {
				return rpcErr(-32603, "Internal error", http.StatusInternalServerError, "server_error", "the replay could not be sent: "+err.Error())
			}
		}
	}
	return nil
}

// toolCallStarted is the tool_call update of call: titled by its tool,
// in_progress, its arguments as rawInput.
func toolCallStarted(c openai.ToolCall) acp.SessionUpdate {
	return acp.StartToolCall(acp.ToolCallId(c.ID), c.Function.Name,
		acp.WithStartKind(toolKind(c.Function.Name)), acp.WithStartStatus(acp.ToolCallStatusInProgress),
		acp.WithStartRawInput(rawArguments(c.Function.Arguments)))
}

// toolCallDone is the tool_call_update of call id's result: completed,
// the result (an "error: " text for a tool that failed) as its content.
func toolCallDone(id, result string) acp.SessionUpdate {
	return acp.UpdateToolCall(acp.ToolCallId(id), acp.WithUpdateStatus(acp.ToolCallStatusCompleted),
		acp.WithUpdateContent([]acp.ToolCallContent{acp.ToolContent(acp.TextBlock(result))}))
}

// toolKind is the ACP kind of one of the server's tools.
func toolKind(name string) acp.ToolKind {
	if name == turn.ToolLookup {
		return acp.ToolKindFetch
	}
	return acp.ToolKindOther
}

// rawArguments is a tool call's arguments as its rawInput: the JSON the
// model wrote, or the text if it is no JSON.
func rawArguments(args string) any {
	if json.Valid([]byte(args)) {
		return json.RawMessage(args)
	}
	return args
}

// update sends one session/update notification.
func (a *acpAgent) update(id acp.SessionId, u acp.SessionUpdate) error {
	// Not the request's context: a later prompt on the session ends the
	// SDK's context of an earlier one. The write is bounded by the
	// connection's (lineWriter).
	return a.conn.SessionUpdate(context.Background(), acp.SessionNotification{SessionId: id, Update: u})
}

// Cancel handles session/cancel: every prompt of the session in flight
// stops at once, as a turn whose client went away (the interruption
// policy decides what stays), and is answered stopReason cancelled. A
// session with nothing in flight, or unknown, is ignored: a notification
// has no answer.
func (a *acpAgent) Cancel(_ context.Context, p acp.CancelNotification) error {
	a.mu.Lock()
	sess := a.sessions[p.SessionId]
	a.mu.Unlock()
	if sess != nil {
		// The acp-cancel-answers-error mutant stops the prompts all the
		// same, but does not mark them cancelled: each is answered with
		// the error of a turn whose client went away.
		sess.cancelAll(a.s.Cfg.Mutant != config.ACPCancelAnswersError)
	}
	return nil
}

// Prompt handles session/prompt: one turn of the session (turn), answered
// with its stop reason.
func (a *acpAgent) Prompt(_ context.Context, p acp.PromptRequest) (acp.PromptResponse, error) {
	// The SDK's context is not the turn's: the SDK ends it when another
	// prompt of the session arrives, where the server's concurrency
	// policy decides. The turn ends on session/cancel, when the client
	// goes, and when the server stops.
	sess, err := a.session(p.SessionId)
	if err != nil {
		return acp.PromptResponse{}, err
	}
	text, err := promptText(p.Prompt)
	if err != nil {
		return acp.PromptResponse{}, err
	}
	user, err := a.s.NewUserMessage([]openai.Message{{Role: openai.RoleUser, Content: openai.Content(text)}})
	if err != nil {
		return acp.PromptResponse{}, invalidPrompt("the prompt has no text: " + err.Error())
	}
	if len(text) > turn.MaxContentBytes {
		return acp.PromptResponse{}, invalidPrompt(fmt.Sprintf("the prompt's text is over %d bytes", turn.MaxContentBytes))
	}
	if a.s.Cfg.Concurrency == config.Supersede {
		// The new prompt replaces the running one: that one is
		// cancelled as session/cancel would, and this one waits for
		// it to be done (the session's lock).
		sess.cancelAll(true)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := &acpPrompt{cancel: cancel}
	if !a.Begin(sess, run) {
		return acp.PromptResponse{}, errACPStopping()
	}
	defer a.end(sess, run)
	return a.turn(ctx, run, p.SessionId, user)
}

// Begin counts prompt run in, on sess, unless the connection is ending.
func (a *acpAgent) Begin(sess *acpSession, run *acpPrompt) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ending {
		return false
	}
	a.prompts.Add(1)
	sess.mu.Lock()
	sess.running[run] = struct{}{}
	sess.mu.Unlock()
	return true
}

// end counts prompt run out.
func (a *acpAgent) end(sess *acpSession, run *acpPrompt) {
	sess.mu.Lock()
	delete(sess.running, run)
	sess.mu.Unlock()
	a.prompts.Done()
}

// invalidPrompt is the error of a prompt refused before any model call.
func invalidPrompt(detail string) *acp.RequestError {
	return rpcErr(-32602, "Invalid params", http.StatusBadRequest, "invalid_request_error", detail)
}

// promptText is the user message of a prompt: its text blocks, joined by
// newlines; a resource link names a resource the server does not read,
// and adds nothing. The server advertises no other kind of block.
func promptText(blocks []acp.ContentBlock) (string, error) {
	var parts []string
	for i, b := range blocks {
		switch {
		case b.Text != nil:
			parts = append(parts, b.Text.Text)
		case b.ResourceLink != nil:
		default:
			return "", invalidPrompt(fmt.Sprintf("prompt[%d]: the agent takes text and resource_link blocks only (it advertises no image, audio or embedded context)", i))
		}
	}
	return strings.Join(parts, "\n"), nil
}

// Turn runs the prompt's turn through the server's turn machinery, as an
// HTTP request would (ServeHTTP, admit): counted in, with a request slot
// and its memory reserved, on a context that ends with the server, and
// answers it: stopReason end_turn once the turn is committed, refusal if
// the model refused it, cancelled after session/cancel, or the error an
// HTTP client would have been answered, as a JSON-RPC error.
func (a *acpAgent) turn(ctx context.Context, run *acpPrompt, id acp.SessionId, user openai.Message) (acp.PromptResponse, error) {
	s := a.s
	defer s.Gate.Handle()()
	ticket, ctx, refusal := s.Gate.Enter(ctx, "")
	defer ticket.Leave()
	if refusal != nil {
		return acp.PromptResponse{}, acpRefusal(refusal)
	}
	defer context.AfterFunc(ctx, run.cancel)()
	release, refusal := ticket.Admit(ctx, nil, int64(len(user.Content)), nil)
	if refusal == admission.ClientLeft {
		return a.answer(run, nil, &acpClient{})
	}
	if refusal != nil {
		return acp.PromptResponse{}, acpRefusal(refusal)
	}
	defer release()
	// What the turn machinery answers of its own (a refusal, a failure)
	// is recorded, and becomes the JSON-RPC answer.
	c := &acpClient{}
	resp := &acpResponder{a: a, id: id}
	t := &turn.Turn{Key: acpKey(id), Proto: config.ProtoACP, ToolNotes: resp}
	s.Converse(ctx, c, t, turn.UserInput(user), a.agentRef(), resp)
	return a.answer(run, resp, c)
}

// agentRef is what a new session's first turn binds by: the first agent
// source the server loaded, by its source key, as an ACP agent runs the
// one agent it was started with. A session resumes with the source it
// recorded (agentFor).
func (a *acpAgent) agentRef() string {
	if len(a.s.Sources.List) == 0 {
		return ""
	}
	return a.s.Sources.List[0].Key
}

// acpRefusal is the JSON-RPC error of a prompt refused before its turn
// ran: what an HTTP client would have been answered.
func acpRefusal(r *admission.Refusal) *acp.RequestError {
	return rpcErr(-32603, "Internal error", r.Status, r.Type, r.Message)
}

// errACPStopping is the answer to a request that comes as the server
// stops.
func errACPStopping() *acp.RequestError {
	return acpRefusal(admission.Stopping())
}

// answer turns what the turn machinery answered into the prompt's answer.
func (a *acpAgent) answer(run *acpPrompt, resp *acpResponder, c *acpClient) (acp.PromptResponse, error) {
	switch {
	case run.cancelled.Load():
		// ACP: the answer to a cancelled prompt is cancelled, whatever
		// became of its turn (the interruption policy's to say).
		return acp.PromptResponse{StopReason: acp.StopReasonCancelled}, nil
	case resp != nil && resp.ok:
		return acp.PromptResponse{StopReason: acp.StopReasonEndTurn}, nil
	case resp != nil && resp.refusal:
		return acp.PromptResponse{StopReason: acp.StopReasonRefusal}, nil
	}
	r := c.refusal
	if r == nil || r.Status == 0 || r.Status == http.StatusOK {
		// Nothing answered: the client is gone, or stopped reading.
		return acp.PromptResponse{}, rpcErr(-32603, "Internal error", admission.StatusClientClosed, "client_closed_request",
			"the client went away; the turn was rolled back")
	}
	code, message := -32603, "Internal error"
	switch r.Status {
	case http.StatusBadRequest:
		code, message = -32602, "Invalid params"
	case http.StatusNotFound:
		code, message = -32002, "Resource not found"
	}
	return acp.PromptResponse{}, rpcErr(code, message, r.Status, r.Type, r.Message)
}

// acpClient is the Client of an ACP prompt's turn: it records what the
// Turn machinery answers of its own (a success is the responder's), which
// answer turns into a JSON-RPC error.
type acpClient struct {
	// refusal is the first answer; nil for none.
	refusal *admission.Refusal
}

// Refuse records r, unless an answer came first.
func (c *acpClient) Refuse(r *admission.Refusal) {
	if c.refusal == nil {
		c.refusal = r
	}
}

// Done does nothing: the prompt's answer is written when its handler
// returns.
func (*acpClient) Done() {}

// acpResponder is the responder of an ACP prompt: the reply streams as
// agent_message_chunk notifications, each tool call as tool_call and
// tool_call_update; success and refusal are recorded for answer. It never opens an event
// stream, so every failure reaches acpClient as a refusal.
type acpResponder struct {
	a       *acpAgent
	id      acp.SessionId
	ok      bool
	refusal bool
}

// Begin is called before the turn's first model call.
func (*acpResponder) Begin(*turn.Output) {}

// Started is called once the model first answered.
func (*acpResponder) Started(*turn.Output) {}

// Delta relays a piece of the reply's text.
func (r *acpResponder) Delta(o *turn.Output, text string) {
	if o.Err != nil {
		return
	}
	if err := r.a.update(r.id, acp.UpdateAgentMessageText(text)); err != nil {
		// As a chunk an HTTP client does not take: the turn ends, unless
		// it completes whatever its client does.
		o.Fail(err)
	}
}

// Succeeded answers a turn that ended ok, once its commit is durable.
func (r *acpResponder) Succeeded(*turn.Output, string) { r.ok = true }

// Failed reports a failure on the open stream.
func (*acpResponder) Failed(*turn.Output, string, string) {}

// Refused records a prompt the model refused.
func (r *acpResponder) Refused(*turn.Output) { r.refusal = true }

// ToolCalls reports a tool round starting: a tool_call, in_progress, for
// each of its calls, as replay shows them.
func (r *acpResponder) ToolCalls(calls []openai.ToolCall) {
	for _, c := range calls {
		// A client that does not take it is gone: the connection's
		// writer breaks, and the server ends the prompt (serveACP).
		_ = r.a.update(r.id, toolCallStarted(c))
	}
}

// ToolResult reports a call's result: a tool_call_update, completed, with
// the result as its content.
func (r *acpResponder) ToolResult(call openai.ToolCall, result string) {
	_ = r.a.update(r.id, toolCallDone(call.ID, result))
}

// The SDK's Agent has methods the server does not offer (it advertises
// none of them): each is answered "method not found".

// Authenticate is not offered: the server advertises no auth method.
func (*acpAgent) Authenticate(context.Context, acp.AuthenticateRequest) (acp.AuthenticateResponse, error) {
	return acp.AuthenticateResponse{}, acp.NewMethodNotFound(acp.AgentMethodAuthenticate)
}

// Logout is not offered.
func (*acpAgent) Logout(context.Context, acp.LogoutRequest) (acp.LogoutResponse, error) {
	return acp.LogoutResponse{}, acp.NewMethodNotFound(acp.AgentMethodLogout)
}

// CloseSession is not offered.
func (*acpAgent) CloseSession(context.Context, acp.CloseSessionRequest) (acp.CloseSessionResponse, error) {
	return acp.CloseSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionClose)
}

// ListSessions is not offered.
func (*acpAgent) ListSessions(context.Context, acp.ListSessionsRequest) (acp.ListSessionsResponse, error) {
	return acp.ListSessionsResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionList)
}

// ResumeSession is not offered: session/load is.
func (*acpAgent) ResumeSession(context.Context, acp.ResumeSessionRequest) (acp.ResumeSessionResponse, error) {
	return acp.ResumeSessionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionResume)
}

// SetSessionConfigOption is not offered.
func (*acpAgent) SetSessionConfigOption(context.Context, acp.SetSessionConfigOptionRequest) (acp.SetSessionConfigOptionResponse, error) {
	return acp.SetSessionConfigOptionResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetConfigOption)
}

// SetSessionMode is not offered: the server has no modes.
func (*acpAgent) SetSessionMode(context.Context, acp.SetSessionModeRequest) (acp.SetSessionModeResponse, error) {
	return acp.SetSessionModeResponse{}, acp.NewMethodNotFound(acp.AgentMethodSessionSetMode)
}

// clientCaused is the handler of the ACP SDK's own log: what it logs is
// what the client sent it (a notification of no method, a line it could
// not read), never the server's fault, so none of it is an ERROR line a
// client could fill the server's log with: it is WARN at most. Its
// values, the client's text among them, are quoted by the handler below
// as any value is.
type clientCaused struct{ slog.Handler }

// Handle logs r, at WARN if it was above.
func (h clientCaused) Handle(ctx context.Context, r slog.Record) error {
	if r.Level <= slog.LevelWarn {
		return h.Handler.Handle(ctx, r)
	}
	capped := slog.NewRecord(r.Time, slog.LevelWarn, "acp client: "+r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		capped.AddAttrs(a)
		return true
	})
	capped.AddAttrs(slog.String("sdk_level", r.Level.String()))
	return h.Handler.Handle(ctx, capped)
}

// WithAttrs keeps the level cap on the handler with attrs.
func (h clientCaused) WithAttrs(attrs []slog.Attr) slog.Handler {
	return clientCaused{h.Handler.WithAttrs(attrs)}
}

// WithGroup keeps the level cap on the handler with the group.
func (h clientCaused) WithGroup(name string) slog.Handler {
	return clientCaused{h.Handler.WithGroup(name)}
}
