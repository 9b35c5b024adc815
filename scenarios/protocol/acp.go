package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	acp "github.com/coder/acp-go-sdk"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// The causes of the Agent Client Protocol's outcomes.
const (
	CauseAgentExited  = "the agent exited mid-prompt"
	CauseNoModelReply = "end_turn without the model's whole reply (failed in the model)"
	CauseStopReason   = "stopReason "
	CauseRPCError     = "JSON-RPC error"
	// CauseNotCancelled is a prompt the client sent session/cancel for,
	// answered otherwise than cancelled: another stop reason, or a
	// JSON-RPC error (a wire finding).
	CauseNotCancelled = "answered after session/cancel, not cancelled"
	// CauseCancelledWith is a prompt the agent answered cancelled, or with
	// a JSON-RPC error, on the client's session/cancel for another prompt
	// of its session.
	CauseCancelledWith = "cancelled with another prompt of the session (session/cancel)"
)

// acpWire is the Agent Client Protocol: a conversation is a session of
// the agent (session/new, once, before its first turn), a turn is a
// session/prompt, its reply the agent_message_chunk updates streamed
// before the prompt's response, and its outcome the response's
// stopReason. After a restart a session comes back through session/load,
// whose replay of the conversation is kept for the model to judge
// (model.Turn.Replay).
type acpWire struct {
	mu  sync.Mutex
	srv targets.ACPServer
	// sessions are the conversations' sessions; a session made (or
	// loaded) on an earlier run of the agent is loaded again before its
	// next turn.
	sessions map[model.ConversationRef]*acpSession
}

// acpSession is one session of the agent, the prompts of it still
// unanswered, oldest first, and the reply text streamed since a prompt
// last took it. ACP does not say which prompt an update belongs to; an
// agent runs a session's prompts one at a time, though not necessarily
// in the order they were sent (two prompts sent at once race for the
// session), so the text streamed between two answers is the reply of
// the prompt answered second: the one that ran. A prompt answered
// without running (refused, cancelled while it waited) is answered while
// another may stream, and takes the text only if no other prompt of the
// session is unanswered (take). A prompt takes the text once its answer
// is read: text streamed for a later prompt before that would be taken
// with it. The harness's model holds each call of a step's turns until
// the answers before it were read, so none is.
type acpSession struct {
	id string
	// conn is the run of the agent the session is made or loaded on, nil
	// while it is on none.
	conn *targets.ACPConn
	// setup is the session/new or session/load of the session in flight,
	// nil if none is: every turn that wants the session on that run waits
	// for its answer.
	setup *acpSetup
	// stop ends the routing of the session's updates to it.
	stop    func()
	prompts []*acpPrompt
	// streamed is the reply text no prompt took yet; cut says a prompt
	// was answered since its last chunk without taking it: what streams
	// next may be another turn's, and is kept apart by a line break, so
	// that the tokens of two replies never run together.
	streamed strings.Builder
	cut      bool
	// loading collects a session/load's replay.
	loading *acpReplay
}

// acpSetup is a session/new or session/load in flight on the run conn,
// and, once done is closed, what it came to: the status and error a turn
// that waited on it is read as failing with, if it failed. A session is
// on a run only once its setup there has answered: a prompt sent before
// would reach an agent that does not have the session yet, and what it
// streamed would be read as the load's replay.
type acpSetup struct {
	conn   *targets.ACPConn
	done   chan struct{}
	status int
	err    error
}

// wait waits until the setup has answered, or ctx ends first, and returns
// what it came to.
func (op *acpSetup) wait(ctx context.Context, what string) (status int, err error) {
	select {
	case <-op.done:
		return op.status, op.err
	case <-ctx.Done():
		return 0, fmt.Errorf("%s (another prompt of the session's) was not answered within the client's time", what)
	}
}

// acpPrompt is one session/prompt in flight.
type acpPrompt struct {
	deny bool
	// later says that another prompt of the session was sent while this
	// one ran.
	later bool
	// cancelled says the client sent session/cancel for the session
	// while this prompt was unanswered: on its own abort, at the end of
	// its time, or on another prompt's abort (the cancel is the
	// session's, not a prompt's).
	cancelled bool
}

// take is the reply of a prompt of s answered with an end_turn (ran) or
// not, and ends the prompt's time among the unanswered: the text streamed
// since a prompt last took it, if the prompt ran, or if no other prompt
// of the session could have streamed it.
func (s *acpSession) take(p *acpPrompt, ran bool) string {
	for i, q := range s.prompts {
		if q == p {
			s.prompts = append(s.prompts[:i], s.prompts[i+1:]...)
			break
		}
	}
	if !ran && len(s.prompts) > 0 {
		s.cut = s.cut || s.streamed.Len() > 0
		return ""
	}
	reply := s.streamed.String()
	s.streamed.Reset()
	s.cut = false
	return reply
}

// acpReplay is what a session/load replayed: the text of each message,
// one per run of chunks of a kind.
type acpReplay struct {
	texts []string
	// kinds are the texts' kinds ("user", "agent"); kind the last one's.
	kinds []string
	kind  string
}

func newACP() *acpWire { return &acpWire{sessions: map[model.ConversationRef]*acpSession{}} }

// attach points the wire at the agent srv runs.
func (w *acpWire) attach(srv targets.Server) {
	if a, ok := srv.(targets.ACPServer); ok {
		w.mu.Lock()
		w.srv = a
		w.mu.Unlock()
	}
}

// update routes one session/update of s.
func (w *acpWire) update(s *acpSession, u acp.SessionUpdate) {
	w.mu.Lock()
	defer w.mu.Unlock()
	kind, text := "", ""
	switch {
	case u.UserMessageChunk != nil:
		kind, text = "user", blockText(u.UserMessageChunk.Content)
	case u.AgentMessageChunk != nil:
		kind, text = "agent", blockText(u.AgentMessageChunk.Content)
	default:
		return // thoughts, tool calls, plans: no token the harness follows
	}
	if r := s.loading; r != nil {
		if kind != r.kind || len(r.texts) == 0 {
			r.texts, r.kinds = append(r.texts, ""), append(r.kinds, kind)
			r.kind = kind
		}
		r.texts[len(r.texts)-1] += text
		return
	}
	if kind == "agent" && len(s.prompts) > 0 {
		if s.cut {
			addReply(&s.streamed, "\n")
			s.cut = false
		}
		addReply(&s.streamed, text)
	}
}

// deny answers a permission request of s's as its oldest prompt drew.
func (w *acpWire) deny(s *acpSession) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(s.prompts) > 0 && s.prompts[0].deny
}

// blockText is the text of a content block, "" for one without.
func blockText(b acp.ContentBlock) string {
	if b.Text != nil {
		return b.Text.Text
	}
	return ""
}

// conn is the connection to the agent's current run, nil if there is none.
func (w *acpWire) conn() *targets.ACPConn {
	w.mu.Lock()
	srv := w.srv
	w.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.ACP()
}

func (w *acpWire) request(ctx context.Context, c *Client, s plan.Send, msgs []openai.Message) Request {
	prompt := promptBlocks(msgs)
	req := Request{Conv: s.Conv, Method: acp.AgentMethodSessionPrompt, Stream: true, deny: s.Deny}
	id, status, err := w.session(ctx, c, s.Conv, &req)
	req.Session = id
	req.Body = RPCLine(acp.AgentMethodSessionPrompt, acp.PromptRequest{SessionId: acp.SessionId(id), Prompt: prompt})
	if err != nil {
		req.Unsent, req.unsentStatus = err.Error(), status
	}
	return req
}

// promptBlocks is the prompt of a turn: its last message's text if that is a
// user message, blank or not, and none (an empty prompt) otherwise. ACP's
// prompt carries only the user's content: the agent holds the rest.
func promptBlocks(msgs []openai.Message) []acp.ContentBlock {
	if len(msgs) == 0 || msgs[len(msgs)-1].Role != openai.RoleUser {
		return []acp.ContentBlock{}
	}
	return []acp.ContentBlock{acp.TextBlock(string(msgs[len(msgs)-1].Content))}
}

// session is conv's session id, made now if conv has none, or loaded now
// if it was made on an earlier run of the agent. A turn that finds the session being made or loaded on the
// run by another turn's request waits for that call's answer, and shares
// its failure, but not its replay, which the turn that loaded it
// carries. A session that cannot be made or loaded gives an error, and
// the status the turn is read as failing with: 404 for a session the
// agent no longer has (T7 judges whether it should have), 0 for a call
// the agent did not answer (it exited, or the client's time passed): no
// answer is no refusal.
//
// The calls it makes are added to req's Setup, as written to the agent,
// and what a load replayed is req's Replay (ReplayForeign: what of it is
// another check's).
func (w *acpWire) session(ctx context.Context, c *Client, conv model.ConversationRef, req *Request) (id string, status int, err error) {
	setup := &req.Setup
	conn := w.conn()
	if conn == nil {
		return "", 0, errors.New("no agent runs")
	}
	ctx, cancel := context.WithTimeout(ctx, c.profile.RequestTimeout())
	defer cancel()
	w.mu.Lock()
	s := w.sessions[conv]
	switch {
	case s != nil && s.conn == conn:
		w.mu.Unlock()
		return s.id, 0, nil
	case s != nil && s.setup != nil && s.setup.conn == conn:
		op := s.setup
		what := "session/load"
		if s.id == "" {
			what = "session/new"
		}
		w.mu.Unlock()
		status, err := op.wait(ctx, what)
		w.mu.Lock()
		id := s.id
		w.mu.Unlock()
		return id, status, err
	}
	op := &acpSetup{conn: conn, done: make(chan struct{})}
	defer close(op.done)
	if s == nil {
		s = &acpSession{setup: op}
		w.sessions[conv] = s
		w.mu.Unlock()
		params := acp.NewSessionRequest{Cwd: conn.Dir, McpServers: []acp.McpServer{}}
		*setup = append(*setup, RPCLine(acp.AgentMethodSessionNew, params))
		resp, err := conn.Conn().NewSession(ctx, params)
		if err != nil {
			op.status, op.err = setupFailed(ctx, conn, "session/new", err, 0)
			w.mu.Lock()
			// Not made: the next turn makes one.
			s.setup = nil
			if w.sessions[conv] == s {
				delete(w.sessions, conv)
			}
			w.mu.Unlock()
			return "", op.status, op.err
		}
		w.mu.Lock()
		s.id = string(resp.SessionId)
		w.mu.Unlock()
		w.watch(s, conn)
		w.mu.Lock()
		s.conn, s.setup = conn, nil
		w.mu.Unlock()
		return s.id, 0, nil
	}
	// The agent restarted since the session was made: only session/load
	// brings it back.
	if !conn.LoadSession() {
		w.mu.Unlock()
		return s.id, http.StatusNotFound, errors.New("the agent restarted, and does not advertise loadSession: the session cannot come back")
	}
	r := &acpReplay{}
	s.setup, s.loading = op, r
	w.mu.Unlock()
	// The replay streams before the load's answer: its updates are routed
	// to the session from now on.
	w.watch(s, conn)
	params := acp.LoadSessionRequest{SessionId: acp.SessionId(s.id), Cwd: conn.Dir, McpServers: []acp.McpServer{}}
	*setup = append(*setup, RPCLine(acp.AgentMethodSessionLoad, params))
	_, err = conn.Conn().LoadSession(ctx, params)
	w.mu.Lock()
	s.loading, s.setup = nil, nil
	if err == nil {
		s.conn = conn
	}
	w.mu.Unlock()
	if err != nil {
		// Not loaded on this run: an agent takes a prompt only on a
		// session made or loaded on its connection, so the next turn
		// loads it again rather than prompt it.
		w.unwatch(s)
		op.status, op.err = setupFailed(ctx, conn, "session/load", err, http.StatusNotFound)
		return s.id, op.status, op.err
	}
	req.Replay, req.ReplayForeign, req.ReplayForeignFrom = r.tokens(EpochTag(c.ns))
	return s.id, 0, nil
}

// tokens are the tokens the replay showed, in order: of this check's
// (tag's) conversations, and, apart, of another check's (a user message
// with another check's tag, and the agent's reply after it), which reach
// this session only through a leak (T5), with the tags of those checks.
func (r *acpReplay) tokens(tag string) (own, foreign []model.Token, from []string) {
	own = []model.Token{}
	leaks := model.Leaks{Tag: tag}
	for i, text := range r.texts {
		toks := model.Tokens(text)
		if leaks.Foreign(text, toks, r.kinds[i] == "user") {
			foreign = append(foreign, toks...)
			continue
		}
		own = append(own, toks...)
	}
	return own, foreign, leaks.From()
}

// ACP reports whether r is an ACP prompt (session/prompt), sent to an
// agent on its stdin rather than over HTTP.
func (r Request) ACP() bool { return r.Method == acp.AgentMethodSessionPrompt }

// RPCLine is a JSON-RPC 2.0 message of method with params, as the client
// writes it to an ACP agent, without the id the connection gives a
// request: what a report shows.
func RPCLine(method string, params any) json.RawMessage {
	b, err := json.Marshal(struct {
		JSONRPC string `json:"jsonrpc"`
		Method  string `json:"method"`
		Params  any    `json:"params"`
	}{"2.0", method, params})
	if err != nil {
		return json.RawMessage(`{"jsonrpc":"2.0","method":` + strconv.Quote(method) + `}`)
	}
	return b
}

// setupFailed is the status and error of a session/new or session/load
// (what) that failed with err: no status when the agent did not answer,
// its run having ended (refusal) or the client's time passed (the SDK
// then gives an error of its own, which is no refusal either), else the
// status the refusal gives, refused without one.
func setupFailed(ctx context.Context, conn *targets.ACPConn, what string, err error, refused int) (int, error) {
	if ctx.Err() != nil {
		return 0, fmt.Errorf("%s: no answer within the client's time", what)
	}
	return refusal(conn, err, refused), fmt.Errorf("%s: %w", what, rpcError(err))
}

// close stops routing the agent's updates to the wire's sessions.
func (w *acpWire) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.sessions {
		if s.stop != nil {
			s.stop()
		}
	}
}

// watch routes s's updates on conn to it, and no longer those of the run
// it was on. The session is on conn only once its setup there answered.
func (w *acpWire) watch(s *acpSession, conn *targets.ACPConn) {
	w.unwatch(s)
	stop := conn.Watch(s.id, &targets.ACPWatch{
		Update: func(u acp.SessionUpdate) { w.update(s, u) },
		Deny:   func() bool { return w.deny(s) },
	})
	w.mu.Lock()
	s.stop = stop
	w.mu.Unlock()
}

// unwatch stops routing s's updates, and forgets the run s was on.
func (w *acpWire) unwatch(s *acpSession) {
	w.mu.Lock()
	stop := s.stop
	s.stop, s.conn = nil, nil
	w.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// rpcError is err in words: a JSON-RPC error's message and code.
func rpcError(err error) error {
	var re *acp.RequestError
	if errors.As(err, &re) {
		msg := re.Message
		if re.Data != nil {
			if data, jerr := json.Marshal(re.Data); jerr == nil {
				msg += " " + ClipText(string(data), 200)
			}
		}
		return fmt.Errorf("%s (code %d)", msg, re.Code)
	}
	return err
}

// send sends a session/prompt and reads what it came to. Cancelling ctx
// is the client's abort: the harness sends session/cancel, and waits for
// the prompt's response, which must be cancelled (any other answer, a
// JSON-RPC error included, is a breach: wire), within the client's time.
func (w *acpWire) send(ctx context.Context, c *Client, req Request) Response {
	if req.Unsent != "" {
		return Response{Outcome: model.Fail, Status: req.unsentStatus, Detail: req.Unsent, Cause: CauseUnsent}
	}
	conn := w.conn()
	w.mu.Lock()
	s := w.sessions[req.Conv]
	current := s != nil && s.conn == conn
	w.mu.Unlock()
	if conn == nil || !current {
		// The agent restarted between the request's making and its
		// sending: the session is not on this run.
		return Response{Outcome: model.Unknown, Detail: "the agent restarted before the prompt was sent", Cause: CauseNoAnswer}
	}
	var params struct {
		Params acp.PromptRequest `json:"params"`
	}
	if err := json.Unmarshal(req.Body, &params); err != nil {
		return Response{Outcome: model.Fail, Detail: "the request's body: " + err.Error(), Cause: CauseUnsent}
	}
	p := &acpPrompt{deny: req.deny}
	w.mu.Lock()
	busy := len(s.prompts) > 0
	for _, q := range s.prompts {
		q.later = true
	}
	s.prompts = append(s.prompts, p)
	w.mu.Unlock()
	answered := false
	defer func() {
		if !answered {
			w.mu.Lock()
			s.take(p, false)
			w.mu.Unlock()
		}
	}()

	wait, cancel := context.WithTimeout(context.Background(), c.profile.RequestTimeout())
	defer cancel()
	cancelled := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		// The client's abort: ACP's is a notification, and the prompt
		// goes on to its answer.
		w.cancel(conn, s)
		close(cancelled)
	})
	resp, err := conn.Conn().Prompt(wait, params.Params)
	aborted := !stopWatch()
	if wait.Err() != nil && !aborted {
		// The client gives up on the prompt as an editor would: it
		// cancels it, so that it does not run on into the next step.
		w.cancel(conn, s)
	}
	if aborted {
		<-cancelled
	}
	w.mu.Lock()
	answered = true
	ran := err == nil && resp.StopReason == acp.StopReasonEndTurn
	out := Response{Reply: s.take(p, ran), StopReason: string(resp.StopReason)}
	later, cancelledBy := p.later, p.cancelled
	w.mu.Unlock()
	out.Breaches = conn.Breaches(s.id)
	// Under supersede, a prompt answered end_turn with only earlier
	// prompts in flight beside it outlasted them: whichever order the
	// agent took them in, each of those was cancelled (had it superseded
	// this one, this one would be answered cancelled), and what the
	// session said is this prompt's.
	overlapped := busy && !c.profile.Supersede || later
	out = readACP(out, req, err, aborted, busy, overlapped, conn, wait)
	switch {
	case aborted || out.TimedOut && cancelledBy:
		// The client cancelled the prompt itself: an interrupted turn,
		// whatever the agent answered (T10).
		out.Cancelled = true
	case cancelledBy && err == nil && resp.StopReason == acp.StopReasonCancelled:
		// Cancelled by the client's session/cancel for another prompt
		// of the session: ACP's cancel is the session's, so the client
		// asked for this too.
		out.Outcome, out.Status, out.Cancelled = model.Unknown, 0, true
		out.Cause = CauseCancelledWith
		out.Detail = "stopReason cancelled: the client sent session/cancel for another prompt of the session while this one was unanswered"
	case cancelledBy && out.Cause == CauseRPCError:
		// An error, once the client's session/cancel for another prompt
		// of the session asked this one cancelled too: ACP wants the
		// cancelled prompt turn answered cancelled, but says nothing of
		// a prompt that waited behind it. No breach, and no refusal
		// either: what stays of a turn the client cancelled is the
		// interruption policy's (T10).
		out.Outcome, out.Status, out.Cancelled = model.Unknown, 0, true
		out.Cause = CauseCancelledWith
		out.Detail = "a JSON-RPC error after the client sent session/cancel for another prompt of the session while this one was unanswered: " + out.Detail
	case (later || busy) && err == nil && resp.StopReason == acp.StopReasonCancelled && c.profile.Supersede:
		// Superseded by another prompt of its session, as the agent
		// declares it does: an interrupted turn, whose outcome the
		// interruption policy decides (T10). By one sent before it too:
		// an agent may take prompts sent at once in another order
		// (docker-agent's SDK serves each in a goroutine of its own).
		out.Outcome, out.Status, out.Preempted = model.Unknown, 0, true
		out.Detail = "stopReason cancelled: superseded by the next prompt of the session, as the agent declares (supersede)"
	case later && err == nil && resp.StopReason == acp.StopReasonCancelled:
		// Given up for the prompt sent after it: the session neither
		// queued that one nor refused it (T4).
		out.Preempted = true
		out.Detail = "stopReason cancelled, which the client did not ask for, once another prompt of the session was sent"
	}
	return out
}

// cancel sends session/cancel for s, the client's abort of its prompt,
// and marks every prompt of s unanswered as cancelled by the client: ACP
// cancels a session's prompt turn, not one request, so an agent may end
// them all.
func (w *acpWire) cancel(conn *targets.ACPConn, s *acpSession) {
	w.mu.Lock()
	for _, q := range s.prompts {
		q.cancelled = true
	}
	w.mu.Unlock()
	_ = conn.Conn().Cancel(context.Background(), acp.CancelNotification{SessionId: acp.SessionId(s.id)})
}

// readACP reads what a prompt came to: its response (or err), whether the
// client aborted it (sent session/cancel), whether another prompt of the
// session was in flight when it was sent (busy).
func readACP(out Response, req Request, err error, aborted, busy, overlapped bool, conn *targets.ACPConn, wait context.Context) Response {
	tok := requestToken(req)
	switch {
	case err != nil:
		select {
		case <-conn.Exited():
			out.Outcome, out.Detail, out.Cause = model.Unknown, "the agent exited before it answered the prompt", CauseAgentExited
			return out
		default:
		}
		if wait.Err() != nil {
			out.Outcome, out.TimedOut = model.Unknown, true
			out.Detail, out.Cause = "no response to session/prompt within the client's time", CauseTimedOut
			return out
		}
		var re *acp.RequestError
		if !errors.As(err, &re) || re.Code == -32603 && strings.Contains(fmt.Sprint(re.Data), "peer disconnected") {
			out.Outcome, out.Detail, out.Cause = model.Unknown, "no response: "+err.Error(), CauseAgentExited
			return out
		}
		out.Outcome, out.Detail, out.Cause = model.Fail, rpcError(err).Error(), CauseRPCError
		status, given := dataStatus(re)
		switch {
		case aborted:
			// An error after the client cancelled the prompt: ACP wants
			// the prompt turn answered cancelled, never an error (an
			// agent must catch what its abort raises). What stays is
			// judged all the same, as of an interrupted turn.
			out.Outcome, out.Cause = model.Unknown, CauseNotCancelled
			out.Detail = "the client sent session/cancel; " + out.Detail
			out.Breaches = append(out.Breaches, fmt.Sprintf("the prompt was answered with a JSON-RPC error after session/cancel (%s); ACP wants stopReason cancelled",
				ClipText(rpcError(err).Error(), 200)))
		case given:
			// The agent says what the failure was, as an HTTP server of
			// the same turns would have answered (the reference server
			// does): a model that failed is not a busy session.
			out.Status = status
		case busy:
			out.Status = http.StatusConflict
		case re.Code == -32602 || re.Code == -32600:
			out.Status = http.StatusBadRequest
		case re.Code == -32002:
			// ACP's "resource not found": the session is not the agent's.
			out.Status = http.StatusNotFound
		default:
			out.Status = http.StatusInternalServerError
		}
		return out
	case aborted:
		out.Outcome, out.Cause = model.Unknown, CauseAborted
		out.Detail = "the client sent session/cancel; stopReason " + out.StopReason
		if out.StopReason != string(acp.StopReasonCancelled) {
			out.Cause = CauseNotCancelled
			out.Breaches = append(out.Breaches, fmt.Sprintf("the prompt was answered %q after session/cancel; ACP wants cancelled", out.StopReason))
		}
		return out
	}
	switch acp.StopReason(out.StopReason) {
	case acp.StopReasonEndTurn:
		whole := tok == "" || slices.Contains(model.Tokens(out.Reply), tok.Reply()) && model.EndsWithCallMark(out.Reply)
		if !whole && overlapped {
			// Another prompt of the session ran beside this one: the
			// updates of both name only the session, and which text was
			// this prompt's reply cannot be told. Whether it committed,
			// later turns show (two prompts run at once are T4's).
			out.Outcome = model.Unknown
			out.Detail, out.Cause = "end_turn while another prompt of the session ran: its reply cannot be told from the other's", CauseNoModelReply
			return out
		}
		if !whole {
			// ACP has no stop reason for a turn that failed: an agent
			// that reports a model error as text and end_turn failed it.
			// The model's whole reply carries its token and, last, the
			// mark of the call it answers: a part of it streamed before
			// the model failed carries no mark, and an agent that adds
			// an error text after a reply whose stream then broke ends
			// with that text.
			out.Outcome, out.Status = model.Fail, http.StatusBadGateway
			out.Detail, out.Cause = "end_turn, and the reply is not the model's: "+ClipText(out.Reply, 200), CauseNoModelReply
			return out
		}
		out.Outcome = model.OK
	case acp.StopReasonRefusal:
		out.Outcome, out.Status = model.Fail, http.StatusBadRequest
		out.Detail, out.Cause = "stopReason refusal", CauseStopReason+out.StopReason
	case acp.StopReasonCancelled:
		// Cancelled without the client's asking: the agent gave the
		// turn up, for a newer prompt of the session if one came (a
		// refusal of the busy session, T4), else on its own.
		out.Outcome, out.Status = model.Fail, http.StatusInternalServerError
		if busy {
			out.Status = http.StatusConflict
		}
		out.Detail, out.Cause = "stopReason cancelled, which the client did not ask for", CauseStopReason+out.StopReason
	default:
		// max_tokens, max_turn_requests, or one ACP does not name: the
		// turn stopped short, and ACP does not say what the agent keeps
		// of it: whole or nothing, as an unknown outcome.
		out.Outcome = model.Unknown
		out.Detail, out.Cause = "stopReason "+out.StopReason, CauseStopReason+out.StopReason
	}
	return out
}

// refusal is the status the agent on conn refused a call with, err its
// answer (statusOf, with fallback), or 0 where err is no answer of the
// agent's: its run ended (it exited, its pipe closed) before or as the
// call was made, and the call is no evidence of anything. An agent that
// answered and then exited is taken for one that did not answer: that can
// only lose evidence, never make any.
func refusal(conn *targets.ACPConn, err error, fallback int) int {
	select {
	case <-conn.Exited():
		return 0
	case <-conn.Conn().Done():
		return 0
	default:
	}
	var re *acp.RequestError
	if !errors.As(err, &re) {
		return 0
	}
	if data, ok := re.Data.(map[string]any); ok && re.Code == -32603 {
		if why, _ := data["error"].(string); strings.HasPrefix(why, "peer disconnected") {
			return 0 // the SDK's word for a run that ended with the call open
		}
	}
	return statusOf(err, fallback)
}

// statusOf is the status err's data gives (dataStatus), else fallback.
func statusOf(err error, fallback int) int {
	var re *acp.RequestError
	if errors.As(err, &re) {
		if status, ok := dataStatus(re); ok {
			return status
		}
	}
	return fallback
}

// dataStatus is the HTTP-like status a JSON-RPC error's data gives as
// "status" (the reference server's: 502 for a model that failed, 409 for
// a busy session refused, 404 for an unknown session, ...), if it gives
// one from 400 up. ACP itself has no such field: an agent without it is
// read by the error's code and whether the session was busy.
func dataStatus(re *acp.RequestError) (int, bool) {
	data, ok := re.Data.(map[string]any)
	if !ok {
		return 0, false
	}
	var status int
	switch v := data["status"].(type) {
	case float64:
		status = int(v)
		if float64(status) != v {
			return 0, false
		}
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			return 0, false
		}
		status = int(n)
	default:
		return 0, false
	}
	if status < 400 || status > 599 {
		return 0, false
	}
	return status, true
}

// requestToken is the token of the user message a request carries, "" for
// none.
func requestToken(req Request) model.Token {
	var params struct {
		Params struct {
			Prompt []struct {
				Text string `json:"text"`
			} `json:"prompt"`
		} `json:"params"`
	}
	if json.Unmarshal(req.Body, &params) != nil || len(params.Params.Prompt) == 0 {
		return ""
	}
	toks := model.Tokens(params.Params.Prompt[0].Text)
	if len(toks) == 0 {
		return ""
	}
	return toks[0]
}

func (*acpWire) headers(*Client, Request) map[string]string { return nil }

// read is never called: ACP sends no HTTP (Client.Send calls send).
func (*acpWire) read(_ context.Context, _ Request, _ *http.Response, out Response) Response {
	return out
}

func (*acpWire) learn(Request, Response) {}

// restarted keeps the sessions: each is loaded again before its next turn.
func (*acpWire) restarted() {}
