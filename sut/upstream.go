package sut

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"
)

// maxReplyBytes bounds the reply the server accepts from the model.
const maxReplyBytes = 4 << 20

// upstreamError is a failed model call. started reports whether the model
// had answered 200 and begun its stream before it failed. Its message is for
// the server's log (through a redactor), never for a client: it quotes
// what the model said.
type upstreamError struct {
	msg     string
	started bool
	// cause is the underlying error, for the server's log only: it may
	// name the model's host and addresses.
	cause error
}

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

// complete sends history to the model and streams its reply. It calls
// onStart once the model has answered 200, and onDelta for every piece of
// reply text. It returns the reply text received, complete on success and
// partial on failure. A failure is an *upstreamError, or the context's cause
// (context.DeadlineExceeded when the deadline passed) when it ended.
func (u *upstream) complete(ctx context.Context, history []openai.Message, onStart func(), onDelta func(string)) (string, error) {
	body, err := json.Marshal(openai.ChatRequest{Model: u.model, Messages: history, Stream: true,
		// As real servers do: the model then ends its stream with a usage chunk.
		StreamOptions: &openai.StreamOptions{IncludeUsage: true}})
	if err != nil {
		return "", &upstreamError{msg: "encode model request: " + err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.url, bytes.NewReader(body))
	if err != nil {
		return "", &upstreamError{msg: "model request: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := u.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return "", context.Cause(ctx)
		}
		return "", &upstreamError{msg: "model unreachable: " + netReason(err), cause: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", &upstreamError{msg: fmt.Sprintf("model answered %d: %s", resp.StatusCode, upstreamMessage(resp.Body))}
	}
	onStart()

	var reply strings.Builder
	// fail ends the stream with a failure; cause, if any, is for the log.
	fail := func(cause error, format string, args ...any) (string, error) {
		if ctx.Err() != nil {
			return reply.String(), context.Cause(ctx)
		}
		return reply.String(), &upstreamError{msg: fmt.Sprintf(format, args...), started: true, cause: cause}
	}
	events := sse.NewReader(resp.Body)
	for {
		data, err := events.Next()
		if errors.Is(err, io.EOF) {
			return fail(nil, "model stream ended without [DONE]")
		}
		if err != nil {
			return fail(err, "model stream broke: %s", netReason(err))
		}
		if data == openai.DoneSentinel {
			return reply.String(), nil
		}
		var c openai.Completion
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return fail(nil, "malformed model chunk: %v", err)
		}
		if c.Error != nil {
			return fail(nil, "model stream error: %s", c.Error.Message)
		}
		text := c.Text()
		if reply.Len()+len(text) > maxReplyBytes {
			return fail(nil, "model reply over %d bytes", maxReplyBytes)
		}
		reply.WriteString(text)
		if text != "" {
			onDelta(text)
		}
	}
}

func (u *upstream) close() { u.client.CloseIdleConnections() }

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
