package sut

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/turncheck/turncheck/internal/openai"

	"github.com/turncheck/turncheck/sut/internal/config"

	"github.com/turncheck/turncheck/sut/internal/store"
)

// The Responses API, stateful (POST /v1/responses). A response is stored
// as a conversation of its own (nsResponse), holding the whole history up
// to and including its output, with its agent's source key: a request
// that names previous_response_id P runs on P's history and stores a new
// response; P never changes. Responses form a tree, so requests chaining
// from one P run at once without a lock: each sees P's history and its own
// input, never a sibling's. A request that names a conversation instead
// runs as a chat turn of that conversation, under its lock
// (nsResponseConversation).

// responsesRequest is a Responses API request, as the server reads it.
type responsesRequest struct {
	model string
	// input is the request's items; a string input is one user message.
	input    []openai.Message
	previous string
	// Store is false for a response that is not stored (not chainable).
	store        bool
	stream       bool
	conversation string
	// user names the end user; under Config.ResponsesLine, a request
	// that names no response runs on that user's conversation, as
	// openclaw's session key.
	user string
}

// responsesShape is what a Responses request looks like, for errors.
const responsesShape = `{"model","input","previous_response_id","store","stream","conversation"}`

// decodeResponsesRequest reads a Responses API request. Unknown members
// are ignored; a member of the wrong JSON type, a bound exceeded, or both
// previous_response_id and conversation are errors.
func decodeResponsesRequest(body []byte) (*responsesRequest, error) {
	top, err := decodeObject(body, responsesShape)
	if err != nil {
		return nil, err
	}
	req := &responsesRequest{store: true}
	for _, m := range []struct {
		name string
		v    any
		want string
	}{
		{"model", &req.model, "a string"},
		{"previous_response_id", &req.previous, "a string"},
		{"store", &req.store, "true or false"},
		{"stream", &req.stream, "true or false"},
		{"conversation", &req.conversation, "a string: the conversation's id"},
		{"user", &req.user, "a string"},
	} {
		if _, err := member(top, m.name, m.v, m.want); err != nil {
			return nil, err
		}
	}
	if req.input, err = decodeInput(top["input"]); err != nil {
		return nil, err
	}
	if err := req.check(top); err != nil {
		return nil, err
	}
	return req, nil
}

// decodeInput reads "input": a string, one user message, or an array of
// items (decodeItems). A blank string says nothing: it is refused, where
// a blank message among items is appended as any item is.
func decodeInput(raw json.RawMessage) ([]openai.Message, error) {
	if raw == nil || isNullJSON(raw) {
		return nil, errors.New(`"input" is required: a string, or an array of {"role","content"} items`)
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		if len(text) > MaxContentBytes {
			return nil, fmt.Errorf(`"input" is over %d bytes`, MaxContentBytes)
		}
		if strings.TrimSpace(text) == "" {
			return nil, errors.New(`"input" is blank: nothing to append`)
		}
		return []openai.Message{{Role: openai.RoleUser, Content: openai.Content(text)}}, nil
	}
	return decodeItems(raw, `"input"`)
}

// check checks the request's ids and bounds; top is its members, to tell
// a member given blank from one left out.
func (req *responsesRequest) check(top map[string]json.RawMessage) error {
	if len(req.model) > MaxModelBytes {
		return fmt.Errorf(`"model" is over %d bytes`, MaxModelBytes)
	}
	_, hasPrevious := top["previous_response_id"]
	_, hasConversation := top["conversation"]
	if hasPrevious && !isNullJSON(top["previous_response_id"]) {
		if err := checkID(`"previous_response_id"`, req.previous); err != nil {
			return err
		}
	}
	if hasConversation && !isNullJSON(top["conversation"]) {
		if err := checkID(`"conversation"`, req.conversation); err != nil {
			return err
		}
	}
	if req.previous != "" && req.conversation != "" {
		return errors.New(`name either "previous_response_id" or "conversation", not both`)
	}
	return nil
}

// responses serves POST /v1/responses.
func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	s.gate.AdmitHTTP(w, r, nil, func(scope string, body []byte) { s.responseTurn(w, r, scope, body) })
}

// errNoResponse is a previous_response_id that names no stored response
// of the request's key.
var errNoResponse = errors.New("previous response not found")

// responseTurn runs the turn of an admitted Responses request of scope.
func (s *Server) responseTurn(w http.ResponseWriter, r *http.Request, scope string, body []byte) {
	req, err := decodeResponsesRequest(body)
	if err != nil {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	if len(req.input) == 0 {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", `"input" is empty: nothing to append`)
		return
	}
	resp := s.newResponseResponder(req)
	if req.conversation != "" {
		t := &turn{key: store.Key{Scope: scope, ID: nsResponseConversation + req.conversation}, proto: config.ProtoResponses}
		s.converse(r.Context(), NewHTTP(w), t, req.input, req.model, resp)
		return
	}
	if s.cfg.ResponsesLine {
		// The line of the response named, or the user's, or a new one;
		// the response this turn makes is of the same line.
		line, ok := lineOf(req.previous)
		key := nsResponseLine + s.lineEpoch + line
		switch {
		case ok:
		case req.previous == "" && req.user != "" && checkID(`"user"`, req.user) == nil && !strings.Contains(req.user, "_"):
			line = "user-" + req.user
			key = nsResponseLine + line
		default:
			line = newID("")
			key = nsResponseLine + s.lineEpoch + line
		}
		resp.obj.ID = lineResponseID(line)
		resp.obj.Store = true // store: false is ignored
		t := &turn{key: store.Key{Scope: scope, ID: key}, proto: config.ProtoResponses}
		s.converse(r.Context(), NewHTTP(w), t, req.input, req.model, resp)
		return
	}
	// A response of its own: no lock, as nothing but this turn can ever
	// write its id, and the response it chains from never changes.
	t := &turn{key: store.Key{Scope: scope, ID: nsResponse + resp.obj.ID}, proto: config.ProtoResponses, chained: true,
		stateful: req.store || s.cfg.Mutant == config.StoreFalseKept, release: func() {}}
	// Every way out releases the lock the branch-mutates-base mutant
	// takes (lockBase); t.release is read when the function returns, as
	// lockBase replaces it.
	defer func() { t.release() }()
	base := &store.Conversation{}
	if req.previous != "" {
		err = s.lockBase(r.Context(), t, req.previous)
		if err == nil {
			base, err = s.loadResponse(store.WithConn(r.Context(), t.conn), scope, req.previous)
		}
		if err != nil {
			s.refuseResponse(w, r, t, req.previous, err)
			return
		}
	}
	c := NewHTTP(w)
	if !s.prepare(c, t, base, req.input, req.model) {
		return
	}
	s.run(r.Context(), c, t, resp)
}

// lineResponseID is a new id of a response of line (Config.ResponsesLine):
// resp_LINE_RANDOM.
func lineResponseID(line string) string { return newID("resp_" + line + "_") }

// lineOf is the line a response id of lineResponseID names; false for an
// ID of no line.
func lineOf(id string) (string, bool) {
	rest, ok := strings.CutPrefix(id, "resp_")
	line, _, found := strings.Cut(rest, "_")
	return line, ok && found && line != ""
}

// checkToolInput refuses a Responses request's input whose client tool
// items do not pair, as OpenAI refuses it: an output that answers no call
// of the history or of the input before it ("no tool call found for
// function call output"), a call answered twice, or a call of the input
// left without its output. A model must never be sent a tool result
// without its call, nor a call without its result (T9).
func checkToolInput(history []*store.Message, input []openai.Message) error {
	if !slices.ContainsFunc(input, func(m openai.Message) bool { return m.Role == openai.RoleTool || len(m.ToolCalls) > 0 }) {
		return nil // nothing to pair: the history's calls are paired already
	}
	open := map[string]bool{} // calls not answered yet
	for _, m := range history {
		for _, c := range m.ToolCalls {
			open[c.ID] = true
		}
		if m.Role == openai.RoleTool {
			delete(open, m.ToolCallID)
		}
	}
	asked := map[string]bool{}
	for _, m := range input {
		for _, c := range m.ToolCalls {
			open[c.ID], asked[c.ID] = true, true
		}
		if m.Role != openai.RoleTool {
			continue
		}
		if !open[m.ToolCallID] {
			return fmt.Errorf("no tool call found for function call output with call_id %.300q: it answers no open call of the history or the input", m.ToolCallID)
		}
		delete(open, m.ToolCallID)
		delete(asked, m.ToolCallID)
	}
	for _, m := range input {
		for _, c := range m.ToolCalls {
			if asked[c.ID] {
				return fmt.Errorf("no tool output found for function call %.300q: send its function_call_output with it", c.ID)
			}
		}
	}
	return nil
}

// replayOnToolOutput is input, but under the replay-on-tool-output mutant,
// for an input without a usable user message (a client tool's output, a
// blank message), input followed by the last user message of the history
// it continues: that turn runs again as if it were new.
func (s *engine) replayOnToolOutput(base *store.Conversation, input []openai.Message) []openai.Message {
	if s.cfg.Mutant != config.ReplayOnToolOutput || slices.ContainsFunc(input, usable) {
		return input
	}
	for i := len(base.Messages) - 1; i >= 0; i-- {
		if m := base.Messages[i]; m.Role == openai.RoleUser && usable(m.Message) {
			return append(slices.Clip(input), openai.Message{Role: openai.RoleUser, Content: m.Content})
		}
	}
	return input
}

// lockBase takes, under the branch-mutates-base mutant alone, the lock of
// the response previous that turn t chains from, and makes t.release give
// it up. That mutant runs the turn on previous's cached history itself
// (workingCopy), so the requests chained from one response must run one
// after the other, or they would write that history at once. They wait
// their turn whatever the server's concurrency policy, which is about
// Conversations: the bug is a sibling's turn in the history, not a
// refusal. The lock is held with no other (no other request locks a
// response's id), so it cannot deadlock, and it is taken before the load,
// so that what is loaded, and cached, is the history as it stands.
//
// The release first takes back, under the lock, what a turn that did not
// Commit (it failed, its client left, it was not stored) put in the
// history: the buggy server keeps a turn that completed, and only that, so
// its bug is a sibling's turn showing (T4), not a failed one's (T1). It
// runs once, as a second release could find the history another turn's.
func (s *Server) lockBase(ctx context.Context, t *turn, previous string) error {
	if s.cfg.Mutant != config.BranchMutatesBase {
		return nil
	}
	conn, unlock, err := s.locks.Lock(ctx, store.Key{Scope: t.key.Scope, ID: nsResponse + previous}, config.Serialize, s.cfg.RequestTimeout)
	if err != nil {
		return err
	}
	// The turn loads and commits on the lock's connection.
	t.conn = conn
	var once sync.Once
	t.release = func() {
		once.Do(func() {
			// t.work is nil for a turn refused before it was prepared.
			if t.work != nil && t.committed == 0 {
				t.work.Messages = t.work.Messages[:t.own]
				for _, i := range t.hid {
					t.work.Messages[i].Hidden = false
				}
			}
			unlock()
		})
	}
	return nil
}

// loadResponse returns the stored response id of scope: its whole
// history. One never stored, not stored (store:false), failed, or stored
// under another key is errNoResponse. The response-cross-key mutant looks
// the id up under whichever key stored it.
func (s *Server) loadResponse(ctx context.Context, scope, id string) (*store.Conversation, error) {
	k := store.Key{Scope: scope, ID: nsResponse + id}
	if s.cfg.Mutant == config.ResponseCrossKey {
		// The bug: the id alone names the response, whoever asks.
		found, ok, err := s.store.ScopeOf(ctx, k.ID)
		if err != nil {
			return nil, err
		}
		if ok {
			k.Scope = found
		}
	}
	// A stored response never changes, so what is loaded may be cached
	// without its lock.
	c, err := s.convs.Get(ctx, k)
	if err != nil {
		return nil, err
	}
	if len(c.Messages) == 0 {
		return nil, errNoResponse
	}
	return c, nil
}

// refuseResponse answers a request whose previous response did not load:
// 404 previous_response_not_found, or as a conversation that did not load.
func (s *Server) refuseResponse(w http.ResponseWriter, r *http.Request, t *turn, previous string, err error) {
	if !errors.Is(err, errNoResponse) {
		s.refuse(r.Context(), NewHTTP(w), t, err)
		return
	}
	writeCodedError(w, http.StatusNotFound, "invalid_request_error", "previous_response_not_found",
		fmt.Sprintf("previous response %.300q not found: it was never stored, failed, or is another key's", previous))
}

// Responses API wire objects.
type (
	// responseObject is a response, as answered and as streaming events
	// carry it.
	responseObject struct {
		ID                 string         `json:"id"`
		Object             string         `json:"object"`
		CreatedAt          int64          `json:"created_at"`
		Status             string         `json:"status"`
		Model              string         `json:"model"`
		PreviousResponseID *string        `json:"previous_response_id"`
		Output             []responseItem `json:"output"`
		Store              bool           `json:"store"`
		Error              *responseError `json:"error"`
	}
	// responseItem is an output item: the assistant's message.
	responseItem struct {
		Type    string         `json:"type"`
		ID      string         `json:"id"`
		Role    string         `json:"role"`
		Status  string         `json:"status"`
		Content []responseText `json:"content"`
	}
	// responseText is the text of an output message.
	responseText struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Annotations []any  `json:"annotations"`
	}
	// responseError says why a response failed; its code is the error
	// type a chat answer would carry.
	responseError struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
)

// The statuses of a response.
const (
	responseInProgress = "in_progress"
	responseCompleted  = "completed"
	responseFailed     = "failed"
)

// responseResponder answers a Responses turn: a response object, or a
// stream of named events that opens, before the first model call, with
// response.created, so that a client that drops mid-turn knows the id.
type responseResponder struct {
	obj    responseObject
	itemID string
	stream bool
	// seq numbers the stream's events.
	seq int
}

// newResponseResponder returns the responder of req, with the response's
// ID minted.
func (s *Server) newResponseResponder(req *responsesRequest) *responseResponder {
	model := req.model
	if model == "" {
		model = s.cfg.ModelName
	}
	var previous *string
	if req.previous != "" {
		previous = &req.previous
	}
	return &responseResponder{
		obj: responseObject{ID: newID("resp_"), Object: "response", CreatedAt: time.Now().Unix(),
			Model: model, PreviousResponseID: previous, Output: []responseItem{}, Store: req.store},
		itemID: newID("msg_"),
		stream: req.stream,
	}
}

func (p *responseResponder) begin(o *output) {
	if p.stream {
		o.open()
		p.emit(o, "response.created", map[string]any{"response": p.response(responseInProgress)})
	}
}

// started does nothing: the stream, if any, opened with the turn.
func (p *responseResponder) started(*output) {}

func (p *responseResponder) delta(o *output, text string) {
	if p.stream {
		p.emit(o, "response.output_text.delta", map[string]any{
			"item_id": p.itemID, "output_index": 0, "content_index": 0, "delta": text})
	}
}

func (p *responseResponder) succeeded(o *output, reply string) {
	done := p.response(responseCompleted)
	done.Output = []responseItem{{Type: "message", ID: p.itemID, Role: openai.RoleAssistant, Status: responseCompleted,
		Content: []responseText{{Type: "output_text", Text: reply, Annotations: []any{}}}}}
	if !p.stream {
		o.json(http.StatusOK, string(mustJSON(done)))
		return
	}
	p.emit(o, "response.completed", map[string]any{"response": done})
}

// failed ends the stream with response.failed; response.created always
// came first, so a failure always has its response.
func (p *responseResponder) failed(o *output, typ, msg string) {
	failed := p.response(responseFailed)
	failed.Error = &responseError{Code: typ, Message: msg}
	p.emit(o, "response.failed", map[string]any{"response": failed})
}

// response is the response object with status.
func (p *responseResponder) response(status string) *responseObject {
	r := p.obj
	r.Status = status
	return &r
}

// emit writes one event of type typ: fields, with its type and its
// sequence number.
func (p *responseResponder) emit(o *output, typ string, fields map[string]any) {
	fields["type"] = typ
	fields["sequence_number"] = p.seq
	p.seq++
	o.write(typ, string(mustJSON(fields)))
}
