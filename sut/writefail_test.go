package sut_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/sut"
)

// stalledClient is a ResponseWriter whose writes fail after the first: a
// client that stopped reading.
type stalledClient struct {
	h      http.Header
	writes int
}

func (c *stalledClient) Header() http.Header { return c.h }
func (c *stalledClient) WriteHeader(int)     {}
func (c *stalledClient) Flush()              {}
func (c *stalledClient) Write(p []byte) (int, error) {
	if c.writes++; c.writes > 1 {
		return 0, errors.New("write: broken pipe")
	}
	return len(p), nil
}

// TestTurnNotCommittedWhenTheClientStoppedReading: the model's whole reply
// arrives in one read, so the model call succeeds although writing to the
// client failed; the turn never reached the client and must roll back.
func TestTurnNotCommittedWhenTheClientStoppedReading(t *testing.T) {
	var mu sync.Mutex
	var lastBody string
	m := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		lastBody = string(b)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{\"content\":\"tc-a1 hello\"}}]}\n\n"+
			"data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer m.Close()
	s, err := sut.New(sut.Config{ModelURL: m.URL + "/v1", DataDir: t.TempDir()})
	require.NoError(t, err)
	defer s.Close()

	send := func(w http.ResponseWriter, stream bool, text string) {
		req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "http://127.0.0.1/v1/chat/completions",
			strings.NewReader(chatBody(t, stream, user(text))))
		req.Header.Set("X-Conversation-Id", "c1")
		s.ServeHTTP(w, req)
	}
	send(&stalledClient{h: http.Header{}}, true, "tc-u1 hi")
	send(httptest.NewRecorder(), false, "tc-u2 hi")
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, lastBody, "tc-u2")
	assert.NotContains(t, lastBody, "tc-u1", "a turn whose client stopped reading was committed")
}
