package sut

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"

	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
)

// A responder writes one turn's answer in its client's protocol. run
// decides the turn; the responder only says it. Each method gets the
// turn's output, whose stream, if the protocol opens one, it opens.
type responder interface {
	// begin is called before the turn's first model call: a protocol
	// whose stream starts with the turn opens it here, so that a client
	// that drops mid-turn has heard what it needs (a response's id).
	begin(o *output)
	// started is called once the model first answered 200: a chat stream
	// opens here.
	started(o *output)
	// delta relays a piece of the reply's text.
	delta(o *output, text string)
	// succeeded answers a turn that ended ok, after its commit is durable.
	succeeded(o *output, reply string)
	// failed reports a failure on the open stream; before a stream opens,
	// answerError answers with a status instead.
	failed(o *output, typ, msg string)
}

// Client is the client's end of one turn: where what the turn machinery
// answers of its own goes (a refusal, a failure before any stream
// opened), beside what the turn's responder writes. HTTP's is an HTTP
// response (HTTP); ACP's records the answer for its JSON-RPC reply.
type Client interface {
	// Refuse answers the turn with r, before any stream opened.
	Refuse(r *admission.Refusal)
	// Done is called once the turn's answer is written.
	Done()
}

// HTTP is the Client of a turn that came as an HTTP request: what the
// turn answers goes on its response.
type HTTP struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// NewHTTP returns the Client answering on w.
func NewHTTP(w http.ResponseWriter) *HTTP {
	return &HTTP{w: w, rc: http.NewResponseController(w)}
}

// Refuse writes r as the response.
func (h *HTTP) Refuse(r *admission.Refusal) { r.Write(h.w) }

// Done lifts the write deadline a stream set: the connection lives on.
func (h *HTTP) Done() { _ = h.rc.SetWriteDeadline(time.Time{}) }

// output is where one turn's answer goes: the client's connection, and
// the event stream once one is open.
type output struct {
	// client is the turn's client; http is the same when it is HTTP's,
	// which alone offers streams and JSON answers (open, write, json).
	client Client
	http   *HTTP
	// resp writes the answer in the turn's protocol.
	resp responder
	// out is the event stream, nil until the answer opens one.
	out *sse.Writer
	// err is the first write to the client that failed: nothing is written
	// after it.
	err error
	// completes is set for a turn that runs to its end whatever its client
	// does (Complete): a failed write does not end it.
	completes bool
	// cancel ends the turn: a write that fails ends a turn that does not
	// complete, so that a client that stops reading does not hold its
	// Conversation.
	cancel context.CancelFunc
	// stall, if not nil, pauses before each write (Config.Stall).
	stall func()
}

// newOutput returns the output of a turn answering c through resp.
func newOutput(c Client, resp responder, completes bool, cancel context.CancelFunc) *output {
	h, _ := c.(*HTTP)
	return &output{client: c, http: h, resp: resp, completes: completes, cancel: cancel}
}

// streaming reports whether the answer's stream is open; o may be nil, for
// a turn refused before it ran.
func (o *output) streaming() bool { return o != nil && o.out != nil }

// open opens the answer's event stream, with status 200.
func (o *output) open() {
	o.out = sse.NewWriter(o.http.w)
	o.http.w.WriteHeader(http.StatusOK)
}

// write writes one event on the open stream, named event ("" for a bare
// data event), with a deadline of its own: the last write may be long ago.
func (o *output) write(event, payload string) {
	if o.err != nil {
		return
	}
	if o.stall != nil {
		o.stall()
	}
	_ = o.http.rc.SetWriteDeadline(time.Now().Add(config.StreamWriteTimeout))
	if event == "" {
		o.fail(o.out.Data(payload))
	} else {
		o.fail(o.out.Event(event, payload))
	}
}

// fail records err, a write to the client that failed (nil for none):
// nothing is written after it, and it ends a turn that does not complete.
func (o *output) fail(err error) {
	o.err = err
	if o.err != nil && !o.completes {
		o.cancel()
	}
}

// json writes a whole JSON answer with status.
func (o *output) json(status int, payload string) {
	if o.stall != nil {
		o.stall()
	}
	o.http.w.Header().Set("Content-Type", "application/json")
	// A client that does not read its answer must not hold the handler.
	_ = o.http.rc.SetWriteDeadline(time.Now().Add(config.StreamWriteTimeout))
	o.http.w.WriteHeader(status)
	_, _ = io.WriteString(o.http.w, payload)
}

// chatResponder answers a chat turn: a chat.completion object, or a stream
// of chat.completion.chunk objects closed by [DONE].
type chatResponder struct {
	id      string
	created int64
	model   string
	stream  bool
}

// newChatResponder returns the responder of chat request req.
func (s *Server) newChatResponder(req *openai.ChatRequest) *chatResponder {
	model := req.Model
	if model == "" {
		model = s.cfg.ModelName
	}
	return &chatResponder{id: "chatcmpl-" + strconv.FormatInt(s.ids.Add(1), 10), created: time.Now().Unix(),
		model: model, stream: req.Stream}
}

// begin does nothing: a chat stream opens when the model has answered, so
// that a model that fails at once is a status.
func (c *chatResponder) begin(*output) {}

func (c *chatResponder) started(o *output) {
	if c.stream {
		o.open()
		o.write("", openai.Encode(c.chunk(openai.Delta{Role: openai.RoleAssistant}, nil)))
	}
}

func (c *chatResponder) delta(o *output, text string) {
	if c.stream {
		o.write("", openai.Encode(c.chunk(openai.Delta{Content: text}, nil)))
	}
}

func (c *chatResponder) succeeded(o *output, reply string) {
	if o.streaming() {
		o.write("", openai.Encode(c.chunk(openai.Delta{}, openai.Ptr(openai.FinishStop))))
		o.write("", openai.DoneSentinel)
		return
	}
	o.json(http.StatusOK, openai.Encode(openai.Completion{
		ID: c.id, Object: openai.ObjectCompletion, Created: c.created, Model: c.model,
		Choices: []openai.Choice{{
			Message:      &openai.Message{Role: openai.RoleAssistant, Content: openai.Content(reply)},
			FinishReason: openai.Ptr(openai.FinishStop),
		}},
	}))
}

// failed writes an error chunk, then [DONE].
func (c *chatResponder) failed(o *output, typ, msg string) {
	o.write("", openai.Encode(openai.Completion{Object: openai.ObjectChunk, Choices: []openai.Choice{},
		Error: &openai.ErrorDetail{Message: msg, Type: typ}}))
	o.write("", openai.DoneSentinel)
}

func (c *chatResponder) chunk(d openai.Delta, finish *string) openai.Completion {
	return openai.Completion{ID: c.id, Object: openai.ObjectChunk, Created: c.created, Model: c.model,
		Choices: []openai.Choice{{Delta: &d, FinishReason: finish}}}
}
