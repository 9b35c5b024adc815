package protocol

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// The A2A methods the client calls.
const (
	a2aStream = "message/stream"
	a2aSend   = "message/send"
	a2aCancel = "tasks/cancel"
	a2aGet    = "tasks/get"
	// a2aCard is where an agent serves its agent card.
	a2aCard = "/.well-known/agent-card.json"
)

// The task states A2A names.
const (
	stateCompleted     = "completed"
	stateFailed        = "failed"
	stateCanceled      = "canceled"
	stateRejected      = "rejected"
	stateInputRequired = "input-required"
	stateAuthRequired  = "auth-required"
)

// The causes of A2A's own outcomes.
const (
	CauseTaskFailed   = "task failed"
	CauseTaskRejected = "task rejected"
	CauseTaskCanceled = "task canceled, not asked"
	CauseTaskStopped  = "task stopped, waiting on the client"
	CauseA2AError     = "JSON-RPC error"
	CauseA2AMidTask   = "JSON-RPC error after the task began"
)

// a2aPoll is how often the client reads a task whose end its stream did
// not bring (tasks/get): it decides how soon the outcome is known, never
// what it is.
const a2aPoll = 50 * time.Millisecond

// a2aWire is the Agent2Agent protocol: JSON-RPC 2.0 over HTTP. A
// conversation of the harness is a context: under context_ids: server
// its first message goes without a contextId, and the agent's answer
// gives it; under client the client names it. A turn is a message/stream
// (or, where the plan draws no stream, a blocking message/send) carrying
// the turn's user message alone: the agent keeps the rest.
type a2aWire struct {
	api *targets.A2AAPI
	mu  sync.Mutex
	// contexts are the contexts the agent named (context_ids: server).
	contexts map[model.ConversationRef]string
	// path is where the agent takes JSON-RPC, once known.
	path string
	// busy counts, per context, the turns in flight: a refusal while
	// another runs is the busy context's (T4). founding is, per
	// conversation, the turn in flight sent without a context (under
	// context_ids: server), whose answer will name it.
	busy     map[string]int
	founding map[model.ConversationRef]*founder
	// finished is, per conversation, the id of its last task that ended,
	// for a message that names it (plan.Send.FinishedTask).
	finished map[model.ConversationRef]string
	n        int
}

// founder is a conversation's turn sent without a context, in flight:
// named is closed once its answer named the context (a stream's first
// event; a message/send's answer, at the task's end), or it ended.
type founder struct {
	named chan struct{}
	once  sync.Once
}

// a2aBeside is a turn beside its conversation's first, held back until
// that one names the context: the JSON-RPC call it makes then.
type a2aBeside struct {
	first  *founder
	n      int
	method string
	params a2aSendParams
}

// awaitContext holds req, a turn beside its conversation's first, until
// that one named the context, and returns req in it. It returns why it
// is not sent where the first ended without naming one (it failed
// before its task began), or the client gave up first.
func (w *a2aWire) awaitContext(ctx context.Context, c *Client, req Request) (Request, string, string) {
	timer := time.NewTimer(c.profile.RequestTimeout())
	defer timer.Stop()
	select {
	case <-req.beside.first.named:
	case <-ctx.Done():
		return req, "the client gave it up while its conversation's first turn, still in flight, had not named the context", CauseNothingToName
	case <-timer.C:
		return req, "its conversation's first turn named no context within the client's time", CauseUnsent
	}
	if req.Goes != nil {
		// The harness lets the turns held back go one at a time, in the
		// order they were sent, so that they reach the server in an order
		// the seed decides, not a race.
		select {
		case <-req.Goes:
		case <-ctx.Done():
			return req, "the client gave it up before it could go", CauseNothingToName
		}
	}
	w.mu.Lock()
	contextID := w.contexts[req.Conv]
	w.mu.Unlock()
	if contextID == "" {
		return req, "its conversation's first turn ended without naming a context", CauseUnsent
	}
	b := req.beside
	b.params.Message.ContextID = contextID
	req.Session, req.Body, req.beside, req.Waits, req.Goes = contextID, rpcBody(b.n, b.method, b.params), nil, nil, nil
	return req, "", ""
}

// settle closes f.named: the context is known, or the turn ended.
func (f *founder) settle() { f.once.Do(func() { close(f.named) }) }

func newA2A(api *targets.A2AAPI) *a2aWire {
	return &a2aWire{api: api, contexts: map[model.ConversationRef]string{}, busy: map[string]int{},
		founding: map[model.ConversationRef]*founder{}, finished: map[model.ConversationRef]string{}}
}

// The JSON-RPC and A2A shapes the client writes and reads.
type (
	rpcCall struct {
		JSONRPC string `json:"jsonrpc"`
		ID      int    `json:"id"`
		Method  string `json:"method"`
		Params  any    `json:"params"`
	}
	rpcAnswer struct {
		Result json.RawMessage `json:"result"`
		Error  *rpcFailure     `json:"error"`
	}
	rpcFailure struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	}
	a2aPart struct {
		Kind string `json:"kind"`
		Text string `json:"text"`
	}
	a2aMessage struct {
		Kind      string    `json:"kind"`
		Role      string    `json:"role"`
		MessageID string    `json:"messageId"`
		ContextID string    `json:"contextId,omitempty"`
		TaskID    string    `json:"taskId,omitempty"`
		Parts     []a2aPart `json:"parts"`
	}
	a2aSendParams struct {
		Message       a2aMessage `json:"message"`
		Configuration struct {
			Blocking            bool     `json:"blocking"`
			AcceptedOutputModes []string `json:"acceptedOutputModes"`
		} `json:"configuration"`
	}
	// a2aResult is any result an agent answers a message with, or streams:
	// a task, a status or artifact update, or a message.
	a2aResult struct {
		Kind      string         `json:"kind"`
		ID        string         `json:"id"`
		TaskID    string         `json:"taskId"`
		ContextID string         `json:"contextId"`
		Status    *a2aStatus     `json:"status"`
		Final     bool           `json:"final"`
		Artifact  *a2aArtifact   `json:"artifact"`
		Append    bool           `json:"append"`
		Artifacts []a2aArtifact  `json:"artifacts"`
		History   []a2aInMessage `json:"history"`
		Role      string         `json:"role"`
		Parts     []a2aPart      `json:"parts"`
	}
	a2aStatus struct {
		State   string        `json:"state"`
		Message *a2aInMessage `json:"message"`
	}
	a2aArtifact struct {
		ArtifactID string    `json:"artifactId"`
		Parts      []a2aPart `json:"parts"`
	}
	a2aInMessage struct {
		Role  string    `json:"role"`
		Parts []a2aPart `json:"parts"`
	}
)

// text is the text of parts.
func text(parts []a2aPart) string {
	var b strings.Builder
	for _, p := range parts {
		if p.Kind == "text" || p.Kind == "" {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// terminal reports whether a task in state has ended, or stopped for the
// client (A2A's interrupted states).
func terminal(state string) bool {
	switch state {
	case stateCompleted, stateFailed, stateCanceled, stateRejected, stateInputRequired, stateAuthRequired:
		return true
	}
	return false
}

func (w *a2aWire) request(ctx context.Context, c *Client, s plan.Send, msgs []openai.Message) Request {
	w.mu.Lock()
	w.n++
	n := w.n
	contextID := c.ns + s.Conv.ID
	unsent, founds, otherKey, nothingToName := "", false, false, false
	var wait *founder
	if !w.api.ClientNamesContexts() {
		var ok bool
		if contextID, ok = w.contexts[s.Conv]; !ok {
			// A conversation with no context of its own whose id another
			// key's conversation has runs in that one's context: it must
			// not be found under this key (T5).
			contextID, otherKey = otherKeys(w.contexts, s.Conv, func(string) bool { return true })
		}
		switch f := w.founding[s.Conv]; {
		case contextID != "":
		case f != nil:
			// Two messages without a context are two contexts, not two
			// turns of one: a turn beside its conversation's first goes
			// once the context is known (send).
			wait = f
		default:
			founds = true
			w.founding[s.Conv] = &founder{named: make(chan struct{})}
		}
	}
	w.mu.Unlock()
	method := a2aSend
	if s.Stream {
		method = a2aStream
	}
	var params a2aSendParams
	params.Message = a2aMessage{Kind: "message", Role: "user", MessageID: fmt.Sprintf("%s%s-m%d", c.ns, s.Conv.ID, n),
		ContextID: contextID, Parts: messageParts(msgs)}
	if s.FinishedTask {
		w.mu.Lock()
		params.Message.TaskID = w.finished[s.Conv]
		w.mu.Unlock()
		if params.Message.TaskID == "" {
			unsent, nothingToName = "no task of its conversation is known to have ended, to name", true
		}
	}
	params.Configuration.Blocking = true
	params.Configuration.AcceptedOutputModes = []string{"text/plain"}
	abort := s.TaskAbort
	if s.DropsTask() {
		abort = plan.AbortDrop
	}
	req := Request{Conv: s.Conv, Stream: s.Stream, Session: contextID, taskAbort: abort,
		tok: s.Token, noUser: s.Token == "", founds: founds, OtherKey: otherKey}
	if wait != nil {
		req.beside = &a2aBeside{first: wait, n: n, method: method, params: params}
		req.Waits = wait.named
	}
	if unsent != "" {
		req.Unsent = unsent
		if nothingToName {
			req.unsentCause = CauseNothingToName
		}
		return req
	}
	path, err := w.endpoint(ctx, c, s.Replica)
	if err != nil {
		req.Unsent = err.Error()
	}
	req.Path = path
	req.Body = rpcBody(n, method, params)
	return req
}

// A2A reports whether r is an A2A message (message/stream or
// message/send): its Session is a context.
func (r Request) A2A() bool {
	var call struct {
		Method string `json:"method"`
	}
	return r.Method == "" && json.Unmarshal(r.Body, &call) == nil && (call.Method == a2aStream || call.Method == a2aSend)
}

// messageParts are the parts of a turn's message: its last message's text
// if that is a user message, blank or not, and none (a message without
// parts) otherwise. An A2A message carries only the user's content: the
// agent holds the rest.
func messageParts(msgs []openai.Message) []a2aPart {
	if len(msgs) == 0 || msgs[len(msgs)-1].Role != openai.RoleUser {
		return []a2aPart{}
	}
	return []a2aPart{{Kind: "text", Text: string(msgs[len(msgs)-1].Content)}}
}

// RPCBody is a JSON-RPC call of an A2A agent's, as a report shows it
// beside the turn it was sent for (a tasks/cancel).
func RPCBody(method string, params any) json.RawMessage { return rpcBody(1, method, params) }

// rpcBody is a JSON-RPC call, as sent.
func rpcBody(id int, method string, params any) []byte {
	raw, err := json.Marshal(rpcCall{JSONRPC: "2.0", ID: id, Method: method, Params: params})
	if err != nil {
		panic(err) // strings and plain structs always encode
	}
	return raw
}

// endpoint is where the agent takes JSON-RPC: the profile's path, or the
// path of its agent card's url, read once.
func (w *a2aWire) endpoint(ctx context.Context, c *Client, replica int) (string, error) {
	if w.api.Path != "" {
		return w.api.Path, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.path != "" {
		return w.path, nil
	}
	resp, out := c.do(ctx, replica, http.MethodGet, a2aCard, nil, nil, "")
	if resp == nil {
		return "", errors.New("its agent card could not be read: " + out.Detail)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	var card struct {
		URL string `json:"url"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &card) != nil || card.URL == "" {
		return "", fmt.Errorf("GET %s: status %d, no agent card with a url (say a2a.path in the profile): %s",
			a2aCard, resp.StatusCode, ClipText(string(raw), 200))
	}
	u, err := url.Parse(card.URL)
	if err != nil || !strings.HasPrefix(u.Path, "/") {
		return "", fmt.Errorf("GET %s: the card's url %q has no path (say a2a.path in the profile)", a2aCard, card.URL)
	}
	w.path = u.Path
	return w.path, nil
}

func (*a2aWire) headers(*Client, Request) map[string]string { return nil }

// read is never called: send reads the answer itself.
func (*a2aWire) read(_ context.Context, _ Request, _ *http.Response, out Response) Response {
	return out
}

func (*a2aWire) learn(Request, Response) {}

// restarted keeps the contexts: a durable agent has them after a restart,
// and the next turn of each goes on under its contextId.
func (*a2aWire) restarted() {}

// a2aTask is what the client learned of the task a turn started.
type a2aTask struct {
	id, context, state string
	// artifacts are the artifacts' texts, in the order they came.
	artifacts []string
	names     []string
	// status is the text of the last status message, message the text of
	// a message answered in place of a task.
	status, message string
	isMessage       bool
}

// apply learns what r says of the task; it says what is wrong with r
// for the context the client asked for (wantContext, "" for a new one).
func (t *a2aTask) apply(r a2aResult, wantContext string) error {
	if r.ContextID != "" {
		if wantContext != "" && r.ContextID != wantContext {
			return fmt.Errorf("a %s of context %q, for a message sent in context %q", cmp.Or(r.Kind, "result"), r.ContextID, wantContext)
		}
		if t.context == "" {
			t.context = r.ContextID
		}
	}
	id := r.TaskID
	if r.Kind == "task" {
		id = r.ID
	}
	if id != "" {
		if t.id != "" && id != t.id {
			return fmt.Errorf("a %s of task %q in the stream of task %q", r.Kind, id, t.id)
		}
		t.id = id
	}
	switch r.Kind {
	case "message":
		t.isMessage, t.message = true, t.message+text(r.Parts)
		if r.TaskID == "" {
			t.state = stateCompleted // a message answered in place of a task
		}
	case "artifact-update":
		if r.Artifact != nil {
			t.artifact(r.Artifact.ArtifactID, text(r.Artifact.Parts), r.Append)
		}
	case "task", "status-update":
		for _, a := range r.Artifacts {
			t.artifact(a.ArtifactID, text(a.Parts), false)
		}
	}
	if r.Status != nil && r.Status.State != "" {
		t.state = r.Status.State
		if r.Status.Message != nil {
			t.status = text(r.Status.Message.Parts)
		}
	}
	return nil
}

// artifact keeps an artifact's text: appended to the artifact of the same
// id, or in its place.
func (t *a2aTask) artifact(id, text string, appended bool) {
	if i := slices.Index(t.names, id); i >= 0 {
		if appended {
			t.artifacts[i] += text
		} else {
			t.artifacts[i] = text
		}
		return
	}
	t.names, t.artifacts = append(t.names, id), append(t.artifacts, text)
}

// reply is the agent's answer: its artifacts, or a message's text, or the
// last status message's.
func (t *a2aTask) reply() string {
	switch {
	case len(t.artifacts) > 0:
		return strings.Join(t.artifacts, "")
	case t.isMessage:
		return t.message
	}
	return t.status
}

// a2aSending is one turn on the wire: its task as the client learns it, and
// the client's abort.
type a2aSending struct {
	w   *a2aWire
	c   *Client
	req Request
	mu  sync.Mutex
	// task is the task's id once known; aborted says the client asked
	// for the task cancelled, cancelled that tasks/cancel was sent.
	task               string
	aborted, cancelled bool
	calls              sync.WaitGroup
	// stopped calls the request's Stopped once.
	stopped sync.Once
}

// saidStopped tells the harness, once, that the agent said the task the
// client cancelled ended canceled (Request.Stopped).
func (s *a2aSending) saidStopped() {
	if s.req.Stopped != nil {
		s.stopped.Do(s.req.Stopped)
	}
}

// known tells the sending the task's id: the client's cancel, if it asked
// for one before, goes now.
func (s *a2aSending) known(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.task == "" && id != "" {
		s.task = id
		s.cancelLocked()
	}
}

// abort is the client's tasks/cancel: sent at once if the task is known,
// else as soon as it is.
func (s *a2aSending) abort() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aborted = true
	s.cancelLocked()
}

// cancelLocked sends tasks/cancel once, when the client asked for it and
// the task is known; s.mu is held.
func (s *a2aSending) cancelLocked() {
	if !s.aborted || s.cancelled || s.task == "" {
		return
	}
	s.cancelled = true
	s.calls.Add(1)
	go func() {
		defer s.calls.Done()
		// The task's own stream, or tasks/get, says what the task came
		// to; the answer says only whether the agent stopped it.
		raw, err := s.call(a2aCancel, map[string]string{"id": s.task})
		var r a2aResult
		if err == nil && json.Unmarshal(raw, &r) == nil && r.Status != nil && r.Status.State == stateCanceled {
			s.saidStopped()
		}
	}()
}

// call makes one JSON-RPC call of the agent's, bounded by the client's
// time, and returns its result.
func (s *a2aSending) call(method string, params any) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.c.profile.RequestTimeout())
	defer cancel()
	s.w.mu.Lock()
	s.w.n++
	id := s.w.n
	s.w.mu.Unlock()
	resp, out := s.c.do(ctx, s.req.Replica, http.MethodPost, s.req.Path, rpcBody(id, method, params), nil, s.req.Conv.Key)
	if resp == nil {
		return nil, errors.New(out.Detail)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: status %d: %s", method, resp.StatusCode, ClipText(string(raw), 200))
	}
	var a rpcAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, fmt.Errorf("%s: not a JSON-RPC answer: %s", method, ClipText(string(raw), 200))
	}
	if a.Error != nil {
		return nil, fmt.Errorf("%s: %s (code %d)", method, a.Error.Message, a.Error.Code)
	}
	return a.Result, nil
}

// send sends a turn's message and reads what its task came to.
// Cancelling ctx is the client's abort, as the plan drew it: tasks/cancel,
// after which the client reads the task on to its end, or a dropped
// connection.
func (w *a2aWire) send(ctx context.Context, c *Client, req Request) Response {
	if req.founds {
		defer func() {
			w.mu.Lock()
			f := w.founding[req.Conv]
			delete(w.founding, req.Conv)
			w.mu.Unlock()
			f.settle()
		}()
	}
	if req.Unsent != "" {
		return Response{Outcome: model.Fail, Detail: req.Unsent, Cause: cmp.Or(req.unsentCause, CauseUnsent)}
	}
	if req.beside != nil {
		var why, cause string
		if req, why, cause = w.awaitContext(ctx, c, req); why != "" {
			return Response{Outcome: model.Fail, Detail: why, Cause: cause}
		}
		out := w.sendNow(ctx, c, req)
		out.Sent = &req
		return out
	}
	return w.sendNow(ctx, c, req)
}

// sendNow is send for a request complete as it stands.
func (w *a2aWire) sendNow(ctx context.Context, c *Client, req Request) Response {
	s := &a2aSending{w: w, c: c, req: req}
	defer s.calls.Wait()
	w.mu.Lock()
	busy := req.Session != "" && w.busy[req.Session] > 0
	w.busy[req.Session]++
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		if w.busy[req.Session]--; w.busy[req.Session] <= 0 {
			delete(w.busy, req.Session)
		}
		w.mu.Unlock()
	}()
	wire, drop := context.WithCancel(context.Background())
	defer drop()
	stopWatch := context.AfterFunc(ctx, func() {
		if req.taskAbort == plan.AbortCancel {
			s.abort()
		} else {
			drop()
		}
	})
	defer stopWatch()
	headers := map[string]string{"Accept": "text/event-stream, application/json"}
	if req.Tag != "" {
		headers[targets.RequestTagHeader] = req.Tag
	}
	resp, out := c.do(wire, req.Replica, http.MethodPost, req.Path, req.Body, headers, req.Conv.Key)
	if resp == nil {
		if ctx.Err() != nil && out.Cause == CauseAborted {
			out.Detail = "the client dropped the task's connection"
		}
		return out
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.StatusCode >= 400 {
			out.Outcome = model.Fail
			out.Detail, out.Cause = ClipText(strings.TrimSpace(string(raw)), 300), fmt.Sprintf("status %d", resp.StatusCode)
			if msg, _ := errorMessage(bytes.NewReader(raw)); !strings.HasPrefix(msg, "body not an OpenAI error") {
				out.Detail = msg
			}
			return out
		}
		out = unexpected(resp.StatusCode, out)
		out.Cause = fmt.Sprintf("status %d", resp.StatusCode)
		return out
	}
	task := &a2aTask{}
	return s.judge(task, busy, s.read(ctx, resp, task, out))
}

// read reads the answer to a turn's message into task: a stream of
// JSON-RPC answers (message/stream), or one (message/send), then, if that
// did not bring the task's end, tasks/get until it ends or the client's
// time passes. out's outcome is decided (and its Cause set) only where
// the answer decides it without the task's state: a JSON-RPC error, an
// answer that is not A2A's, a dropped connection.
func (s *a2aSending) read(ctx context.Context, resp *http.Response, task *a2aTask, out Response) Response {
	body := io.LimitReader(resp.Body, maxResponseBytes)
	media, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	// on reads one answer into task, or decides out; end says the task
	// ended.
	var end bool
	on := func(raw []byte) Response {
		var a rpcAnswer
		if err := json.Unmarshal(raw, &a); err != nil {
			return malformed(task.reply(), "JSON-RPC answer", out)
		}
		if a.Error != nil {
			return s.rpcError(a.Error, task, out)
		}
		var r a2aResult
		if err := json.Unmarshal(a.Result, &r); err != nil || r.Kind == "" {
			return malformed(task.reply(), "A2A result (no kind)", out)
		}
		if err := s.apply(task, r); err != nil {
			out.Breaches = append(out.Breaches, "the agent answered "+err.Error())
			out.Outcome, out.Detail, out.Cause = model.Unknown, "the agent answered "+err.Error(), CauseMalformed
			return out
		}
		end = terminal(task.state) || r.Final && task.state != ""
		return out
	}
	if media == "text/event-stream" {
		events := sse.NewReader(body)
		for {
			data, err := events.Next()
			if err != nil {
				if ctx.Err() != nil && s.req.taskAbort != plan.AbortCancel {
					return streamEnded(ctx, err, task.reply(), "", CauseAborted, out)
				}
				if task.id == "" {
					return streamEnded(ctx, err, task.reply(), "stream ended before the task's end", CauseNotCompleted, out)
				}
				break // the task's end is read with tasks/get
			}
			if out = on([]byte(data)); out.Cause != "" || end {
				out.Open = !drain(events, resp.Body)
				break
			}
		}
	} else {
		raw, err := io.ReadAll(body)
		if err != nil {
			return streamEnded(ctx, err, task.reply(), "", CauseNoAnswer, out)
		}
		if out = on(raw); out.Cause != "" {
			return out
		}
	}
	if out.Cause != "" || terminal(task.state) || task.id == "" {
		return out
	}
	// The answer ended before the task did (a blocking message/send the
	// agent answered at once, a stream that broke): its state is read.
	deadline := time.Now().Add(s.c.profile.RequestTimeout())
	for !terminal(task.state) && time.Now().Before(deadline) {
		raw, err := s.call(a2aGet, map[string]string{"id": task.id})
		var r a2aResult
		if err != nil || json.Unmarshal(raw, &r) != nil {
			out.Detail = "the task's answer ended before the task did, and tasks/get did not say more"
			if err != nil {
				out.Detail += ": " + err.Error()
			}
			return out
		}
		if err := s.apply(task, r); err != nil {
			out.Breaches = append(out.Breaches, "tasks/get answered "+err.Error())
			return out
		}
		if !terminal(task.state) {
			time.Sleep(a2aPoll)
		}
	}
	return out
}

// apply learns what r says of task, and tells the wire the task's id
// (for the client's cancel) and its context (for the conversation's next
// turns) the moment each is first known.
func (s *a2aSending) apply(task *a2aTask, r a2aResult) error {
	had := task.context
	if err := task.apply(r, s.req.Session); err != nil {
		return err
	}
	s.known(task.id)
	s.mu.Lock()
	asked := s.cancelled
	s.mu.Unlock()
	if asked && task.state == stateCanceled {
		s.saidStopped()
	}
	if had == "" && task.context != "" {
		s.w.learnContext(s.req, task)
	}
	return nil
}

// rpcError is out for a JSON-RPC error the agent answered a turn with:
// before the task began, a refusal, read as the status its data gives (the
// reference server's), or its code says; after, an unknown outcome.
func (s *a2aSending) rpcError(e *rpcFailure, task *a2aTask, out Response) Response {
	out.Detail = fmt.Sprintf("%s (code %d)", e.Message, e.Code)
	if task.id != "" {
		out.Outcome, out.Cause = model.Unknown, CauseA2AMidTask
		return out
	}
	out.Outcome, out.Cause = model.Fail, CauseA2AError
	var data struct {
		Status int `json:"status"`
	}
	switch {
	case json.Unmarshal(e.Data, &data) == nil && data.Status >= 400 && data.Status <= 599:
		out.Status = data.Status
	case e.Code == -32602 || e.Code == -32600 || e.Code == -32700:
		out.Status = http.StatusBadRequest
	case e.Code == -32001:
		out.Status = http.StatusNotFound // task not found
	case e.Code == -32601 || e.Code == -32004:
		out.Status = http.StatusNotImplemented // no such method, unsupported
	default:
		out.Status = http.StatusInternalServerError
	}
	return out
}

// judge reads the outcome off the task's state, where the answer did not
// decide it, and reads the task back (tasks/get) as a second window.
func (s *a2aSending) judge(task *a2aTask, busy bool, out Response) Response {
	out.ID = task.id
	out.Reply = clipReply(task.reply())
	s.mu.Lock()
	asked := s.aborted && s.cancelled
	if s.aborted && !s.cancelled {
		// The client's abort never reached the agent: the task was not
		// known yet to cancel, and the agent ran it on.
		out.RanOn = true
	}
	s.mu.Unlock()
	if out.Cause != "" {
		if busy && out.Cause == CauseA2AError && out.Status == http.StatusInternalServerError {
			// A2A has no word for a busy context: an error without a
			// status while another turn of the context runs is its
			// refusal (T4).
			out.Status = http.StatusConflict
		}
		if asked {
			out.Cancelled = out.Outcome != model.OK
		}
		return out
	}
	out.StopReason = task.state
	switch task.state {
	case stateCompleted:
		out.Outcome, out.Cause = model.OK, ""
		if asked {
			out.Detail = "the client sent tasks/cancel; the task completed first"
		}
	case stateFailed, stateRejected:
		out.Outcome, out.Status, out.Cause = model.Fail, http.StatusBadGateway, CauseTaskFailed
		if task.state == stateRejected {
			out.Status, out.Cause = http.StatusBadRequest, CauseTaskRejected
		}
		out.Detail = "task " + task.state
		if task.status != "" {
			out.Detail += ": " + ClipText(task.status, 200)
		}
		if busy && task.state == stateRejected {
			out.Status = http.StatusConflict // the busy context's refusal
		}
		if asked {
			// Ended so once the client asked it cancelled: what stays is
			// the interruption policy's (T10).
			out.Outcome, out.Status, out.Cancelled = model.Unknown, 0, true
		}
	case stateCanceled:
		if asked {
			out.Outcome, out.Cancelled = model.Unknown, true
			out.Detail, out.Cause = "the client sent tasks/cancel; the task ended canceled", CauseAborted
			break
		}
		out.Outcome, out.Status, out.Cause = model.Fail, http.StatusInternalServerError, CauseTaskCanceled
		out.Detail = "task canceled, which the client did not ask for"
		if busy {
			out.Status = http.StatusConflict
		}
	case stateInputRequired, stateAuthRequired:
		// The harness answers no question: the task is cancelled, and
		// whether it left anything is for later turns to show.
		s.abort()
		out.Outcome, out.Cause = model.Unknown, CauseTaskStopped
		out.Detail = "task stopped at " + task.state + "; the client cancelled it"
	default:
		out.Outcome, out.Cause = model.Unknown, CauseNotCompleted
		if out.Detail == "" {
			out.Detail = "the task did not end within the client's time"
			if task.state != "" {
				out.Detail += " (last state " + task.state + ")"
			}
		}
		if asked {
			out.Cancelled = true
		}
	}
	if task.id != "" && terminal(task.state) {
		s.w.mu.Lock()
		s.w.finished[s.req.Conv] = task.id
		s.w.mu.Unlock()
	}
	if task.id != "" && (task.state == stateCompleted || task.state == stateFailed || task.state == stateCanceled || task.state == stateRejected) {
		breaches, from := s.window(task)
		out.Breaches, out.ForeignFrom = append(out.Breaches, breaches...), from
	}
	return out
}

// window reads the finished task back (tasks/get): its history must hold
// the task's own user message, as the model was sent it, and no other,
// and no reply but the one to it. A task the agent no longer has, or one
// without history, shows nothing: A2A lets an agent keep neither. from
// are the tags of the other checks whose messages it showed.
func (s *a2aSending) window(task *a2aTask) (breaches, from []string) {
	raw, err := s.call(a2aGet, map[string]any{"id": task.id, "historyLength": 100})
	if err != nil {
		return nil, nil
	}
	var r a2aResult
	if json.Unmarshal(raw, &r) != nil || len(r.History) == 0 {
		return nil, nil
	}
	// The task's own are the tokens of the message the client sent (a
	// message sent again, say, carries an earlier turn's) and their
	// replies.
	var sent struct {
		Params struct {
			Message struct {
				Parts []a2aPart `json:"parts"`
			} `json:"message"`
		} `json:"params"`
	}
	_ = json.Unmarshal(s.req.Body, &sent)
	sentToks := model.Tokens(text(sent.Params.Message.Parts))
	var own, other []model.Token
	for _, m := range r.History {
		body := text(m.Parts)
		mine := true
		for _, t := range model.Tokens(body) {
			if t == s.req.tok || t == s.req.tok.Reply() || slices.Contains(sentToks, t) || slices.Contains(sentToks, t.User()) {
				own = append(own, t)
			} else {
				other, mine = append(other, t), false
			}
		}
		if !mine && model.OfAnotherCheck(body, EpochTag(s.c.ns)) {
			for _, t := range model.OtherChecks(body, EpochTag(s.c.ns)) {
				if !slices.Contains(from, t) {
					from = append(from, t)
				}
			}
		}
	}
	if len(other) > 0 {
		breaches = append(breaches, fmt.Sprintf("tasks/get of task %s shows %s in its history: messages the task did not send the model (it sent %s)",
			task.id, model.FormatTokens(other), whatSent(sentToks)))
	}
	if s.req.tok != "" && !slices.Contains(own, s.req.tok) {
		breaches = append(breaches, fmt.Sprintf("tasks/get of task %s shows a history without the task's own message, %s", task.id, s.req.tok))
	}
	return breaches, from
}

// learnContext keeps the context the agent named for a conversation that
// had none (context_ids: server), as soon as it names it: its next turns
// go on in it, and one that waits beside this one goes now.
func (w *a2aWire) learnContext(req Request, task *a2aTask) {
	if w.api.ClientNamesContexts() || req.Session != "" || task.context == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.contexts[req.Conv]; !ok {
		w.contexts[req.Conv] = task.context
	}
	if f := w.founding[req.Conv]; f != nil && req.founds {
		f.settle()
	}
}

// whatSent says what a task sent of tokens, for a breach.
func whatSent(toks []model.Token) string {
	if len(toks) == 0 {
		return "no message with a token"
	}
	return model.FormatTokens(toks)
}
