// Package responses is the adapter of the Responses API, stateful
// (POST /v1/responses).
package responses

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/store"
	"github.com/turncheck/turncheck/sut/internal/turn"
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
	top, err := turn.DecodeObject(body, responsesShape)
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
		if _, err := turn.Member(top, m.name, m.v, m.want); err != nil {
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
	if raw == nil || turn.IsNullJSON(raw) {
		return nil, errors.New(`"input" is required: a string, or an array of {"role","content"} items`)
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		if len(text) > turn.MaxContentBytes {
			return nil, fmt.Errorf(`"input" is over %d bytes`, turn.MaxContentBytes)
		}
		if strings.TrimSpace(text) == "" {
			return nil, errors.New(`"input" is blank: nothing to append`)
		}
		return []openai.Message{{Role: openai.RoleUser, Content: openai.Content(text)}}, nil
	}
	return turn.DecodeItems(raw, `"input"`)
}

// check checks the request's ids and bounds; top is its members, to tell
// a member given blank from one left out.
func (req *responsesRequest) check(top map[string]json.RawMessage) error {
	if len(req.model) > turn.MaxModelBytes {
		return fmt.Errorf(`"model" is over %d bytes`, turn.MaxModelBytes)
	}
	_, hasPrevious := top["previous_response_id"]
	_, hasConversation := top["conversation"]
	if hasPrevious && !turn.IsNullJSON(top["previous_response_id"]) {
		if err := turn.CheckID(`"previous_response_id"`, req.previous); err != nil {
			return err
		}
	}
	if hasConversation && !turn.IsNullJSON(top["conversation"]) {
		if err := turn.CheckID(`"conversation"`, req.conversation); err != nil {
			return err
		}
	}
	if req.previous != "" && req.conversation != "" {
		return errors.New(`name either "previous_response_id" or "conversation", not both`)
	}
	return nil
}

// Responses serves POST /v1/responses.
func (s *Handler) Responses(w http.ResponseWriter, r *http.Request) {
	s.Gate.AdmitHTTP(w, r, nil, func(scope string, body []byte) { s.responseTurn(w, r, scope, body) })
}

// errNoResponse is a previous_response_id that names no stored response
// of the request's key.
var errNoResponse = errors.New("previous response not found")

// responseTurn runs the turn of an admitted Responses request of scope.
func (s *Handler) responseTurn(w http.ResponseWriter, r *http.Request, scope string, body []byte) {
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
		t := &turn.Turn{Key: store.Key{Scope: scope, ID: turn.NsResponseConversation + req.conversation}, Proto: config.ProtoResponses}
		s.Converse(r.Context(), turn.NewHTTP(w), t, req.input, req.model, resp)
		return
	}
	if s.Cfg.ResponsesLine {
		// The line of the response named, or the user's, or a new one;
		// the response this turn makes is of the same line.
		line, ok := lineOf(req.previous)
		key := turn.NsResponseLine + s.LineEpoch + line
		switch {
		case ok:
		case req.previous == "" && req.user != "" && turn.CheckID(`"user"`, req.user) == nil && !strings.Contains(req.user, "_"):
			line = "user-" + req.user
			key = turn.NsResponseLine + line
		default:
			line = turn.NewID("")
			key = turn.NsResponseLine + s.LineEpoch + line
		}
		resp.obj.ID = lineResponseID(line)
		resp.obj.Store = true // store: false is ignored
		t := &turn.Turn{Key: store.Key{Scope: scope, ID: key}, Proto: config.ProtoResponses}
		s.Converse(r.Context(), turn.NewHTTP(w), t, req.input, req.model, resp)
		return
	}
	// A response of its own: no lock, as nothing but this turn can ever
	// write its id, and the response it chains from never changes.
	t := &turn.Turn{Key: store.Key{Scope: scope, ID: turn.NsResponse + resp.obj.ID}, Proto: config.ProtoResponses, Chained: true,
		Stateful: req.store || s.Cfg.Mutant == config.StoreFalseKept, Release: func() {}}
	// Every way out releases the lock the branch-mutates-base mutant
	// takes (lockBase); t.release is read when the function returns, as
	// lockBase replaces it.
	defer func() { t.Release() }()
	base := &store.Conversation{}
	if req.previous != "" {
		err = s.lockBase(r.Context(), t, req.previous)
		if err == nil {
			base, err = s.loadResponse(store.WithLease(r.Context(), t.Lease), scope, req.previous)
			t.Lease.Rest()
		}
		if err != nil {
			s.refuseResponse(w, r, t, req.previous, err)
			return
		}
	}
	c := turn.NewHTTP(w)
	if !s.Prepare(c, t, base, req.input, req.model) {
		return
	}
	s.Run(r.Context(), c, t, resp)
}

// lineResponseID is a new id of a response of line (Config.ResponsesLine):
// resp_LINE_RANDOM.
func lineResponseID(line string) string { return turn.NewID("resp_" + line + "_") }

// lineOf is the line a response id of lineResponseID names; false for an
// id of no line.
func lineOf(id string) (string, bool) {
	rest, ok := strings.CutPrefix(id, "resp_")
	line, _, found := strings.Cut(rest, "_")
	return line, ok && found && line != ""
}

// lockBase takes, under the branch-mutates-base mutant alone, the lock of
// the response previous that turn t chains from, and makes t.release give
// it up. That mutant runs the turn on previous's cached history itself
// (workingCopy), so the requests chained from one response must run one
// after the other, or they would write that history at once. They wait
// their turn whatever the server's concurrency policy, which is about
// conversations: the bug is a sibling's turn in the history, not a
// refusal. The lock is held with no other (no other request locks a
// response's id), so it cannot deadlock, and it is taken before the load,
// so that what is loaded, and cached, is the history as it stands.
//
// The release first takes back, under the lock, what a turn that did not
// commit (it failed, its client left, it was not stored) put in the
// history: the buggy server keeps a turn that completed, and only that, so
// its bug is a sibling's turn showing (T4), not a failed one's (T1). It
// runs once, as a second release could find the history another turn's.
func (s *Handler) lockBase(ctx context.Context, t *turn.Turn, previous string) error {
	if s.Cfg.Mutant != config.BranchMutatesBase {
		return nil
	}
	lease, unlock, err := s.Locks.Lock(ctx, store.Key{Scope: t.Key.Scope, ID: turn.NsResponse + previous}, config.Serialize, s.Cfg.RequestTimeout)
	if err != nil {
		return err
	}
	// The turn loads on the lease's connection, and commits under it.
	t.Lease = lease
	var once sync.Once
	t.Release = func() {
		once.Do(func() {
			// t.work is nil for a turn refused before it was prepared.
			if t.Work != nil && t.Committed == 0 {
				t.Work.Messages = t.Work.Messages[:t.Own]
				for _, i := range t.Hid {
					t.Work.Messages[i].Hidden = false
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
func (s *Handler) loadResponse(ctx context.Context, scope, id string) (*store.Conversation, error) {
	k := store.Key{Scope: scope, ID: turn.NsResponse + id}
	if s.Cfg.Mutant == config.ResponseCrossKey {
		// The bug: the id alone names the response, whoever asks.
		found, ok, err := s.Store.ScopeOf(ctx, k.ID)
		if err != nil {
			return nil, err
		}
		if ok {
			k.Scope = found
		}
	}
	// A stored response never changes, so what is loaded may be cached
	// without its lock.
	c, err := s.Convs.Get(ctx, k)
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
func (s *Handler) refuseResponse(w http.ResponseWriter, r *http.Request, t *turn.Turn, previous string, err error) {
	if !errors.Is(err, errNoResponse) {
		s.Refuse(r.Context(), turn.NewHTTP(w), t, err)
		return
	}
	turn.WriteCodedError(w, http.StatusNotFound, "invalid_request_error", "previous_response_not_found",
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
// id minted.
func (s *Handler) newResponseResponder(req *responsesRequest) *responseResponder {
	model := req.model
	if model == "" {
		model = s.Cfg.ModelName
	}
	var previous *string
	if req.previous != "" {
		previous = &req.previous
	}
	return &responseResponder{
		obj: responseObject{ID: turn.NewID("resp_"), Object: "response", CreatedAt: time.Now().Unix(),
			Model: model, PreviousResponseID: previous, Output: []responseItem{}, Store: req.store},
		itemID: turn.NewID("msg_"),
		stream: req.stream,
	}
}

// Begin is called before the turn's first model call.
func (p *responseResponder) Begin(o *turn.Output) {
	if p.stream {
		o.Open()
		p.emit(o, "response.created", map[string]any{"response": p.response(responseInProgress)})
	}
}

// Started does nothing: the stream, if any, opened with the turn.
func (p *responseResponder) Started(*turn.Output) {}

// Delta relays a piece of the reply's text.
func (p *responseResponder) Delta(o *turn.Output, text string) {
	if p.stream {
		p.emit(o, "response.output_text.delta", map[string]any{
			"item_id": p.itemID, "output_index": 0, "content_index": 0, "delta": text})
	}
}

// Succeeded answers a turn that ended ok, once its commit is durable.
func (p *responseResponder) Succeeded(o *turn.Output, reply string) {
	done := p.response(responseCompleted)
	done.Output = []responseItem{{Type: "message", ID: p.itemID, Role: openai.RoleAssistant, Status: responseCompleted,
		Content: []responseText{{Type: "output_text", Text: reply, Annotations: []any{}}}}}
	if !p.stream {
		o.JSON(http.StatusOK, string(turn.MustJSON(done)))
		return
	}
	p.emit(o, "response.completed", map[string]any{"response": done})
}

// Failed ends the stream with response.failed; response.created always
// came first, so a failure always has its response.
func (p *responseResponder) Failed(o *turn.Output, typ, msg string) {
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
func (p *responseResponder) emit(o *turn.Output, typ string, fields map[string]any) {
	fields["type"] = typ
	fields["sequence_number"] = p.seq
	p.seq++
	o.Write(typ, string(turn.MustJSON(fields)))
}

// Handler serves the Responses API over the engine.
type Handler struct{ *turn.Engine }
