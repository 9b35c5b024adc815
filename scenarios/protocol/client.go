// Package protocol is the only code that knows how a turn is sent to a
// server and how its outcome is read off the wire: the chat endpoint with
// a conversation header, its JSON answers and its event streams.
package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// maxResponseBytes bounds what the client reads of one response.
const maxResponseBytes = 8 << 20

// maxKeptReply bounds the reply text a history keeps of one response: the
// checker looks only for the reply token, which the fake model writes
// early, and a run keeps every response until it ends.
const maxKeptReply = 64 << 10

// Request is one request the harness sends: enough to send it again by hand.
type Request struct {
	Conv model.ConversationRef `json:"conversation"`
	// Body is the JSON body exactly as sent.
	Body json.RawMessage `json:"body"`
	// Stream reports whether the body asks for a stream.
	Stream bool `json:"stream,omitempty"`
}

// Response is what the client learned of a request.
type Response struct {
	Outcome model.Outcome `json:"outcome"`
	// Status is the HTTP status, 0 if none was received.
	Status int `json:"status,omitempty"`
	// Reply is the assistant text received (a partial one on a broken
	// stream).
	Reply string `json:"reply,omitempty"`
	// Detail says what happened in a few words: the error message, or why
	// the outcome is unknown.
	Detail string `json:"detail,omitempty"`
	// TimedOut reports a request the server took and never answered, not
	// even with a status, within the client's time.
	TimedOut bool `json:"timedOut,omitempty"`
	// Cause names, for a turn that did not end ok, why, in a few words
	// that a run's summary counts by: "status 502", "error chunk",
	// "connection refused", "no finish_reason stop", ...
	Cause string `json:"cause,omitempty"`
	// Open reports that the client stopped reading before the server
	// ended the response (an error chunk followed by a stream that did
	// not end within ErrorDrain).
	Open bool `json:"open,omitempty"`
}

// The causes a summary counts outcomes by, where a status does not say.
const (
	CauseRefused   = "connection refused"
	CauseNoAnswer  = "no response (connection broke)"
	CauseTimedOut  = "no response within the client's time"
	CauseAborted   = "client abort (injected)"
	CauseNoDone    = "stream never ended with [DONE]"
	CauseNoStop    = "no finish_reason stop before [DONE]"
	CauseMalformed = "malformed chunk"
	CauseNoBody    = "200 without a chat.completion body"
	CauseChunk     = "error chunk"
	CauseRunEnded  = "still open when the run ended"
)

// ErrorDrain bounds how long the client keeps reading a stream after an
// error chunk, for the server to end the response: a server may finish
// the turn (and release its conversation) only once it has. It never
// decides a verdict against a server: one that has not ended the
// response by then is only excused a 409 to the next request.
const ErrorDrain = 2 * time.Second

// Client speaks the chat endpoint of one server.
type Client struct {
	base    string
	profile targets.Profile
	// ns prefixes every conversation id sent: the session's namespace on
	// a server shared by several.
	ns   string
	http *http.Client
}

// NewClient returns a client of the server at base, as p reaches it, that
// names every conversation under the namespace ns ("" for none).
func NewClient(base string, p targets.Profile, ns string) *Client {
	return &Client{
		base:    strings.TrimRight(base, "/"),
		profile: p,
		ns:      ns,
		http: &http.Client{
			Timeout:   p.RequestTimeout(),
			Transport: http.DefaultTransport.(*http.Transport).Clone(),
		},
	}
}

// Close drops the client's idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Rebase points the client at a server restarted at base, dropping the
// connections to the old one.
func (c *Client) Rebase(base string) {
	c.http.CloseIdleConnections()
	c.base = strings.TrimRight(base, "/")
}

// NewRequest builds a request carrying msgs on conversation conv. On a
// server shared by several sessions, every user message with a token also
// carries the session's namespace, which the fake model tells this
// session's calls by.
func (c *Client) NewRequest(conv model.ConversationRef, msgs []openai.Message, stream bool) Request {
	if c.ns != "" {
		tagged := make([]openai.Message, len(msgs))
		for i, m := range msgs {
			tagged[i] = m
			if m.Role == openai.RoleUser && len(model.Tokens(string(m.Content))) > 0 {
				tagged[i].Content = openai.Content(fmt.Sprintf("%s %s", m.Content, EpochTag(c.ns)))
			}
		}
		msgs = tagged
	}
	body, err := json.Marshal(openai.ChatRequest{Model: c.profile.Model, Messages: msgs, Stream: stream})
	if err != nil {
		panic(err) // plain strings always encode
	}
	return Request{Conv: conv, Body: body, Stream: stream}
}

// Send sends req and reads the outcome. Cancelling ctx aborts the request:
// the client drops the connection, and the outcome is unknown.
func (c *Client) Send(ctx context.Context, req Request) Response {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/chat/completions", bytes.NewReader(req.Body))
	if err != nil {
		return Response{Outcome: model.Unknown, Detail: err.Error()}
	}
	for k, v := range c.headers(req.Conv) {
		hr.Header.Set(k, v)
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		var timeout net.Error
		out := Response{Outcome: model.Unknown, Detail: "no response: " + transportError(ctx, err),
			TimedOut: ctx.Err() == nil && errors.As(err, &timeout) && timeout.Timeout()}
		out.Cause = transportCause(ctx, err, out.TimedOut)
		return out
	}
	defer resp.Body.Close()
	out := Response{Status: resp.StatusCode}
	out = readResponse(ctx, resp, out)
	if out.Outcome != model.OK && out.Cause == "" {
		out.Cause = fmt.Sprintf("status %d", resp.StatusCode)
		if ctx.Err() != nil {
			out.Cause = CauseAborted
		}
	}
	return out
}

// readResponse reads resp's body into out.
func readResponse(ctx context.Context, resp *http.Response, out Response) Response {
	body := io.LimitReader(resp.Body, maxResponseBytes)
	switch {
	case resp.StatusCode >= 400:
		out.Outcome = model.Fail
		out.Detail = errorMessage(body)
		return out
	case resp.StatusCode != http.StatusOK:
		out.Outcome = model.Unknown
		out.Detail = fmt.Sprintf("unexpected status %d", resp.StatusCode)
		return out
	case strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
		return readStream(ctx, body, resp.Body, out)
	default:
		return readWhole(ctx, body, out)
	}
}

// transportCause names why a request got no response at all.
func transportCause(ctx context.Context, err error, timedOut bool) string {
	switch {
	case ctx.Err() != nil:
		return CauseAborted
	case timedOut:
		return CauseTimedOut
	case errors.Is(err, syscall.ECONNREFUSED):
		return CauseRefused
	}
	return CauseNoAnswer
}

// headers are the request headers for conversation conv under the profile.
func (c *Client) headers(conv model.ConversationRef) map[string]string {
	h := map[string]string{"Content-Type": "application/json"}
	if conv.ID != "" {
		h[c.profile.HeaderName()] = c.ns + conv.ID
	}
	if conv.Key != "" {
		h["Authorization"] = "Bearer " + conv.Key
	}
	return h
}

func readWhole(ctx context.Context, body io.Reader, out Response) Response {
	raw, err := io.ReadAll(body)
	if err != nil {
		out.Outcome = model.Unknown
		out.Detail = "response broke: " + transportError(ctx, err)
		return out
	}
	var c openai.Completion
	if err := json.Unmarshal(raw, &c); err != nil || len(c.Choices) == 0 || c.Choices[0].Message == nil {
		out.Outcome = model.Unknown
		out.Detail, out.Cause = CauseNoBody, CauseNoBody
		return out
	}
	out.Outcome = model.OK
	out.Reply = clipReply(c.Text())
	return out
}

// readStream reads an SSE reply. It succeeded only if no chunk carried an
// error, a chunk finished with "stop", and [DONE] closed the stream; an
// error chunk fails the turn whatever follows it (PROTOCOL.md).
//
// After an error chunk it reads on, within ErrorDrain, until the server
// ends the response ([DONE] or the end of the body): a server that sends
// [DONE] after an error chunk may release the conversation only then, and
// the next request must not race it. closer ends a read that takes longer.
func readStream(ctx context.Context, body io.Reader, closer io.Closer, out Response) Response {
	var reply strings.Builder
	stopped := false
	events := sse.NewReader(body)
	for {
		data, err := events.Next()
		if err != nil {
			out.Reply = reply.String()
			out.Outcome = model.Unknown
			if errors.Is(err, io.EOF) {
				out.Detail, out.Cause = "stream ended without [DONE]", CauseNoDone
			} else {
				out.Detail, out.Cause = "stream broke: "+transportError(ctx, err), CauseNoDone
				var timeout net.Error
				switch {
				case ctx.Err() != nil:
					out.Cause = CauseAborted
				case errors.As(err, &timeout) && timeout.Timeout():
					out.Cause = "stream never ended within the client's time"
				}
			}
			return out
		}
		if data == openai.DoneSentinel {
			out.Reply = reply.String()
			if stopped {
				out.Outcome = model.OK
			} else {
				out.Outcome = model.Unknown
				out.Detail, out.Cause = "[DONE] without a chunk finishing with stop", CauseNoStop
			}
			return out
		}
		var c openai.Completion
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			out.Reply = reply.String()
			out.Outcome = model.Unknown
			out.Detail, out.Cause = "malformed chunk from the server", CauseMalformed
			return out
		}
		if c.Error != nil {
			out.Reply = reply.String()
			out.Outcome = model.Fail
			out.Detail, out.Cause = "error chunk: "+c.Error.Message, CauseChunk
			out.Open = !drain(events, closer)
			return out
		}
		if reply.Len() < maxKeptReply {
			reply.WriteString(clipReply(c.Text()))
		}
		if c.Finish() == openai.FinishStop {
			stopped = true
		}
	}
}

// drain reads events until the server ends the response, for at most
// ErrorDrain; it reports whether the server ended it in time.
func drain(events *sse.Reader, closer io.Closer) bool {
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			if data, err := events.Next(); err != nil || data == openai.DoneSentinel {
				return
			}
		}
	}()
	timer := time.NewTimer(ErrorDrain)
	defer timer.Stop()
	select {
	case <-ended:
		return true
	case <-timer.C:
		_ = closer.Close() // ends the read above
		<-ended
		return false
	}
}

// ClipText keeps at most n bytes of s, saying when it cut.
func ClipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// clipReply keeps at most maxKeptReply bytes of a reply.
func clipReply(s string) string {
	if len(s) > maxKeptReply {
		return s[:maxKeptReply]
	}
	return s
}

func errorMessage(r io.Reader) string {
	msg, ok := openai.ReadErrorMessage(r)
	if !ok {
		return "body not an OpenAI error: " + msg
	}
	return msg
}

func transportError(ctx context.Context, err error) string {
	if ctx.Err() != nil {
		return "the client aborted"
	}
	return err.Error()
}

// EpochTag is the text every user message of a session on a shared
// server carries, "" for a server of its own; whole, with its
// parentheses, so that no session's tag is part of another's.
func EpochTag(ns string) string {
	if ns == "" {
		return ""
	}
	return "(" + strings.TrimSuffix(ns, "-") + ")"
}
