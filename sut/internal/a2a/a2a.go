// Package a2a is the adapter of the Agent2Agent protocol: JSON-RPC 2.0
// over HTTP at Path, its agent card at CardPath. A context is a
// conversation the server names in its answer to a message without one,
// kept in the store as sessions are; each message starts a task, which
// runs as one turn of its context on the engine, answered as a stream of
// task events (message/stream) or as the task at its end (message/send,
// always blocking). Tasks are kept in memory: a restart forgets them, not
// their contexts. tasks/cancel, or a client that drops its connection,
// interrupts the task's turn, judged by the interruption policy.
package a2a

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/store"
	"github.com/turncheck/turncheck/sut/internal/turn"
)

// Where the protocol is served.
const (
	Path     = "/a2a"
	CardPath = "/.well-known/agent-card.json"
)

// maxTasks bounds the finished tasks kept for tasks/get: the oldest go
// first.
const maxTasks = 4096

// taskOverhead is what a kept task costs besides its text: the task, its
// ids, its message and artifact (measured: under 400 bytes on amd64).
const taskOverhead = 512

// JSON-RPC's and A2A's error codes the server answers with.
const (
	codeParse          = -32700
	codeInvalidRequest = -32600
	codeNoMethod       = -32601
	codeInvalidParams  = -32602
	codeInternal       = -32603
	codeTaskNotFound   = -32001
	codeNotCancelable  = -32002
)

// Handler serves the protocol over the engine, keeping its tasks.
type Handler struct {
	*turn.Engine
	mu    sync.Mutex
	tasks map[string]*task
	order []string
}

// task is one message's work: a turn of its context.
type task struct {
	id, context, scope string
	user               message
	// state is the task's A2A state; reply the text its turn answered,
	// kept at its end.
	state, reply string
	// cancel ends the task's turn (tasks/cancel); cancelled says it was
	// asked, done that the turn ended.
	cancel    context.CancelFunc
	cancelled bool
	done      chan struct{}
	// cost is what the task holds of the memory budget (charge).
	cost int64
}

// The shapes of the protocol.
type (
	rpcRequest struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  string          `json:"method"`
		Params  json.RawMessage `json:"params"`
	}
	part struct {
		Kind string `json:"kind"`
		Text string `json:"text"`
	}
	message struct {
		Kind      string `json:"kind"`
		Role      string `json:"role"`
		MessageID string `json:"messageId"`
		ContextID string `json:"contextId,omitempty"`
		TaskID    string `json:"taskId,omitempty"`
		Parts     []part `json:"parts"`
	}
	status struct {
		State   string   `json:"state"`
		Message *message `json:"message,omitempty"`
	}
	artifact struct {
		ArtifactID string `json:"artifactId"`
		Parts      []part `json:"parts"`
	}
	taskObject struct {
		Kind      string     `json:"kind"`
		ID        string     `json:"id"`
		ContextID string     `json:"contextId"`
		Status    status     `json:"status"`
		History   []message  `json:"history,omitempty"`
		Artifacts []artifact `json:"artifacts,omitempty"`
	}
	statusUpdate struct {
		Kind      string `json:"kind"`
		TaskID    string `json:"taskId"`
		ContextID string `json:"contextId"`
		Status    status `json:"status"`
		Final     bool   `json:"final"`
	}
	artifactUpdate struct {
		Kind      string   `json:"kind"`
		TaskID    string   `json:"taskId"`
		ContextID string   `json:"contextId"`
		Artifact  artifact `json:"artifact"`
		Append    bool     `json:"append"`
	}
)

// Card serves the agent card: where JSON-RPC goes, and that it streams.
func (h *Handler) Card(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(turn.MustJSON(map[string]any{
		"name":               "turncheck reference server",
		"description":        "The reference session server: each context is a conversation kept durably.",
		"url":                "http://" + r.Host + Path,
		"version":            "1",
		"protocolVersion":    "0.3.0",
		"preferredTransport": "JSONRPC",
		"capabilities":       map[string]bool{"streaming": true},
		"defaultInputModes":  []string{"text/plain"},
		"defaultOutputModes": []string{"text/plain"},
		"skills": []map[string]any{{"id": "converse", "name": "converse", "tags": []string{"chat"},
			"description": "Answers each message in the context's conversation."}},
	}))
}

// RPC serves one JSON-RPC call, admitted as every turn request is.
func (h *Handler) RPC(w http.ResponseWriter, r *http.Request) {
	h.Gate.AdmitHTTP(w, r, nil, func(scope string, body []byte) {
		var req rpcRequest
		// Read as every API's body is (openai.DecodeStrict): one JSON
		// value in valid UTF-8, no key twice (a method given twice must
		// not run the last one).
		if err := openai.DecodeStrict(body, &req); err != nil {
			if strings.HasPrefix(strings.TrimSpace(string(body)), "[") {
				rpcError(w, nil, codeInvalidRequest, "batches are not served: send one call", http.StatusBadRequest)
				return
			}
			rpcError(w, nil, codeParse, "the body is not a JSON-RPC call: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(req.ID) > 0 && !turn.ValidRPCID(req.ID) {
			// An id the answer could not carry back as the client sent it.
			rpcError(w, nil, codeInvalidRequest, "id: want a string, a number or null", http.StatusBadRequest)
			return
		}
		if req.JSONRPC != "2.0" || req.Method == "" {
			rpcError(w, req.ID, codeInvalidRequest, `a call needs "jsonrpc": "2.0" and a method`, http.StatusBadRequest)
			return
		}
		if req.ID == nil {
			// A notification: JSON-RPC answers none, and A2A defines none
			// to act on, so nothing is run for it.
			w.WriteHeader(http.StatusNoContent)
			return
		}
		switch req.Method {
		case "message/send", "message/stream":
			h.message(w, r, scope, req)
		case "tasks/get":
			h.get(w, r, scope, req)
		case "tasks/cancel":
			h.cancelTask(w, r, scope, req)
		default:
			rpcError(w, req.ID, codeNoMethod, "method not found: "+req.Method+"; served: message/send, message/stream, tasks/get, tasks/cancel", http.StatusNotFound)
		}
	})
}

// rpcError answers a JSON-RPC error, its HTTP-like status in its data.
func rpcError(w http.ResponseWriter, id json.RawMessage, code int, msg string, status int) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(turn.MustJSON(map[string]any{"jsonrpc": "2.0", "id": rawID(id),
		"error": map[string]any{"code": code, "message": msg, "data": map[string]int{"status": status}}}))
}

// rpcResult is a JSON-RPC answer carrying result.
func rpcResult(id json.RawMessage, result any) string {
	return string(turn.MustJSON(map[string]any{"jsonrpc": "2.0", "id": rawID(id), "result": result}))
}

func rawID(id json.RawMessage) json.RawMessage {
	if len(id) == 0 {
		return json.RawMessage("null")
	}
	return id
}

// message serves message/send and message/stream: a task of the message's
// context, or of a new one, that runs the message as a turn.
func (h *Handler) message(w http.ResponseWriter, r *http.Request, scope string, req rpcRequest) {
	var p struct {
		Message message `json:"message"`
	}
	if err := json.Unmarshal(req.Params, &p); err != nil {
		rpcError(w, req.ID, codeInvalidParams, "params: want {message: {...}}: "+err.Error(), http.StatusBadRequest)
		return
	}
	m := p.Message
	var text strings.Builder
	for _, pt := range m.Parts {
		if pt.Kind != "text" {
			rpcError(w, req.ID, codeInvalidParams, "only text parts are served, not "+pt.Kind, http.StatusBadRequest)
			return
		}
		text.WriteString(pt.Text)
	}
	if text.Len() > turn.MaxContentBytes {
		rpcError(w, req.ID, codeInvalidParams, fmt.Sprintf("message: its text is over %d bytes", turn.MaxContentBytes), http.StatusBadRequest)
		return
	}
	if m.TaskID != "" && h.Cfg.Mutant == config.A2ATaskRerun {
		h.mu.Lock()
		old := h.tasks[m.TaskID]
		if old != nil && old.scope == scope && terminal(old.state) {
			// The bug: a message naming a task that ended runs that
			// task's message again, as a new task of its context.
			text.Reset()
			for _, pt := range old.user.Parts {
				text.WriteString(pt.Text)
			}
			m.ContextID, m.TaskID = old.context, ""
		}
		h.mu.Unlock()
	}
	switch {
	case m.Role != "user":
		rpcError(w, req.ID, codeInvalidParams, `message.role: want "user"`, http.StatusBadRequest)
		return
	case m.TaskID != "":
		rpcError(w, req.ID, codeInvalidParams, "message.taskId: every message starts a task of its own; no task waits for input", http.StatusBadRequest)
		return
	}
	user, err := h.NewUserMessage([]openai.Message{{Role: openai.RoleUser, Content: openai.Content(text.String())}})
	if err != nil {
		rpcError(w, req.ID, codeInvalidParams, "message: "+err.Error(), http.StatusBadRequest)
		return
	}
	t, refusal := h.open(r.Context(), scope, m)
	if refusal != nil {
		(&client{HTTP: turn.NewHTTP(w), w: w, id: req.ID}).Refuse(refusal)
		return
	}
	run := r.Context()
	if h.ignoresCancel() {
		// The bug: the task runs detached from its request, as an
		// executor run in a goroutine of its own does.
		run = context.WithoutCancel(run)
	}
	ctx, cancel := context.WithCancel(run)
	defer cancel()
	t.cancel = cancel
	t.user.Parts = []part{{Kind: "text", Text: text.String()}}
	h.add(t)
	resp := &responder{task: t, id: req.ID, stream: req.Method == "message/stream", h: h}
	c := &client{HTTP: turn.NewHTTP(w), w: w, id: req.ID, resp: resp}
	h.Converse(ctx, c, &turn.Turn{Key: contextKey(scope, t.context), Proto: config.ProtoA2A}, turn.UserInput(user), h.agent(), resp)
	h.mu.Lock()
	if t.cancelled && !terminal(t.state) {
		t.state = "canceled"
	}
	if !terminal(t.state) {
		// Refused, or ended by its client: it never ran to an end.
		t.state = "failed"
	}
	state := t.state
	h.mu.Unlock()
	close(t.done)
	if state == "canceled" && resp.o != nil && resp.o.Streaming() {
		resp.o.Write("", rpcResult(req.ID, statusUpdate{Kind: "status-update", TaskID: t.id, ContextID: t.context, Status: status{State: state}, Final: true}))
	}
}

// agent names the agent a new context runs with: an A2A server is one
// agent, the first it loaded (by its exact source key); a context resumes
// with the source it recorded, as every conversation does.
func (h *Handler) agent() string {
	if len(h.Sources.List) == 0 {
		return h.Cfg.ModelName
	}
	return h.Sources.List[0].Key
}

// open makes the task of message m: in its context, which must be scope's,
// or in a new one, stored before the task runs.
func (h *Handler) open(ctx context.Context, scope string, m message) (*task, *admission.Refusal) {
	t := &task{id: turn.NewID("task-"), context: m.ContextID, scope: scope, state: "submitted", done: make(chan struct{}),
		user: message{Kind: "message", Role: "user", MessageID: m.MessageID}}
	if t.context == "" {
		t.context = turn.NewID("ctx-")
		if err := h.Store.CreateSession(contextKey(scope, t.context)); err != nil {
			if store.StoreFull(err) {
				return nil, h.StoreFullRefusal(err, "no context was created")
			}
			h.Log.Error("create context", "err", err)
			return nil, admission.Refuse(http.StatusInternalServerError, "server_error", "the context could not be created")
		}
	} else {
		if err := turn.CheckID("contextId", t.context); err != nil {
			return nil, admission.Refuse(http.StatusBadRequest, "invalid_request_error", err.Error())
		}
		switch found, err := h.Store.SessionExists(ctx, contextKey(scope, t.context)); {
		case err != nil:
			return nil, admission.Refuse(http.StatusServiceUnavailable, "unavailable", "the context could not be read: retry shortly")
		case !found:
			return nil, admission.Refuse(http.StatusNotFound, "not_found", "no such context: send the first message of a conversation without a contextId")
		}
	}
	t.user.ContextID, t.user.TaskID = t.context, t.id
	return t, nil
}

// contextKey is where context id of scope is kept.
func contextKey(scope, id string) store.Key { return store.Key{Scope: scope, ID: turn.NsContext + id} }

// add keeps t for tasks/get and tasks/cancel, dropping the oldest finished
// task past maxTasks.
func (h *Handler) add(t *task) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.tasks == nil {
		h.tasks = map[string]*task{}
	}
	h.tasks[t.id] = t
	h.order = append(h.order, t.id)
	for i := 0; len(h.tasks) > maxTasks && i < len(h.order); i++ {
		if old := h.tasks[h.order[i]]; old != nil && terminal(old.state) {
			h.drop(i)
			i--
		}
	}
	h.charge(t, taskOverhead+int64(len(t.user.Parts[0].Text))) // its one text part (message)
}

// charge counts n more bytes of t in the memory budget, and lets go of
// finished tasks while the budget is over: first those that ended
// without a reply (failed, canceled, rejected: nothing of theirs was
// committed), then completed ones, oldest first. A running task is never
// let go of; tasks/get of one let go of finds no task, as after a
// restart. h.mu is held.
func (h *Handler) charge(t *task, n int64) {
	mem := h.Gate.Memory()
	if mem == nil {
		return
	}
	t.cost += n
	mem.Charge(n)
	for _, replied := range []bool{false, true} {
		for i := 0; mem.Over() && i < len(h.order); i++ {
			if old := h.tasks[h.order[i]]; old != nil && terminal(old.state) && (old.state == "completed") == replied {
				h.drop(i)
				i--
			}
		}
	}
}

// drop lets go of the task at place i of h.order, giving back its charge.
// h.mu is held.
func (h *Handler) drop(i int) {
	id := h.order[i]
	if t := h.tasks[id]; t != nil {
		if mem := h.Gate.Memory(); mem != nil {
			mem.Release(t.cost)
		}
		delete(h.tasks, id)
	}
	h.order = append(h.order[:i], h.order[i+1:]...)
}

// find is scope's task named by params ({"id"}), or nil.
func (h *Handler) find(scope string, params json.RawMessage) *task {
	var p struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(params, &p) != nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if t := h.tasks[p.ID]; t != nil && t.scope == scope {
		return t
	}
	return nil
}

// terminal reports whether a task in state has ended.
func terminal(state string) bool {
	return state == "completed" || state == "failed" || state == "canceled" || state == "rejected"
}

// get serves tasks/get: the task, its history its own messages.
func (h *Handler) get(w http.ResponseWriter, r *http.Request, scope string, req rpcRequest) {
	t := h.find(scope, req.Params)
	if t == nil {
		rpcError(w, req.ID, codeTaskNotFound, "task not found (tasks are kept in memory, until a restart)", http.StatusNotFound)
		return
	}
	obj := h.object(t)
	if h.Cfg.Mutant == config.A2ATaskHistoryContext {
		// The bug: the task's history is read from its context, whole.
		if conv, err := h.Convs.Peek(r.Context(), contextKey(scope, t.context)); err == nil {
			obj.History = nil
			for _, m := range conv.Messages {
				role := map[string]string{openai.RoleUser: "user", openai.RoleAssistant: "agent"}[m.Role]
				if role != "" && m.Content != "" {
					obj.History = append(obj.History, message{Kind: "message", Role: role, ContextID: t.context, Parts: []part{{Kind: "text", Text: string(m.Content)}}})
				}
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(rpcResult(req.ID, obj)))
}

// object is t as A2A shows a task.
func (h *Handler) object(t *task) taskObject {
	h.mu.Lock()
	defer h.mu.Unlock()
	obj := taskObject{Kind: "task", ID: t.id, ContextID: t.context, Status: status{State: t.state}, History: []message{t.user}}
	if t.state == "completed" {
		reply := []part{{Kind: "text", Text: t.reply}}
		obj.Artifacts = []artifact{{ArtifactID: "reply", Parts: reply}}
		obj.History = append(obj.History, message{Kind: "message", Role: "agent", MessageID: t.id + "-reply", ContextID: t.context, TaskID: t.id, Parts: reply})
	}
	return obj
}

// cancelTask serves tasks/cancel: it ends the task's turn, waits for it to
// end, and answers the task as it ended.
func (h *Handler) cancelTask(w http.ResponseWriter, r *http.Request, scope string, req rpcRequest) {
	t := h.find(scope, req.Params)
	if t == nil {
		rpcError(w, req.ID, codeTaskNotFound, "task not found (tasks are kept in memory, until a restart)", http.StatusNotFound)
		return
	}
	h.mu.Lock()
	ended := terminal(t.state)
	if !ended {
		t.cancelled = true
	}
	h.mu.Unlock()
	if ended {
		rpcError(w, req.ID, codeNotCancelable, "the task has ended: "+t.state, http.StatusConflict)
		return
	}
	if h.ignoresCancel() {
		// The bug: the task is answered canceled, and runs on.
		h.mu.Lock()
		t.state = "canceled"
		h.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(rpcResult(req.ID, h.object(t))))
		return
	}
	t.cancel()
	select {
	case <-t.done:
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(rpcResult(req.ID, h.object(t))))
}

// client answers what the engine answers of its own, a refusal or a
// failure before any stream opened: a JSON-RPC error, or, once the task
// began, the task as it ended.
type client struct {
	*turn.HTTP
	w    http.ResponseWriter
	id   json.RawMessage
	resp *responder
}

// Refuse answers r.
func (c *client) Refuse(r *admission.Refusal) {
	if r.Status == 0 {
		return // the client left before anything was worked on
	}
	if c.resp != nil && c.resp.begun {
		// The task began: it ends canceled (tasks/cancel), or failed.
		t := c.resp.task
		c.resp.h.mu.Lock()
		t.state = "failed"
		if t.cancelled {
			t.state = "canceled"
		}
		c.resp.h.mu.Unlock()
		obj := c.resp.h.object(t)
		if t.state == "failed" {
			obj.Status.Message = &message{Kind: "message", Role: "agent", MessageID: t.id + "-status", ContextID: t.context, TaskID: t.id, Parts: []part{{Kind: "text", Text: r.Message}}}
		}
		c.w.Header().Set("Content-Type", "application/json")
		_, _ = c.w.Write([]byte(rpcResult(c.id, obj)))
		return
	}
	code := codeInternal
	switch r.Status {
	case http.StatusBadRequest, http.StatusNotFound:
		// A context that is not there is a parameter the server cannot
		// serve, not a fault of its own.
		code = codeInvalidParams
	}
	if r.RetryAfter {
		// Overload reads as the gate's does: a 503 with Retry-After,
		// its body the JSON-RPC error.
		c.w.Header().Set("Retry-After", "1")
		c.w.Header().Set("Content-Type", "application/json")
		c.w.WriteHeader(http.StatusServiceUnavailable)
	}
	rpcError(c.w, c.id, code, r.Message, r.Status)
}

// responder writes a task's events (message/stream), or the task at its
// end (message/send).
type responder struct {
	h      *Handler
	task   *task
	id     json.RawMessage
	stream bool
	o      *turn.Output
	begun  bool
	chunks int
	// said: a2a-cancel-ignored's canceled was answered.
	said bool
}

// Begin announces the task, before its first model call: a client may
// cancel it from now on.
func (p *responder) Begin(o *turn.Output) {
	p.o, p.begun = o, true
	p.h.mu.Lock()
	p.task.state = "working"
	p.h.mu.Unlock()
	if p.stream {
		o.Open()
		o.Write("", rpcResult(p.id, p.h.object(p.task)))
	}
}

// Started does nothing: the stream opened with the task.
func (p *responder) Started(*turn.Output) {}

// ignoresCancel reports the a2a-cancel-ignored mutant.
func (h *Handler) ignoresCancel() bool { return h.Cfg.Mutant == config.A2ACancelIgnored }

// canceledAnyway reports, under a2a-cancel-ignored, a task the client
// cancelled, which runs on: the stream says canceled, once, and nothing
// more of it.
func (p *responder) canceledAnyway(o *turn.Output) bool {
	if !p.h.ignoresCancel() {
		return false
	}
	p.h.mu.Lock()
	cancelled := p.task.cancelled
	if cancelled {
		p.task.state = "canceled"
	}
	p.h.mu.Unlock()
	if !cancelled {
		return false
	}
	if !p.said {
		p.said = true
		if p.stream {
			o.Write("", rpcResult(p.id, statusUpdate{Kind: "status-update", TaskID: p.task.id, ContextID: p.task.context,
				Status: status{State: "canceled"}, Final: true}))
		} else {
			o.JSON(http.StatusOK, rpcResult(p.id, p.h.object(p.task)))
		}
	}
	return true
}

// Delta adds text to the task's reply artifact.
func (p *responder) Delta(o *turn.Output, text string) {
	if p.canceledAnyway(o) {
		return
	}
	// The reply is kept whole at the task's end (Succeeded); a task
	// shows none before, so the pieces are not summed here, which costs
	// the square of the reply's length in its pieces.
	if p.stream {
		o.Write("", rpcResult(p.id, artifactUpdate{Kind: "artifact-update", TaskID: p.task.id, ContextID: p.task.context,
			Artifact: artifact{ArtifactID: "reply", Parts: []part{{Kind: "text", Text: text}}}, Append: p.chunks > 0}))
		p.chunks++
	}
}

// Succeeded ends the task completed, its turn committed.
func (p *responder) Succeeded(o *turn.Output, reply string) {
	if p.canceledAnyway(o) {
		return
	}
	p.h.mu.Lock()
	p.task.state, p.task.reply = "completed", reply
	p.h.charge(p.task, int64(len(reply)))
	p.h.mu.Unlock()
	if !p.stream {
		o.JSON(http.StatusOK, rpcResult(p.id, p.h.object(p.task)))
		return
	}
	o.Write("", rpcResult(p.id, statusUpdate{Kind: "status-update", TaskID: p.task.id, ContextID: p.task.context,
		Status: status{State: "completed"}, Final: true}))
}

// Failed ends the task failed, on its stream.
func (p *responder) Failed(o *turn.Output, _, msg string) {
	if p.canceledAnyway(o) {
		return
	}
	p.h.mu.Lock()
	p.task.state = "failed"
	p.h.mu.Unlock()
	o.Write("", rpcResult(p.id, statusUpdate{Kind: "status-update", TaskID: p.task.id, ContextID: p.task.context, Final: true,
		Status: status{State: "failed", Message: &message{Kind: "message", Role: "agent", MessageID: p.task.id + "-status", ContextID: p.task.context, TaskID: p.task.id,
			Parts: []part{{Kind: "text", Text: msg}}}}}))
}
