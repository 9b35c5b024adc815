package turn

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
)

// A responder writes one turn's answer in its client's protocol. run
// decides the turn; the responder only says it. Each method gets the
// turn's output, whose stream, if the protocol opens one, it opens.
type responder interface {
	// Begin is called before the turn's first model call: a protocol
	// whose stream starts with the turn opens it here, so that a client
	// that drops mid-turn has heard what it needs (a response's id).
	Begin(o *Output)
	// Started is called once the model first answered 200: a chat stream
	// opens here.
	Started(o *Output)
	// Delta relays a piece of the reply's text.
	Delta(o *Output, text string)
	// Succeeded answers a turn that ended ok, after its commit is durable.
	Succeeded(o *Output, reply string)
	// Failed reports a failure on the open stream; before a stream opens,
	// answerError answers with a status instead.
	Failed(o *Output, typ, msg string)
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
// Turn answers goes on its response.
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

// Output is where one turn's answer goes: the client's connection, and
// the event stream once one is open.
type Output struct {
	// client is the turn's client; http is the same when it is HTTP's,
	// which alone offers streams and JSON answers (open, write, json).
	client Client
	http   *HTTP
	// resp writes the answer in the turn's protocol.
	resp responder
	// out is the event stream, nil until the answer opens one.
	out *sse.Writer
	// Err is the first write to the client that failed: nothing is written
	// after it.
	Err error
	// completes is set for a turn that runs to its end whatever its client
	// does (Complete): a failed write does not end it.
	completes bool
	// cancel ends the turn: a write that fails ends a turn that does not
	// complete, so that a client that stops reading does not hold its
	// conversation.
	cancel context.CancelFunc
	// stall, if not nil, pauses before each write (Config.Stall).
	stall func()
}

// newOutput returns the output of a turn answering c through resp.
func newOutput(c Client, resp responder, completes bool, cancel context.CancelFunc) *Output {
	var h *HTTP
	if hc, ok := c.(onHTTP); ok {
		h = hc.response()
	}
	return &Output{client: c, http: h, resp: resp, completes: completes, cancel: cancel}
}

// onHTTP is a Client that answers on an HTTP response: HTTP, or a
// protocol's Client that embeds it to answer refusals in words of its own
// (A2A's JSON-RPC errors).
type onHTTP interface{ response() *HTTP }

func (h *HTTP) response() *HTTP { return h }

// Streaming reports whether the answer's stream is open; o may be nil, for
// a turn refused before it ran.
func (o *Output) Streaming() bool { return o != nil && o.out != nil }

// Open opens the answer's event stream, with status 200.
func (o *Output) Open() {
	o.out = sse.NewWriter(o.http.w)
	o.http.w.WriteHeader(http.StatusOK)
}

// Write writes one event on the open stream, named event ("" for a bare
// data event), with a deadline of its own: the last write may be long ago.
func (o *Output) Write(event, payload string) {
	if o.Err != nil {
		return
	}
	if o.stall != nil {
		o.stall()
	}
	_ = o.http.rc.SetWriteDeadline(time.Now().Add(config.StreamWriteTimeout))
	if event == "" {
		o.Fail(o.out.Data(payload))
	} else {
		o.Fail(o.out.Event(event, payload))
	}
}

// Fail records err, a write to the client that failed (nil for none):
// nothing is written after it, and it ends a turn that does not complete.
func (o *Output) Fail(err error) {
	o.Err = err
	if o.Err != nil && !o.completes {
		o.cancel()
	}
}

// JSON writes a whole JSON answer with status.
func (o *Output) JSON(status int, payload string) {
	if o.stall != nil {
		o.stall()
	}
	o.http.w.Header().Set("Content-Type", "application/json")
	// A client that does not read its answer must not hold the handler.
	_ = o.http.rc.SetWriteDeadline(time.Now().Add(config.StreamWriteTimeout))
	o.http.w.WriteHeader(status)
	_, _ = io.WriteString(o.http.w, payload)
}
