package sut

import (
	"bytes"
	"container/list"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// A server that accepts every connection runs out of file descriptors under
// a crowd of slow clients, and then cannot even reach its model. The
// listener Serve uses counts the connections it has open and keeps them to
// MaxConns. Past the cap, a new connection takes the place of the oldest
// one on which no turn is running (idle between requests, still sending
// its request, or being refused): those have cost the server nothing yet,
// and the oldest is the likeliest to be stalled. A client that has sent its
// request promptly is thus served even while hundreds of stalled ones wait
// for their deadlines. Only when a turn runs on every connection is the new
// one refused: 503 with Retry-After, written before its request is read.

// Refusals past the cap: each takes a goroutine for at most refuseTimeout,
// and at most maxRefusing run at once; past that a connection is closed
// unanswered.
const (
	refuseTimeout = 500 * time.Millisecond
	maxRefusing   = 64
)

// overloadedResponse answers a connection refused past the cap.
var overloadedResponse = []byte(jsonResponse(503, "Service Unavailable", "overloaded",
	"the server is at its connection limit; retry shortly", "Retry-After: 1\r\n"))

// connTracker counts a listener's open connections. It is safe for
// concurrent use.
type connTracker struct {
	max int

	mu sync.Mutex
	// open lists the connections counted in, oldest first.
	open     *list.List // of *trackedConn
	stopping bool
	refusing map[net.Conn]struct{}
	refusals sync.WaitGroup
	// live counts the connections admitted and not yet closed by their
	// server (which may still be busy with one it was told to drop).
	live sync.WaitGroup
}

func newConnTracker(max int) *connTracker {
	return &connTracker{max: max, open: list.New(), refusing: map[net.Conn]struct{}{}}
}

// trackedConn is a connection the tracker counts. Its handler tells it when
// a turn runs on it (work), and when a handler runs on it at all (enter,
// leave).
type trackedConn struct {
	net.Conn
	tracker *connTracker
	// handling counts the handlers running on the connection: what is
	// written while none is, net/http writes itself.
	handling atomic.Int32
	closed   sync.Once

	// Under tracker.mu:
	elem *list.Element // nil once counted out
	busy bool          // a turn runs on it: it is never evicted
}

// listener wraps ln so that its connections are tracked.
func (t *connTracker) listener(ln net.Listener) net.Listener { return trackingListener{ln, t} }

type trackingListener struct {
	net.Listener
	t *connTracker
}

// Accept returns the next connection admitted under the cap; those refused
// are answered in the background.
func (l trackingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if tc := l.t.admit(c); tc != nil {
			return tc, nil
		}
	}
}

// admit counts c in, evicting the oldest connection without a turn if the
// cap is reached, or refuses it (nil) if every connection has a turn.
func (t *connTracker) admit(c net.Conn) *trackedConn {
	t.mu.Lock()
	if t.stopping {
		t.mu.Unlock()
		_ = c.Close()
		return nil
	}
	var victim *trackedConn
	if t.open.Len() >= t.max {
		for e := t.open.Front(); e != nil; e = e.Next() {
			if tc := e.Value.(*trackedConn); !tc.busy {
				victim = tc
				break
			}
		}
		if victim == nil {
			t.mu.Unlock()
			t.refuse(c)
			return nil
		}
		t.countOutLocked(victim)
	}
	tc := &trackedConn{Conn: c, tracker: t}
	tc.elem = t.open.PushBack(tc)
	t.live.Add(1)
	t.mu.Unlock()
	if victim != nil {
		// Its handler, if one runs, sees its reads and writes fail.
		_ = victim.Conn.Close()
	}
	return tc
}

func (t *connTracker) countOutLocked(tc *trackedConn) {
	if tc.elem != nil {
		t.open.Remove(tc.elem)
		tc.elem = nil
	}
}

// refuse answers c 503 and closes it, in the background.
func (t *connTracker) refuse(c net.Conn) {
	t.mu.Lock()
	if t.stopping || len(t.refusing) >= maxRefusing {
		t.mu.Unlock()
		_ = c.Close()
		return
	}
	t.refusing[c] = struct{}{}
	t.refusals.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.refusals.Done()
		defer func() {
			t.mu.Lock()
			delete(t.refusing, c)
			t.mu.Unlock()
			_ = c.Close()
		}()
		_ = c.SetDeadline(time.Now().Add(refuseTimeout))
		if _, err := c.Write(overloadedResponse); err != nil {
			return
		}
		// Half-close, then read what the client sends until it closes:
		// closing with its request unread would reset the connection, and
		// the client could lose the answer.
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	}()
}

// stop refuses every new connection from now on and closes every one on
// which no turn runs: a graceful stop need not wait for a client that is
// idle or still sending its request, which has cost nothing yet. It does
// not wait; see wait.
func (t *connTracker) stop() {
	t.mu.Lock()
	t.stopping = true
	var drop []net.Conn
	for e := t.open.Front(); e != nil; {
		next := e.Next()
		if tc := e.Value.(*trackedConn); !tc.busy {
			t.countOutLocked(tc)
			drop = append(drop, tc.Conn)
		}
		e = next
	}
	for c := range t.refusing {
		drop = append(drop, c)
	}
	t.mu.Unlock()
	for _, c := range drop {
		_ = c.Close()
	}
}

// wait waits for the refusals in progress to end, and for the server to
// be done with every connection it was given: after an http.Server's
// Close, its connections' goroutines may still run (net/http lingers half
// a second on a connection whose request body it gave up on).
func (t *connTracker) wait() {
	t.refusals.Wait()
	t.live.Wait()
}

// connKey is the context key of the *trackedConn a request came on.
type connKey struct{}

// connContext is http.Server.ConnContext: it puts the tracked connection in
// its requests' contexts.
func (t *connTracker) connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*trackedConn); ok {
		return context.WithValue(ctx, connKey{}, tc)
	}
	return ctx
}

// connOf returns the tracked connection of a request's context, or nil for
// a request that did not come through the tracking listener (a handler
// served by another http.Server); every method below is a no-op on nil.
func connOf(ctx context.Context) *trackedConn {
	tc, _ := ctx.Value(connKey{}).(*trackedConn)
	return tc
}

// enter marks a handler running on the connection.
func (tc *trackedConn) enter() {
	if tc != nil {
		tc.handling.Add(1)
	}
}

// leave marks the handler done, and no turn running.
func (tc *trackedConn) leave() {
	if tc == nil {
		return
	}
	tc.tracker.mu.Lock()
	tc.busy = false
	tc.tracker.mu.Unlock()
	tc.handling.Add(-1)
}

// work marks a turn running on the connection, so that it is not evicted.
// It reports false if the connection was evicted or dropped by a stop
// already: its client is gone.
func (tc *trackedConn) work() bool {
	if tc == nil {
		return true
	}
	tc.tracker.mu.Lock()
	defer tc.tracker.mu.Unlock()
	if tc.elem == nil {
		return false
	}
	tc.busy = true
	return true
}

// Close counts the connection out and closes it.
func (tc *trackedConn) Close() error {
	tc.tracker.mu.Lock()
	tc.tracker.countOutLocked(tc)
	tc.tracker.mu.Unlock()
	err := tc.Conn.Close()
	tc.closed.Do(tc.tracker.live.Done)
	return err
}

// CloseWrite half-closes the connection, as net/http does before it
// hangs up on a request it refused.
func (tc *trackedConn) CloseWrite() error {
	if cw, ok := tc.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Write writes p, turning the plain-text error answers net/http writes
// itself (malformed requests, headers too large) into the JSON error
// shape. Those are written only when no handler runs on the connection.
func (tc *trackedConn) Write(p []byte) (int, error) {
	if bytes.HasPrefix(p, []byte("HTTP/1.1 ")) && tc.handling.Load() == 0 {
		if j, ok := jsonHTTPError(p); ok || isExpectationFailed(p) {
			if !ok {
				j = []byte(jsonResponse(http.StatusExpectationFailed, "Expectation Failed", "invalid_request_error",
					"the request's Expect header asks for what this server does not do (only 100-continue is understood)", ""))
			}
			if _, err := tc.Conn.Write(j); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	return tc.Conn.Write(p)
}
