package sut_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Slow clients: deadlines, caps and a bounded stop (conns.go, listen.go).

// addrOf is the host:port of a server's base URL.
func addrOf(baseURL string) string { return strings.TrimPrefix(baseURL, "http://") }

// stall opens a connection to addr and sends the headers of a chat request
// declaring a body of length bytes, and its first byte; then nothing. The
// connection is closed when the test ends.
func stall(t testing.TB, addr string, length int64) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, requestDeadline)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"+
		"X-Conversation-Id: stalled\r\nContent-Length: %d\r\n\r\n{", length)
	require.NoError(t, err)
	return c
}

// readAnswer reads the response on c within d; ok is false if none came.
func readAnswer(t testing.TB, c net.Conn, d time.Duration) (reply, bool) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(d)))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return reply{}, false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: body}, true
}

// stillOpen reports, for each connection, whether the server still holds
// it open: a read that times out after wait (nothing came, nothing
// closed). They are probed at once, so that the probe takes wait in all.
func stillOpen(conns []net.Conn, wait time.Duration) []bool {
	open := make([]bool, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() {
			_ = c.SetReadDeadline(time.Now().Add(wait))
			_, err := c.Read(make([]byte, 1))
			open[i] = errors.Is(err, os.ErrDeadlineExceeded)
		})
	}
	wg.Wait()
	return open
}

func count(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// stallHead opens a connection to addr and sends the start of a request
// head, then nothing (a header slowloris). The connection is closed when
// the test ends.
func stallHead(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, requestDeadline)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
	require.NoError(t, err)
	return c
}

// stoppedClock is a connection clock that never moves: no connection
// ever stalls on it.
func stoppedClock() func() time.Time {
	at := time.Now()
	return func() time.Time { return at }
}

// TestStalledClientsDoNotStarveTurns: hundreds of clients that send their
// headers and one byte of body, then nothing, neither hold more than
// MaxConns connections nor keep a client that sends a whole turn from
// being served at once once they have stalled (stallAfter, moved on the
// server's connection clock here). The body deadline is a minute, so that
// it is the cap that makes room, not the deadline.
func TestStalledClientsDoNotStarveTurns(t *testing.T) {
	t.Parallel()
	const stalled, maxConns = 300, 64
	e := newEnv(t, sut.Config{MaxConns: maxConns, BodyTimeout: time.Minute})
	var ahead atomic.Int64
	e.srv.SetConnClock(func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) })
	conns := make([]net.Conn, stalled)
	for i := range conns {
		conns[i] = stall(t, addrOf(e.srv.URL()), 100)
	}
	// Every stalled client was taken in or refused: the server holds the
	// cap's worth.
	require.Eventually(t, func() bool { return count(stillOpen(conns, 10*time.Millisecond)) == maxConns },
		requestDeadline, time.Millisecond)
	ahead.Store(int64(time.Minute))
	start := time.Now()
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	took := time.Since(start)
	open := count(stillOpen(conns, 300*time.Millisecond))
	t.Logf("%d stalled connections (cap %d): a turn took %s; %d stalled ones still open", stalled, maxConns, took, open)
	assert.Less(t, took, 2*time.Second, "a turn must not wait for stalled clients")
	assert.Less(t, open, maxConns, "the server holds more connections than its cap")
	assert.Positive(t, open, "the stalled clients not dropped for the turn may stay until their deadline")
	assert.Equal(t, toks("u1", "a1", "u2"), e.ok(t, "", "c1", "tc-u2"))
}

// TestKeepAliveClientOutlastsANewcomerFlood: a client whose connection is
// idle between its turns keeps it while a crowd of newcomers that send
// part of a head, none stalled yet, turns over past the cap: each takes
// the place of the oldest newcomer, and the client's next turn is served
// on the same connection.
func TestKeepAliveClientOutlastsANewcomerFlood(t *testing.T) {
	const newcomers, maxConns = 40, 8
	e := newEnv(t, sut.Config{MaxConns: maxConns})
	e.srv.SetConnClock(stoppedClock())
	c, err := net.Dial("tcp", addrOf(e.srv.URL()))
	require.NoError(t, err)
	defer c.Close()
	br := bufio.NewReader(c)
	turn := func(tok string) int {
		body := chatBody(t, false, user(tok+" hello from the test"))
		_, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"+
			"X-Conversation-Id: c1\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(requestDeadline)))
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, "the client's connection was dropped")
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, turn("tc-u1"))

	conns := make([]net.Conn, newcomers)
	for i := range conns {
		conns[i] = stallHead(t, addrOf(e.srv.URL()))
	}
	// The newcomers are in: past the cap, each took the place of one.
	require.Eventually(t, func() bool { return count(stillOpen(conns, 10*time.Millisecond)) <= maxConns },
		requestDeadline, time.Millisecond)
	require.Equal(t, http.StatusOK, turn("tc-u2"), "the turn on the kept connection")
	assert.Equal(t, maxConns-1, count(stillOpen(conns, 10*time.Millisecond)), "each took the place of the oldest newcomer")
}

// TestNewcomerRefusedWhileEveryConnectionHasARequestIn: at MaxConns, with
// the head of a request in on every connection (its body still coming,
// within stallAfter), a new connection gets 503 and none of theirs is
// dropped; once their bodies have stalled, a new one takes the place of
// the one stalled longest.
func TestNewcomerRefusedWhileEveryConnectionHasARequestIn(t *testing.T) {
	const maxConns = 4
	g := &sut.Gauge{}
	e := newEnv(t, sut.Config{MaxConns: maxConns, BodyTimeout: time.Minute, Gauge: g})
	var ahead atomic.Int64
	e.srv.SetConnClock(func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) })
	var conns []net.Conn
	for i := range maxConns {
		conns = append(conns, stall(t, addrOf(e.srv.URL()), 100))
		// One at a time, so that they stall in order.
		awaitGauge(t, g, fmt.Sprintf("%d bodies being read", i+1), func(working, _ int) bool { return working == i+1 })
	}
	// Refused past the cap, the newcomer is answered before its request is
	// read: on a busy machine the answer may come before a client's
	// request is written, which Go's client takes for an unsolicited
	// response. Read it off the connection as it comes.
	c, err := net.Dial("tcp", addrOf(e.srv.URL()))
	require.NoError(t, err)
	defer c.Close()
	body := chatBody(t, false, user("tc-u1 hello"))
	_, _ = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"+
		"X-Conversation-Id: c1\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(requestDeadline)))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, "the server must answer, not hang or drop the connection")
	answer, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	_ = resp.Body.Close()
	requireErrorBody(t, reply{status: resp.StatusCode, header: resp.Header, body: answer}, http.StatusServiceUnavailable, "overloaded")
	assert.Equal(t, []bool{true, true, true, true}, stillOpen(conns, 100*time.Millisecond), "a request coming in was dropped for a newcomer")

	ahead.Store(int64(time.Minute))
	assert.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	assert.Equal(t, []bool{false, true, true, true}, stillOpen(conns, 100*time.Millisecond), "the body stalled longest makes room")
}

// TestStalledClientsUnderTheDefaultCaps: the same crowd under the default
// caps is simply held, and a turn is still served at once.
func TestStalledClientsUnderTheDefaultCaps(t *testing.T) {
	const stalled = 300
	e := newEnv(t, sut.Config{})
	for range stalled {
		stall(t, addrOf(e.srv.URL()), 100)
	}
	start := time.Now()
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	took := time.Since(start)
	t.Logf("%d stalled connections (default caps): a turn took %s", stalled, took)
	assert.Less(t, took, 2*time.Second)
}

// TestStalledBodyGets408: a body that does not arrive within BodyTimeout
// gets 408 in the JSON error shape, and its connection closes.
func TestStalledBodyGets408(t *testing.T) {
	e := newEnv(t, sut.Config{BodyTimeout: 200 * time.Millisecond})
	c := stall(t, addrOf(e.srv.URL()), 100)
	start := time.Now()
	r, ok := readAnswer(t, c, 3*time.Second)
	require.True(t, ok, "no answer to a stalled body: the server waits for it forever")
	requireErrorBody(t, r, http.StatusRequestTimeout, "request_timeout")
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.Equal(t, []bool{false}, stillOpen([]net.Conn{c}, time.Second), "the connection must close after a 408")
	assert.Zero(t, e.model.CallCount())
}

// TestDeclaredLengthOverTheLimitIs413AtOnce: a request whose Content-Length
// is over MaxBodyBytes gets 413 before a byte of its body is read, not
// when the body has come (or after the body deadline).
func TestDeclaredLengthOverTheLimitIs413AtOnce(t *testing.T) {
	e := newEnv(t, sut.Config{BodyTimeout: time.Minute})
	c := stall(t, addrOf(e.srv.URL()), 99999999999)
	r, ok := readAnswer(t, c, 3*time.Second)
	require.True(t, ok, "no answer: the server waits for a body it will refuse")
	requireErrorBody(t, r, http.StatusRequestEntityTooLarge, "request_too_large")
	assert.Equal(t, []bool{false}, stillOpen([]net.Conn{c}, time.Second), "the connection must close: the rest of the body is not worth reading")
}

// TestIdleConnectionsClose: a keep-alive connection that sends no next
// request is closed after IdleTimeout.
func TestIdleConnectionsClose(t *testing.T) {
	e := newEnv(t, sut.Config{IdleTimeout: 200 * time.Millisecond})
	c, err := net.Dial("tcp", addrOf(e.srv.URL()))
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	require.NoError(t, err)
	r, ok := readAnswer(t, c, 3*time.Second)
	require.True(t, ok)
	require.Equal(t, http.StatusOK, r.status)
	start := time.Now()
	assert.Equal(t, []bool{false}, stillOpen([]net.Conn{c}, 3*time.Second), "an idle connection stays open")
	assert.Less(t, time.Since(start), 2*time.Second)
}

// TestConnCapRefusesWhenEveryConnectionHasATurn: at MaxConns, with a turn
// running on every connection, a new one gets 503 with Retry-After in the
// JSON error shape; once a turn ends, turns are served again.
func TestConnCapRefusesWhenEveryConnectionHasATurn(t *testing.T) {
	e := newRaceEnv(t, sut.Config{MaxConns: 2})
	g1, g2 := e.model.hold("tc-u1"), e.model.hold("tc-u2")
	f1, f2 := e.send(t, "c1", "tc-u1", false), e.send(t, "c2", "tc-u2", false)
	arrive(t, g1, "tc-u1")
	arrive(t, g2, "tc-u2")

	c, err := net.Dial("tcp", addrOf(e.srv.URL()))
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
	require.NoError(t, err)
	r, ok := readAnswer(t, c, 3*time.Second)
	require.True(t, ok, "no answer past the connection cap")
	requireErrorBody(t, r, http.StatusServiceUnavailable, "overloaded")
	assert.Equal(t, "1", r.header.Get("Retry-After"))

	g1.open()
	g2.open()
	requireOK(t, f1.wait(t), false)
	requireOK(t, f2.wait(t), false)
	assert.Equal(t, hist("u1", "a1", "u3"), e.ok(t, "c1", "tc-u3", false))
}

// TestRequestCapAnswers503: past MaxRequests turns at once, a request gets
// 503 with Retry-After, and nothing changes; the log says who refused it,
// and, when the server stops, how many it refused since its last line.
func TestRequestCapAnswers503(t *testing.T) {
	var log syncbuf.Buffer
	e := newRaceEnv(t, sut.Config{MaxRequests: 1, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	g := e.model.hold("tc-u1")
	f := e.send(t, "c1", "tc-u1", false)
	arrive(t, g, "tc-u1")

	r := e.send(t, "c2", "tc-u2", false).wait(t)
	requireErrorBody(t, r, http.StatusServiceUnavailable, "overloaded")
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	assert.Empty(t, e.model.callsOf("tc-u2"), "a refused request must not reach the model")
	assert.Contains(t, log.String(), `msg="refused for load" by=max_requests`)

	requireErrorBody(t, e.send(t, "c2", "tc-u4", false).wait(t), http.StatusServiceUnavailable, "overloaded")

	g.open()
	requireOK(t, f.wait(t), false)
	assert.Equal(t, hist("u3"), e.ok(t, "c2", "tc-u3", false), "c2 is as it was")
	assert.NotContains(t, log.String(), "refused_in_all=2", "a line every 10 s at most")
	require.NoError(t, e.srv.Close())
	assert.Contains(t, log.String(), "refused_since_last_line=1 refused_in_all=2", "the refusal since the last line, at the stop")
}

// TestShutdownDoesNotWaitForStalledClients: a graceful stop closes the
// connections on which no turn runs at once, so that a stalled body (or an
// idle keep-alive connection) does not hold it until its context ends.
func TestShutdownDoesNotWaitForStalledClients(t *testing.T) {
	m := startModel(t)
	run, err := sut.Start(sut.Config{ModelURL: m.URL(), DataDir: t.TempDir(), BodyTimeout: time.Minute}, "")
	require.NoError(t, err)
	c := stall(t, addrOf(run.URL()), 100)
	// Let the server take the request in before it stops.
	require.Eventually(t, func() bool { return stillOpen([]net.Conn{c}, 10*time.Millisecond)[0] }, time.Second, time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, run.Shutdown(ctx))
	assert.Less(t, time.Since(start), 2*time.Second, "the stop waited for a stalled client")
}

// TestHTTPLayerErrorsAreJSON: what net/http answers itself, before any
// handler (headers too large, a malformed header, an unsupported transfer
// coding), comes in the JSON error shape.
func TestHTTPLayerErrorsAreJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t, sut.Config{})
	for _, tc := range []struct {
		name   string
		req    string
		status int
	}{
		{"headers too large", "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + strings.Repeat("x", sut.MaxHeaderBytes+8192) + "\r\n\r\n", http.StatusRequestHeaderFieldsTooLarge},
		{"header line without a colon", "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n", http.StatusBadRequest},
		{"control byte in a header", "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Conversation-Id: a\x01b\r\n\r\n", http.StatusBadRequest},
		{"no Host", "GET /healthz HTTP/1.1\r\n\r\n", http.StatusBadRequest},
		{"unsupported transfer coding", "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip\r\n\r\n", http.StatusNotImplemented},
		{"malformed request line", "GARBAGE\r\n\r\n", http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addrOf(e.srv.URL()))
			require.NoError(t, err)
			defer c.Close()
			_, err = io.WriteString(c, tc.req)
			require.NoError(t, err)
			r, ok := readAnswer(t, c, 3*time.Second)
			require.True(t, ok)
			requireErrorBody(t, r, tc.status, "invalid_request_error")
			var eb struct{ Error struct{ Message string } }
			require.NoError(t, json.Unmarshal(r.body, &eb))
			t.Logf("%d %s", r.status, eb.Error.Message)
		})
	}
	// The server still serves.
	assert.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
}

// TestChunkedRequestClosesItsConnection: a request framed both by
// Transfer-Encoding and by Content-Length is answered as chunked, and its
// connection closed after the answer, so that a request smuggled behind
// it, which a front framing by length would take for body, is never
// served (RFC 9112 6.1). Plain requests keep their connection.
func TestChunkedRequestClosesItsConnection(t *testing.T) {
	e := newEnv(t, sut.Config{})
	body := chatBody(t, false, user("tc-u1"))
	smuggled := "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
	c, err := net.Dial("tcp", addrOf(e.srv.URL()))
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"+
		"X-Conversation-Id: c1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n%x\r\n%s\r\n0\r\n\r\n%s", len(body), body, smuggled)
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(requestDeadline)))
	all, err := io.ReadAll(c) // to EOF: the server closes the connection
	require.NoError(t, err, "the connection stayed open after a chunked request")
	assert.Equal(t, 1, strings.Count(string(all), "HTTP/1.1 "), "one answer, and none for the smuggled request:\n%s", all)
	assert.Contains(t, string(all), "HTTP/1.1 200 ")

	// A request framed by its length alone keeps its connection.
	c2, err := net.Dial("tcp", addrOf(e.srv.URL()))
	require.NoError(t, err)
	defer c2.Close()
	body2 := chatBody(t, false, user("tc-u2"))
	_, err = fmt.Fprintf(c2, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"+
		"X-Conversation-Id: c1\r\nContent-Length: %d\r\n\r\n%s%s", len(body2), body2, smuggled)
	require.NoError(t, err)
	br := bufio.NewReader(c2)
	require.NoError(t, c2.SetReadDeadline(time.Now().Add(requestDeadline)))
	for i := range 2 {
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, "answer %d", i+1)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
}

// TestHTTPHygiene: two Authorization headers are refused (which one a
// front checked is anyone's guess), a compressed body is refused rather
// than read as plain, and an Expect the server does not understand gets
// 417 in the JSON error shape; none reaches the model.
func TestHTTPHygiene(t *testing.T) {
	e := newEnv(t, sut.Config{Keys: []string{"key-a"}})
	body := chatBody(t, false, user("tc-u9"))
	for _, tc := range []struct {
		name   string
		lines  []string
		status int
	}{
		{"two Authorization headers", []string{"Authorization: Bearer key-a", "Authorization: Bearer bogus", "X-Conversation-Id: c1"}, http.StatusUnauthorized},
		{"two valid Authorization headers", []string{"Authorization: Bearer key-a", "Authorization: Bearer key-a", "X-Conversation-Id: c1"}, http.StatusUnauthorized},
		{"gzip body", []string{"Authorization: Bearer key-a", "Content-Encoding: gzip", "X-Conversation-Id: c1"}, http.StatusUnsupportedMediaType},
		{"two encodings", []string{"Authorization: Bearer key-a", "Content-Encoding: identity", "Content-Encoding: br", "X-Conversation-Id: c1"}, http.StatusUnsupportedMediaType},
		{"unknown Expect", []string{"Authorization: Bearer key-a", "Expect: gimme", "X-Conversation-Id: c1"}, http.StatusExpectationFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := e.model.CallCount()
			r := postRaw(t, e.srv.URL(), body, tc.lines...)
			requireErrorBody(t, r, tc.status, "")
			assert.Equal(t, n, e.model.CallCount(), "a refused request must not reach the model")
		})
	}
	// Content-Encoding: identity is no encoding at all.
	r := postRaw(t, e.srv.URL(), chatBody(t, false, user("tc-u1")), "Authorization: Bearer key-a", "Content-Encoding: identity", "X-Conversation-Id: c1")
	assert.Equal(t, http.StatusOK, r.status, "%s", r.body)
}
