package protocol

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// TestKeptReplyIsBounded: a history keeps at most maxKeptReply bytes of a
// reply, whole or streamed, however long the server's reply is: a run
// keeps every response until it ends.
func TestKeptReplyIsBounded(t *testing.T) {
	long := strings.Repeat("x", 3*maxKeptReply)
	stop := openai.FinishStop
	whole, err := json.Marshal(openai.Completion{Object: "chat.completion",
		Choices: []openai.Choice{{Message: &openai.Message{Role: openai.RoleAssistant, Content: openai.Content(long)}, FinishReason: &stop}}})
	require.NoError(t, err)
	r := readWhole(context.Background(), strings.NewReader(string(whole)), Response{Status: 200})
	require.Equal(t, model.OK, r.Outcome)
	assert.Len(t, r.Reply, maxKeptReply)

	var sse strings.Builder
	for range 4 {
		chunk, err := json.Marshal(openai.Completion{Object: openai.ObjectChunk,
			Choices: []openai.Choice{{Delta: &openai.Delta{Content: long}}}})
		require.NoError(t, err)
		fmt.Fprintf(&sse, "data: %s\n\n", chunk)
	}
	last, err := json.Marshal(openai.Completion{Object: openai.ObjectChunk,
		Choices: []openai.Choice{{Delta: &openai.Delta{}, FinishReason: &stop}}})
	require.NoError(t, err)
	fmt.Fprintf(&sse, "data: %s\n\ndata: %s\n\n", last, openai.DoneSentinel)
	r = readStream(context.Background(), strings.NewReader(sse.String()), io.NopCloser(nil), Response{Status: 200})
	require.Equal(t, model.OK, r.Outcome, r.Detail)
	assert.LessOrEqual(t, len(r.Reply), maxKeptReply)
}

// TestErrorChunkReadToTheEnd: after an error chunk the client reads on
// until the server ends the response, so that the next request does not
// race the server's own end of the turn; a response that does not end in
// time is marked open.
func TestErrorChunkReadToTheEnd(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	errChunk := `data: {"object":"chat.completion.chunk","choices":[],"error":{"message":"boom","type":"server_error"}}` + "\n\n"
	r := readStream(context.Background(), strings.NewReader(errChunk+"data: [DONE]\n\n"), io.NopCloser(nil), Response{Status: 200})
	assert.Equal(t, model.Fail, r.Outcome)
	assert.Equal(t, CauseChunk, r.Cause)
	assert.False(t, r.Open, "the server ended the response")

	neverEnds(t, "the server never ended the response", errChunk, func(r Response) {
		assert.Equal(t, model.Fail, r.Outcome)
	})
	// docker-agent's serve chat writes [DONE] after the error chunk, and
	// commits and releases the conversation only then: [DONE] is not the
	// end of the response, its body's end is.
	neverEnds(t, "the server never ended the response after [DONE]", errChunk+"data: [DONE]\n\n", func(r Response) {
		assert.Equal(t, model.Fail, r.Outcome)
	})
}

// neverEnds reads a chat stream that sends what and never ends, in a
// parallel subtest named said (each waits out ErrorDrain): the response
// is marked open, and check judges the rest.
func neverEnds(t *testing.T, said, what string, check func(Response)) {
	t.Run(said, func(t *testing.T) {
		t.Parallel()
		pr, pw := io.Pipe()
		go func() { _, _ = pw.Write([]byte(what)) }() // and never ends
		r := readStream(context.Background(), pr, pr, Response{Status: 200})
		check(r)
		assert.True(t, r.Open, said)
		_ = pw.Close()
	})
}

// TestFailureEventReadToTheEnd: under the Responses API and a session API
// too, after an event that fails the turn the client reads on until the
// server ends the response, and marks open one that does not end in time.
func TestFailureEventReadToTheEnd(t *testing.T) {
	t.Parallel() // it mostly waits on bounds
	sessions := &sessions{api: &targets.SessionsAPI{Events: targets.EventRules{TypeField: "type", Failure: []string{"error"}}}}
	for name, c := range map[string]struct {
		failed string
		read   func(body io.Reader, closer io.Closer) Response
	}{
		"responses": {`data: {"type":"response.failed","response":{"id":"resp_1","status":"failed"}}` + "\n\n",
			func(body io.Reader, closer io.Closer) Response {
				return readResponseEvents(context.Background(), body, closer, Response{Status: 200})
			}},
		"sessions": {`data: {"type":"error","error":"boom"}` + "\n\n",
			func(body io.Reader, closer io.Closer) Response {
				return sessions.readEvents(context.Background(), body, closer, Response{Status: 200})
			}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := c.read(strings.NewReader(c.failed+`data: {"type":"more"}`+"\n\n"), io.NopCloser(nil))
			assert.Equal(t, model.Fail, r.Outcome)
			assert.False(t, r.Open, "the server ended the response")

			pr, pw := io.Pipe()
			go func() { _, _ = pw.Write([]byte(c.failed)) }() // and never ends
			r = c.read(pr, pr)
			assert.Equal(t, model.Fail, r.Outcome)
			assert.True(t, r.Open, "the server never ended the response")
			_ = pw.Close()
		})
	}
}

// TestDoneReadToTheEnd: a turn ends ok with [DONE] (chat) or its done
// event (a session API), but its response ends with its body: the client
// reads on until then, as after an error chunk, so that the next request
// does not race a server that releases its conversation in between
// (docker-agent's serve chat and serve api do); a response that does not
// end in time is marked open.
func TestDoneReadToTheEnd(t *testing.T) {
	t.Parallel() // it mostly waits on bounds
	stop := `data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tc-a1"},"finish_reason":"stop"}]}` + "\n\n"
	r := readStream(context.Background(), strings.NewReader(stop+"data: [DONE]\n\n"), io.NopCloser(nil), Response{Status: 200})
	assert.Equal(t, model.OK, r.Outcome, r.Detail)
	assert.False(t, r.Open, "the server ended the response")

	neverEnds(t, "the server never ended the response after [DONE]", stop+"data: [DONE]\n\n", func(r Response) {
		assert.Equal(t, model.OK, r.Outcome, r.Detail)
	})

	sessions := &sessions{api: &targets.SessionsAPI{Events: targets.EventRules{TypeField: "type", Text: "agent_choice", TextField: "content",
		Done: []string{"stream_stopped"}}}}
	t.Run("the server never ended the response after stream_stopped", func(t *testing.T) {
		t.Parallel()
		pr, pw := io.Pipe()
		go func() {
			_, _ = pw.Write([]byte(`data: {"type":"agent_choice","content":"tc-a1"}` + "\n\n" + `data: {"type":"stream_stopped"}` + "\n\n"))
		}()
		r := sessions.readEvents(context.Background(), pr, pr, Response{Status: 200})
		assert.Equal(t, model.OK, r.Outcome, r.Detail)
		assert.True(t, r.Open, "the server never ended the response after stream_stopped")
		_ = pw.Close()
	})
}
