package protocol

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
)

// readResponse reads resp's body into out.
func readResponse(ctx context.Context, resp *http.Response, out Response) Response {
	body := io.LimitReader(resp.Body, maxResponseBytes)
	switch {
	case resp.StatusCode != http.StatusOK:
		return unexpected(resp.StatusCode, out)
	case strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"):
		return readStream(ctx, body, resp.Body, out)
	default:
		return readWhole(ctx, body, out)
	}
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
// After an error chunk, and after [DONE], it reads on, within ErrorDrain,
// until the server ends the response (the end of the body): a server may
// release the conversation only then (docker-agent's serve chat commits
// and releases it after [DONE]), and the next request must not race it.
// closer ends a read that takes longer.
func readStream(ctx context.Context, body io.Reader, closer io.Closer, out Response) Response {
	var reply strings.Builder
	stopped := false
	events := sse.NewReader(body)
	for {
		data, err := events.Next()
		if err != nil {
			return streamEnded(ctx, err, reply.String(), "stream ended without [DONE]", CauseNoDone, out)
		}
		if data == openai.DoneSentinel {
			out.Reply = reply.String()
			if stopped {
				out.Outcome = model.OK
			} else {
				out.Outcome = model.Unknown
				out.Detail, out.Cause = "[DONE] without a chunk finishing with stop", CauseNoStop
			}
			// The response ends with its body, not with [DONE]: a server
			// may release the conversation in between (docker-agent's
			// serve chat does), and the next request must not race it.
			out.Open = !drain(events, closer)
			return out
		}
		var c openai.Completion
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return malformed(reply.String(), "chunk", out)
		}
		if c.Error != nil {
			out.Reply = reply.String()
			out.Outcome = model.Fail
			out.Detail, out.Cause = "error chunk: "+c.Error.Message, CauseChunk
			out.Open = !drain(events, closer)
			return out
		}
		addReply(&reply, c.Text())
		if c.Finish() == openai.FinishStop {
			stopped = true
		}
	}
}

// drain reads events until the server ends the response (the end of its
// body), for at most ErrorDrain; it reports whether the server ended it in
// time. closer ends a read that takes longer.
func drain(events *sse.Reader, closer io.Closer) bool {
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			if _, err := events.Next(); err != nil {
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

// chat is the chat completions protocol: POST /v1/chat/completions, the
// conversation named by a header, the server keeping its history.
type chat struct{}

func (chat) request(_ context.Context, c *Client, s plan.Send, msgs []openai.Message) Request {
	body, err := json.Marshal(openai.ChatRequest{Model: c.profile.Model, Messages: msgs, Stream: s.Stream})
	if err != nil {
		panic(err) // plain strings always encode
	}
	return Request{Conv: s.Conv, Body: body, Stream: s.Stream}
}

func (chat) headers(c *Client, req Request) map[string]string {
	if req.Conv.ID == "" {
		return nil
	}
	return map[string]string{c.profile.HeaderName(): c.ns + req.Conv.ID}
}

func (chat) read(ctx context.Context, _ Request, resp *http.Response, out Response) Response {
	return readResponse(ctx, resp, out)
}

func (chat) learn(Request, Response) {}

func (chat) restarted() {}
