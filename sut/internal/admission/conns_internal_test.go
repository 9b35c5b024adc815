package admission

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEvictionOrder: past the cap, a newcomer takes the place of a
// connection stalled for stallAfter waiting for its request head, then of
// one stalled idle, then of one stalled on its body; within a phase, the
// one that entered it first, not the oldest admitted. Failing those, of
// the oldest newcomer with no head; never of one with a request in (its
// body coming, its turn running, or answered within stallAfter): then
// the newcomer is refused. The cap being hit is logged once per
// capLogEvery, with what it cost. The tracker runs on a clock of the
// test's.
func TestEvictionOrder(t *testing.T) {
	var log bytes.Buffer
	tr, advance, admit, evicted := onTestClock(t, 4, &log)
	// Oldest first: a turn, a request being read, an idle one, a newcomer.
	turn, reading, idle, waiting := admit(), admit(), admit(), admit()
	turn.Enter()
	require.True(t, turn.Work())
	reading.Enter()
	idle.Enter()
	idle.Leave()
	assert.Same(t, waiting, evicted(), "nothing stalled: the oldest newcomer, never a connection with its request in")

	advance(stallAfter)
	assert.Same(t, waiting, evicted(), "no request head within stallAfter: the first to go")
	fresh := admit()
	assert.Same(t, idle, evicted(), "then one idle for stallAfter, before a newcomer that may yet send its head")
	fresh2 := admit()
	assert.Same(t, reading, evicted(), "then a body that has not come within stallAfter")
	fresh3 := admit()
	assert.Same(t, fresh, evicted(), "and then the oldest newcomer")

	// Every connection has a request in: coming, running, or answered.
	fresh.Enter()
	fresh2.Enter()
	fresh2.Leave()
	fresh3.Enter()
	require.True(t, fresh3.Work())
	assert.Nil(t, evicted(), "a connection with its request in is never dropped for one without")
	a, b := net.Pipe()
	defer func() { _ = a.Close(); _ = b.Close() }()
	assert.Nil(t, tr.admit(a), "the newcomer is refused")

	// The turn admitted first ends after fresh2's: fresh2 has been idle
	// longer, and goes first.
	advance(stallAfter / 2)
	turn.Leave()
	advance(stallAfter / 2)
	assert.Same(t, fresh2, evicted(), "idle for stallAfter")
	advance(stallAfter / 2)
	tr.mu.Lock()
	tr.countOutLocked(fresh2)
	tr.mu.Unlock()
	assert.Same(t, turn, evicted(), "the idle one stalled longest, not the oldest admitted")
	tr.Stop()
	tr.refusals.Wait()

	assert.Equal(t, int64(3), tr.evicted.Load())
	assert.Equal(t, int64(1), tr.refused.Load())
	assert.Equal(t, 1, bytes.Count(log.Bytes(), []byte("connection cap reached")), "logged once in capLogEvery: %s", log.String())
}

// TestRequestInOnceItsBodyIs: a request is in once its body has been read
// to its end, or at once without one, whatever its handler does next: a
// connection whose handler is not a turn is not dropped for a newcomer
// when it has been busy for stallAfter; one whose body is still coming is.
func TestRequestInOnceItsBodyIs(t *testing.T) {
	_, advance, admit, evicted := onTestClock(t, 4, io.Discard)
	get, post := admit(), admit()
	get.Enter()
	get.WatchBody(httptest.NewRequest(http.MethodGet, "/healthz", nil))
	post.Enter()
	r := httptest.NewRequest(http.MethodPost, "/api/sessions", strings.NewReader("{}"))
	post.WatchBody(r)
	_, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	advance(stallAfter)
	assert.Nil(t, evicted(), "requests in, however long their handlers run, never go")

	slow := admit()
	slow.Enter()
	slow.WatchBody(httptest.NewRequest(http.MethodPost, "/api/sessions", strings.NewReader("{}")))
	advance(stallAfter)
	assert.Same(t, slow, evicted(), "a body still coming after stallAfter goes")
}

// onTestClock is a tracker of cap n, logging to log, on a clock of the
// test's that advance moves; admit admits a connection, and evicted says
// which one a newcomer would take the place of.
func onTestClock(t *testing.T, n int, log io.Writer) (tr *ConnTracker, advance func(time.Duration), admit, evicted func() *Conn) {
	tr = NewConnTracker(n, slog.New(slog.NewTextHandler(log, nil)))
	clock := time.Now()
	tr.now = func() time.Time { return clock }
	advance = func(d time.Duration) {
		tr.mu.Lock() // the tracker reads its clock under its lock
		defer tr.mu.Unlock()
		clock = clock.Add(d)
	}
	admit = func() *Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		tc := tr.admit(a)
		require.NotNil(t, tc)
		return tc
	}
	evicted = func() *Conn {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.victimLocked()
	}
	return tr, advance, admit, evicted
}

// TestIdleConnectionWithItsNextRequestStays: a connection idle for
// stallAfter is not dropped for a newcomer as idle if its next request is
// in its socket buffer unread (a server with no CPU to read it), if its
// last answer was flushed within stallAfter (net/http writes the end of an
// answer after its handler returns), or if its next request has begun to
// be read: the flood probe's keep-alive client lost turns so.
func TestIdleConnectionWithItsNextRequestStays(t *testing.T) {
	tr, advance, _, evicted := onTestClock(t, 8, io.Discard)
	var conns []*Conn
	for range 4 {
		tc := tr.admit(&scriptedConn{in: []byte("POST / HTTP/1.1\r\n")})
		require.NotNil(t, tc)
		tc.Enter()
		tc.Leave()
		conns = append(conns, tc)
	}
	unread, answered, next, quiet := conns[0], conns[1], conns[2], conns[3]
	pending := map[net.Conn]bool{unread.Conn: true}
	tr.pending = func(c net.Conn) bool { return pending[c] }
	advance(stallAfter)

	assert.Same(t, answered, evicted(), "idle for stallAfter, its next request unread in its socket: passed over")
	_, err := answered.Write([]byte("0\r\n\r\n"))
	require.NoError(t, err)
	assert.Same(t, next, evicted(), "the end of its answer written just now: not idle for stallAfter")
	_, err = next.Read(make([]byte, 64))
	require.NoError(t, err)
	assert.Same(t, quiet, evicted(), "its next request being read: not idle")
	pending[quiet.Conn] = true
	assert.Nil(t, evicted(), "every one has a request coming, or an answer just written")
	advance(stallAfter)
	assert.Same(t, answered, evicted(), "answered stallAfter ago, and nothing since: idle, and it goes")
	tr.mu.Lock()
	tr.countOutLocked(answered)
	tr.mu.Unlock()
	assert.Same(t, next, evicted(), "a request head that stalls for stallAfter goes, as any")
	tr.Stop()
}

// scriptedConn is a connection whose reads return in, then EOF, and
// whose writes all succeed.
type scriptedConn struct {
	net.Conn // nil: only what is below is called
	in       []byte
}

func (c *scriptedConn) Read(p []byte) (int, error) {
	if len(c.in) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.in)
	c.in = c.in[n:]
	return n, nil
}

func (c *scriptedConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *scriptedConn) Close() error                { return nil }

// TestPendingInput: a connection's bytes received and not read yet are
// seen where the system tells them (Linux), and none once read.
func TestPendingInput(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("pendingInput knows of unread bytes on Linux alone")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer client.Close()
	server, err := ln.Accept()
	require.NoError(t, err)
	defer server.Close()

	assert.False(t, pendingInput(server), "nothing sent yet")
	_, err = client.Write([]byte("GET / HTTP/1.1\r\n"))
	require.NoError(t, err)
	// Loopback delivers as the write returns; the loop is for a kernel
	// that takes a moment, and ends as soon as it is seen.
	for !pendingInput(server) {
		time.Sleep(time.Millisecond)
	}
	_, err = io.ReadFull(server, make([]byte, len("GET / HTTP/1.1\r\n")))
	require.NoError(t, err)
	assert.False(t, pendingInput(server), "all read")
}
