package turn

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"syscall"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/sut/internal/admission"
)

// MaxReplyBytes bounds the reply the server accepts from the model.
const MaxReplyBytes = 4 << 20

// upstreamError is a failed model call. started reports whether the model
// had answered 200 and begun its stream before it failed. Its message is for
// the server's log (through a redactor), never for a client: it quotes
// what the model said.
type upstreamError struct {
	msg     string
	started bool
	// status is the model's HTTP status when it answered one other than
	// 200; 0 otherwise.
	status int
	// cause is the underlying error, for the server's log only: it may
	// name the model's host and addresses.
	cause error
}

// Error is the failure's class, for the log.
func (e *upstreamError) Error() string { return e.msg }

// upstream is the server's OpenAI-compatible client to its model provider.
// It always streams, so that a client's stream can relay the model's.
type upstream struct {
	url    string // {model-url}/chat/completions
	model  string
	client *http.Client
}

// newUpstream returns the client of the model at modelURL, for a server
// that runs up to concurrency turns at once.
func newUpstream(modelURL *url.URL, modelName string, concurrency int) *upstream {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// The default keeps 2 idle connections per host: under load most turns
	// would open a connection of their own, and leave it in TIME_WAIT.
	// Every turn the server may run at once keeps its connection instead.
	tr.MaxIdleConnsPerHost = concurrency
	tr.MaxIdleConns = max(tr.MaxIdleConns, concurrency)
	return &upstream{
		url:   modelURL.JoinPath("chat/completions").String(),
		model: modelName,
		// No client timeout: every call carries the turn's deadline in its
		// context, and a client that goes away cancels it at once.
		client: &http.Client{Transport: tr},
	}
}

// answer is what the model said in one call: its text and the tool calls
// it asked for, in the order of their indexes. No tool calls: text is the
// turn's reply.
type answer struct {
	text  string
	calls []openai.ToolCall
}

// complete sends history to the model, offering it tools, and streams its
// answer. It calls onStart once the model has answered 200, and onDelta for
// every piece of text, until the answer shows a tool call: the client hears
// the reply, not what the model says on its way to a tool. Tool calls come
// in pieces (openai.ToolCallDelta) put together by their index. It returns
// the answer received, complete on success and partial on failure. A
// failure is an *upstreamError, errOverBudget when mem cannot have what
// the answer costs (memory.go), or the context's cause
// (context.DeadlineExceeded when the deadline passed) when it ended.
func (u *upstream) complete(ctx context.Context, history []openai.Message, tools []openai.Tool, mem *admission.Reservation, onStart func(), onDelta func(string)) (answer, error) {
	body, err := json.Marshal(openai.ChatRequest{Model: u.model, Messages: history, Stream: true, Tools: tools,
		// As real servers do: the model then ends its stream with a usage chunk.
		StreamOptions: &openai.StreamOptions{IncludeUsage: true}})
	if err != nil {
		return answer{}, &upstreamError{msg: "encode model request: " + err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.url, bytes.NewReader(body))
	if err != nil {
		return answer{}, &upstreamError{msg: "model request: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := u.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return answer{}, context.Cause(ctx)
		}
		return answer{}, &upstreamError{msg: "model unreachable: " + netReason(err), cause: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return answer{}, &upstreamError{msg: fmt.Sprintf("model answered %d: %s", resp.StatusCode, upstreamMessage(resp.Body)), status: resp.StatusCode}
	}
	onStart()

	var reply strings.Builder
	var calls toolCallBuilder
	// callsReserved is how much of calls.size is reserved already.
	callsReserved := 0
	// Fail ends the stream with a failure; cause, if any, is for the log.
	fail := func(cause error, format string, args ...any) (answer, error) {
		if ctx.Err() != nil {
			return answer{text: reply.String()}, context.Cause(ctx)
		}
		return answer{text: reply.String()}, &upstreamError{msg: fmt.Sprintf(format, args...), started: true, cause: cause}
	}
	// The stream's bytes are reserved as they are read, until their event
	// is decoded; the reply's text for as long as the request runs.
	stream := &meteredReader{r: resp.Body, mem: mem}
	defer stream.decoded()
	events := sse.NewReader(stream)
	for {
		data, err := events.Next()
		if errors.Is(err, admission.ErrOverBudget) {
			return answer{text: reply.String()}, admission.ErrOverBudget
		}
		if errors.Is(err, io.EOF) {
			return fail(nil, "model stream ended without [DONE]")
		}
		if err != nil {
			return fail(err, "model stream broke: %s", netReason(err))
		}
		if data == openai.DoneSentinel {
			toolCalls, err := calls.done()
			if err != nil {
				return fail(nil, "%v", err)
			}
			// Exactly as long as the reply: the builder's spare capacity
			// would stay with it in the cache.
			return answer{text: strings.Clone(reply.String()), calls: toolCalls}, nil
		}
		var c openai.Completion
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return fail(nil, "malformed model chunk: %v", err)
		}
		if c.Error != nil {
			return fail(nil, "model stream error: %s", c.Error.Message)
		}
		if len(c.Choices) > 0 && c.Choices[0].Delta != nil {
			if err := calls.add(c.Choices[0].Delta.ToolCalls); err != nil {
				return fail(nil, "%v", err)
			}
		}
		text := c.Text()
		if reply.Len()+len(text)+calls.size > MaxReplyBytes {
			return fail(nil, "model reply over %d bytes", MaxReplyBytes)
		}
		if !mem.Grow(admission.ReplyFactor * int64(len(text)+calls.size-callsReserved)) {
			return answer{text: reply.String()}, admission.ErrOverBudget
		}
		callsReserved = calls.size
		stream.decoded()
		reply.WriteString(text)
		if text != "" && calls.none() {
			onDelta(text)
		}
	}
}

// meteredReader reads a model's stream, reserving what the bytes read
// cost until the event they carry is decoded (decoded): streamFactor.
// Past the budget a read fails with errOverBudget. The bytes are read into
// the reader's buffer before they are reserved: what an event costs is
// not known before it is read (at most sse.MaxEventBytes).
type meteredReader struct {
	r    io.Reader
	mem  *admission.Reservation
	held int64
}

// Read reads the stream, reserving what each byte costs until decoded.
func (m *meteredReader) Read(p []byte) (int, error) {
	n, err := m.r.Read(p)
	if n > 0 {
		if !m.mem.Grow(admission.StreamFactor * int64(n)) {
			return 0, admission.ErrOverBudget
		}
		m.held += admission.StreamFactor * int64(n)
	}
	return n, err
}

// decoded gives back what the stream's bytes read so far were reserved
// for: their events are decoded, and what they carried is reserved by
// itself.
func (m *meteredReader) decoded() {
	m.mem.Shrink(m.held)
	m.held = 0
}

// maxToolCallsPerAnswer bounds the tool calls one model answer may ask
// for: each is a tool run and two messages kept in the conversation.
const maxToolCallsPerAnswer = 32

// toolCallBuilder puts together the tool calls of a streamed answer from
// their pieces: the first piece of a call carries its id and name, later
// ones with the same index more of its arguments. Pieces of different calls
// may interleave.
type toolCallBuilder struct {
	calls map[int]*openai.ToolCall
	// Size is the bytes of ids, names and arguments received, which count
	// against maxReplyBytes with the text.
	size int
}

func (b *toolCallBuilder) none() bool { return len(b.calls) == 0 }

// Add takes the tool call pieces of one chunk.
func (b *toolCallBuilder) add(deltas []openai.ToolCallDelta) error {
	for _, d := range deltas {
		c := b.calls[d.Index]
		if c == nil {
			if len(b.calls) == maxToolCallsPerAnswer {
				return fmt.Errorf("model asked for over %d tool calls in one answer", maxToolCallsPerAnswer)
			}
			if b.calls == nil {
				b.calls = map[int]*openai.ToolCall{}
			}
			c = &openai.ToolCall{}
			b.calls[d.Index] = c
		}
		// The id, type and name come whole, once; a repeat is the same.
		if d.ID != "" {
			c.ID = d.ID
		}
		if d.Type != "" {
			c.Type = d.Type
		}
		if d.Function.Name != "" {
			c.Function.Name = d.Function.Name
		}
		c.Function.Arguments += d.Function.Arguments
		b.size += len(d.ID) + len(d.Function.Name) + len(d.Function.Arguments)
	}
	return nil
}

// done returns the tool calls in the order of their indexes, or an error if
// one cannot be answered: without an id a result cannot name its call
// (T9), without a name there is nothing to run.
func (b *toolCallBuilder) done() ([]openai.ToolCall, error) {
	if len(b.calls) == 0 {
		return nil, nil
	}
	indexes := slices.Sorted(maps.Keys(b.calls))
	out := make([]openai.ToolCall, 0, len(indexes))
	seen := map[string]bool{}
	for _, i := range indexes {
		c := b.calls[i]
		switch {
		case c.ID == "":
			return nil, fmt.Errorf("model tool call %d has no id", i)
		case seen[c.ID]:
			return nil, fmt.Errorf("model tool call id %.64q is used twice in one answer", c.ID)
		case c.Function.Name == "":
			return nil, fmt.Errorf("model tool call %.64q names no tool", c.ID)
		case c.Type != "" && c.Type != openai.TypeFunction:
			return nil, fmt.Errorf("model tool call %.64q has type %.32q, want %q", c.ID, c.Type, openai.TypeFunction)
		}
		seen[c.ID] = true
		c.Type = openai.TypeFunction
		out = append(out, *c)
	}
	return out, nil
}

// Close drops the idle connections to the model.
func (u *upstream) Close() { u.client.CloseIdleConnections() }

// netReason is what went wrong talking to the model, without its URL and
// socket addresses, which are no business of the server's clients.
func netReason(err error) string {
	var dns *net.DNSError
	switch {
	case errors.As(err, &dns):
		return "its host name does not resolve"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset by the model"
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "connection closed mid-stream"
	case errors.Is(err, sse.ErrEventTooLarge):
		return err.Error()
	}
	return "the request failed"
}

// upstreamMessage is what the model's error response says.
func upstreamMessage(r io.Reader) string {
	msg, _ := openai.ReadErrorMessage(r)
	return msg
}
