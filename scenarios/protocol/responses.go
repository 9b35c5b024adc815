package protocol

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// responsesPath is where the Responses API takes a turn.
const responsesPath = "/v1/responses"

// responses is the OpenAI Responses API: POST /v1/responses, a turn
// chained to the response its conversation ends with by
// previous_response_id, the server keeping every stored response's
// history. A conversation of the harness is one chain: the wire keeps the
// response each conversation's next turn chains from.
type responses struct {
	// api is what the server declares of its semantics (nil: OpenAI's).
	api   *targets.ResponsesAPI
	mu    sync.Mutex
	heads map[model.ConversationRef]chainHead
	// runs counts the server's restarts: a request made before the last
	// one was sent to a run of the server that is gone.
	runs int
}

// chainHead is where a conversation's chain stands.
type chainHead struct {
	// id is the response the next turn chains from; "" for none yet.
	id string
	// done is the last response of the chain that completed.
	done string
	// unknown says that id is a response whose outcome the client never
	// learned: a server that did not keep it answers 404, and the chain
	// goes on from done.
	unknown bool
	// failed is a response the server said failed: the next turn chains
	// from it once, to check that a failed response never becomes a base
	// (refused, or seeing nothing of it: T1).
	failed string
}

func newResponses(api *targets.ResponsesAPI) *responses {
	return &responses{api: api, heads: map[model.ConversationRef]chainHead{}}
}

// responsesRequest is the body of a turn.
type responsesRequest struct {
	Model              string `json:"model"`
	Input              []any  `json:"input"`
	PreviousResponseID string `json:"previous_response_id,omitempty"`
	Conversation       string `json:"conversation,omitempty"`
	User               string `json:"user,omitempty"`
	Store              bool   `json:"store"`
	Stream             bool   `json:"stream"`
}

// The input items: a message, and a client tool's call and its output.
type (
	messageItem struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	functionCallItem struct {
		Type      string `json:"type"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	functionCallOutputItem struct {
		Type   string `json:"type"`
		CallID string `json:"call_id"`
		Output string `json:"output"`
	}
)

// inputItems are msgs as Responses API input items: an assistant message's
// tool calls are function_call items, a tool message is the
// function_call_output of the call it answers, any other message a
// message item.
func inputItems(msgs []openai.Message) []any {
	items := []any{}
	for _, m := range msgs {
		switch {
		case m.Role == openai.RoleAssistant && len(m.ToolCalls) > 0:
			for _, c := range m.ToolCalls {
				items = append(items, functionCallItem{Type: "function_call", CallID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
			}
		case m.Role == openai.RoleTool:
			items = append(items, functionCallOutputItem{Type: "function_call_output", CallID: m.ToolCallID, Output: string(m.Content)})
		default:
			items = append(items, messageItem{Type: "message", Role: m.Role, Content: string(m.Content)})
		}
	}
	return items
}

func (w *responses) request(_ context.Context, c *Client, s plan.Send, msgs []openai.Message) Request {
	probe := s.Token == ""
	body := responsesRequest{Model: c.profile.Model, Input: inputItems(msgs), Store: !s.NoStore, Stream: s.Stream}
	if s.InConversation {
		// A conversation of the server's, named as chat names one, as
		// the profile declares (the conversation parameter, the user
		// field, or a header): no chain to follow.
		switch w.api.Naming() {
		case targets.NamedByUser:
			body.User = c.ns + s.Conv.ID
		case targets.NamedByHeader:
		default:
			body.Conversation = c.ns + s.Conv.ID
		}
	} else {
		body.PreviousResponseID = w.chainFrom(s.Conv, s.From, probe)
	}
	raw, err := json.Marshal(body)
	if err != nil {
		panic(err) // plain strings always encode
	}
	w.mu.Lock()
	run := w.runs
	w.mu.Unlock()
	return Request{Conv: s.Conv, Path: responsesPath, Body: raw, Stream: s.Stream, ChainedFrom: body.PreviousResponseID,
		noUser: probe, noStore: s.NoStore, inConversation: s.InConversation, run: run}
}

// chainFrom is the response a turn on conv chains from: a failed response
// to probe, or the head; a request without a new user message (probe)
// chains from the head alone. A conversation with no chain of its own
// chains from the head of the conversation it branches from, if any;
// failing that, from the head of another key's conversation with its id:
// that must not be found under this key (T5).
func (w *responses) chainFrom(conv model.ConversationRef, from *model.ConversationRef, probe bool) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h, ok := w.heads[conv]; ok {
		if probe {
			return h.id
		}
		return cmp.Or(h.failed, h.id)
	}
	if from != nil {
		// The branch starts where from stands now, and stays there until
		// a turn of its own completes.
		h := w.heads[*from]
		h.failed = ""
		w.heads[conv] = h
		return h.id
	}
	h, _ := otherKeys(w.heads, conv, func(h chainHead) bool { return h.id != "" })
	return h.id
}

// chained reports whether conv has a response its next turn chains from.
func (w *responses) chained(conv model.ConversationRef) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.heads[conv].id != ""
}

// headers name a conversation of the server's by the header the profile
// declares, where it names conversations so.
func (w *responses) headers(c *Client, req Request) map[string]string {
	if !req.inConversation || w.api.Naming() != targets.NamedByHeader {
		return nil
	}
	return map[string]string{w.api.Header: c.ns + req.Conv.ID}
}

// learn moves conv's chain on: to a response that ended ok, or whose
// outcome the client never learned (the next turn shows whether the
// server kept it whole or not at all, T6); back to the last response that
// completed when the server says it does not have such a one. A request
// without a new user message moves no chain: its response holds no turn
// of the conversation, and is chained from by nothing. A response not
// stored (store: false) moves none either: the next turn chains from it
// once, as from a failed one, to check that it is no base (T1).
func (w *responses) learn(req Request, out Response) {
	if req.inConversation {
		return // the server's conversation goes on by itself
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if req.run != w.runs && out.Outcome == model.Unknown {
		// Sent to a run of the server that is gone, whose end the client
		// learned only after the restart (a crash mid-turn, its
		// connection's reset read late): restarted sent the chain back
		// to its last completed response, which a server that survives
		// restarts must still have; this one it may rightly have lost.
		return
	}
	h, mine := w.heads[req.Conv]
	if mine && h.failed != "" && req.ChainedFrom == h.failed {
		h.failed = "" // probed once
	}
	switch {
	case (out.NotFound() || out.Outcome == model.Fail && out.Status == http.StatusBadRequest && !req.noUser) && h.unknown && req.ChainedFrom == h.id:
		// The response it chained from was not kept: refused as not
		// found, or a turn refused with a plain 400 (its input is a
		// plain user message: the chain is what is refused), the chain
		// goes on from the last one that completed, so that later turns
		// still reach the server.
		h = chainHead{id: h.done, done: h.done}
	case req.noUser:
		return
	case !w.api.ChainsFromAny() && (out.Outcome != model.OK || req.noStore):
		// A server that answers an id it does not hold with a new, empty
		// conversation: a turn chained from a response it may not hold
		// (unknown, failed, not stored) would run on nothing, as if the
		// conversation were lost. The chain goes on from the last
		// response that completed.
		return
	case req.noStore && out.Outcome != model.Unknown && out.ID != "":
		h.failed = out.ID
	case req.noStore:
		return
	case out.Outcome == model.OK && out.ID != "":
		h = chainHead{id: out.ID, done: out.ID}
	case out.Outcome == model.Unknown && out.ID != "":
		h = chainHead{id: out.ID, done: h.done, unknown: true}
	case out.Outcome == model.Fail && out.ID != "":
		h.failed = out.ID
	case !mine:
		return // a refused turn on a conversation with no chain starts none
	}
	w.heads[req.Conv] = h
}

// restarted sends every chain's next turn to the last response of it that
// completed: that one a server that survives restarts must still have
// (T7, T8), where a response whose outcome the client never learned may
// rightly be gone, and a failed one was never kept.
func (w *responses) restarted() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.runs++
	for ref, h := range w.heads {
		w.heads[ref] = chainHead{id: h.done, done: h.done}
	}
}

func (*responses) read(ctx context.Context, _ Request, resp *http.Response, out Response) Response {
	body := io.LimitReader(resp.Body, maxResponseBytes)
	switch {
	case resp.StatusCode != http.StatusOK:
		return unexpected(resp.StatusCode, out)
	case strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
		return readResponseEvents(ctx, body, resp.Body, out)
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		out.Outcome = model.Unknown
		out.Detail = "response broke: " + transportError(ctx, err)
		return out
	}
	var r responseObject
	if err := json.Unmarshal(raw, &r); err != nil || r.ID == "" {
		out.Outcome = model.Unknown
		out.Detail, out.Cause = CauseNoResponse, CauseNoResponse
		return out
	}
	return r.outcome(out)
}

// responseObject is the part of a Responses API response the client reads.
type responseObject struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Output []struct {
		Type    string `json:"type"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// text is the response's output text.
func (r responseObject) text() string {
	var b strings.Builder
	for _, o := range r.Output {
		for _, c := range o.Content {
			if c.Type == "output_text" {
				b.WriteString(c.Text)
			}
		}
	}
	return b.String()
}

// outcome is what a whole response says of its turn.
func (r responseObject) outcome(out Response) Response {
	out.ID = r.ID
	switch r.Status {
	case "completed":
		out.Outcome = model.OK
		out.Reply = clipReply(r.text())
	case "failed", "incomplete", "cancelled":
		out.Outcome = model.Fail
		out.Detail, out.Cause = "response "+r.Status, "response "+r.Status
		if r.Error != nil {
			out.Detail += ": " + r.Error.Message
		}
	default:
		out.Outcome = model.Unknown
		out.Detail, out.Cause = fmt.Sprintf("response status %q", r.Status), CauseNotCompleted
	}
	return out
}

// responseEvent is one event of a Responses API stream.
type responseEvent struct {
	Type     string          `json:"type"`
	Delta    string          `json:"delta"`
	Message  string          `json:"message"`
	Response *responseObject `json:"response"`
}

// readResponseEvents reads a Responses API stream: the turn succeeded
// only on response.completed; response.failed, response.incomplete and
// error fail it; a stream that ends before either leaves it unknown. The
// response's id comes with response.created, before the model is called,
// so a client that drops the turn still knows which response it was.
func readResponseEvents(ctx context.Context, body io.Reader, closer io.Closer, out Response) Response {
	return eachEvent(ctx, body, closer, "stream ended without response.completed", out, func(ev responseEvent, reply *strings.Builder, out *Response) bool {
		if ev.Response != nil && ev.Response.ID != "" {
			out.ID = ev.Response.ID
		}
		switch ev.Type {
		case "response.output_text.delta":
			addReply(reply, ev.Delta)
		case "response.completed":
			out.Outcome = model.OK
			return true
		case "response.failed", "response.incomplete":
			out.Outcome = model.Fail
			out.Detail, out.Cause = ev.Type, CauseFailedEvent
			if ev.Response != nil && ev.Response.Error != nil {
				out.Detail += ": " + ev.Response.Error.Message
			}
			return true
		case "error":
			out.Outcome = model.Fail
			out.Detail, out.Cause = "error event: "+ev.Message, CauseFailedEvent
			return true
		}
		return false
	})
}
