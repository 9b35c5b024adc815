package sut_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/sut"
)

// TestMemoryBudgetRefusesABodyItCannotAfford: with the budget taken by a
// reply in flight, requests whose bodies are still coming hold what their
// Content-Length says they will cost, and the one that no longer fits is
// refused before its body is read: 503 overloaded with Retry-After, its
// connection closed. The reply in flight ends ok.
func TestMemoryBudgetRefusesABodyItCannotAfford(t *testing.T) {
	t.Parallel()
	const maxBody, maxHistory, reply = 64 << 10, 256 << 10, 4<<20 - 4<<10
	released := make(chan struct{})
	arrived := make(chan struct{}, 1)
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		size := 16
		hold := strings.Contains(string(body), "hold")
		if hold {
			size = reply
		}
		for left := size; left > 0; left -= 32 << 10 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", strings.Repeat("x", min(left, 32<<10)))
		}
		w.(http.Flusher).Flush()
		if hold {
			arrived <- struct{}{}
			select {
			case <-released:
			case <-r.Context().Done():
			}
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer model.Close()
	// The least budget these limits take: one turn at them.
	least := int64(64<<10 + 3*maxBody + 4*maxHistory + 3*4<<20)
	srv, err := sut.Start(sut.Config{ModelURL: model.URL + "/v1", DataDir: t.TempDir(), MaxMemory: least,
		MaxBodyBytes: maxBody, MaxHistoryBytes: maxHistory}, "127.0.0.1:0")
	require.NoError(t, err)
	defer srv.Close()
	client := &http.Client{Timeout: requestDeadline}
	defer client.CloseIdleConnections()

	// The held turn streams: once its client has every byte of the reply,
	// the server has reserved it.
	drained, held := make(chan struct{}), make(chan string, 1)
	go func() {
		resp, err := client.Post(srv.URL()+"/v1/chat/completions", "application/json",
			strings.NewReader(chatBody(t, true, user("hold tc-u1"))))
		if err != nil {
			close(drained)
			held <- err.Error()
			return
		}
		defer resp.Body.Close()
		var stream strings.Builder
		buf, xs := make([]byte, 64<<10), 0
		for {
			n, err := resp.Body.Read(buf)
			stream.Write(buf[:n])
			if xs < reply {
				if xs += strings.Count(string(buf[:n]), "x"); xs >= reply {
					close(drained)
				}
			}
			if err != nil {
				break
			}
		}
		if xs < reply {
			close(drained)
		}
		held <- stream.String()[max(0, stream.Len()-200):]
	}()
	select {
	case <-drained:
	case <-time.After(requestDeadline):
		require.FailNow(t, "the held reply never reached its client")
	}
	<-arrived
	// Bodies that never come, each declared at the limit: what is left
	// beside the reply takes four (three times the body, and what every
	// request costs, 64 KiB), not six. The four wait for their bodies
	// (for BodyTimeout, 15 s), holding what they reserved; two are
	// answered at once.
	type answer struct {
		resp *http.Response
		body string
		err  error
	}
	answers := make(chan answer, 6)
	for i := range 6 {
		conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL(), "http://"))
		require.NoError(t, err)
		defer conn.Close()
		_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Conversation-Id: slow-%d\r\nContent-Length: %d\r\n\r\n", i, maxBody)
		require.NoError(t, err)
		go func() {
			_ = conn.SetReadDeadline(time.Now().Add(requestDeadline))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			answers <- answer{resp: resp, body: string(body), err: err}
		}()
	}
	for range 2 {
		a := <-answers
		require.NoError(t, a.err)
		assert.Equal(t, http.StatusServiceUnavailable, a.resp.StatusCode, a.body)
		assert.Equal(t, "1", a.resp.Header.Get("Retry-After"))
		assert.True(t, a.resp.Close, "the connection of a refused body must close")
		assert.Contains(t, a.body, `"type":"overloaded"`)
		assert.Contains(t, a.body, "memory budget")
	}
	close(released)
	end := <-held
	assert.Contains(t, end, `"finish_reason":"stop"`, "the held turn did not end ok")
	assert.Contains(t, end, "[DONE]")
}
