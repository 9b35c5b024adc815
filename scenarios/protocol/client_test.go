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

	pr, pw := io.Pipe()
	go func() { _, _ = pw.Write([]byte(errChunk)) }() // and never ends
	r = readStream(context.Background(), pr, pr, Response{Status: 200})
	assert.Equal(t, model.Fail, r.Outcome)
	assert.True(t, r.Open, "the server never ended the response")
	_ = pw.Close()
}
