package admission

import (
	"bytes"
	"container/list"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// A server that accepts every connection runs out of file descriptors under
// a crowd of slow clients, and then cannot even reach its model. The
// listener Serve uses counts the connections it has open and keeps them to
// MaxConns. Past the cap, a new connection takes the place of a stalled
// one: one that has waited stallAfter for a request head (a header
// slowloris, first), one idle for stallAfter since its last answer, one
// whose body has not come within stallAfter of its head (a body
// slowloris); within each, the one stalled longest. A client sends its
// request at once, so none of its connections ranks as stalled while it
// works: a keep-alive client keeps its connection through a flood. Failing
// a stalled one, the newcomer takes the place of the oldest other newcomer
// with no head yet (a flood of them turns over, and a client's connection
// among them is safe as soon as its head is in); a connection with a
// request in (coming, running, or answered within stallAfter) is never
// dropped for one without. Failing that too, the new connection is
// refused: 503 with Retry-After, written before its request is read. The
// cap being hit is counted, and logged at most once per capLogEvery.

// Refusals past the cap: each takes a goroutine for at most refuseTimeout,
// and at most maxRefusing run at once; past that a connection is closed
// unanswered.
const (
	refuseTimeout = 500 * time.Millisecond
	maxRefusing   = 64
)

// capLogEvery is how often, at most, the cap being hit is logged: a
// flood must not flood the log too.
const capLogEvery = 10 * time.Second

// stallAfter is how long a connection may wait for a request head (new,
// or idle since its last answer), or for the body of a request whose head
// is in, before it ranks as stalled: a client on this machine sends its
// request at once, and its body with its head.
const stallAfter = time.Second

// overloadedResponse answers a connection refused past the cap.
var overloadedResponse = Overloaded("the server is at its connection limit; retry shortly").raw()

// ConnTracker counts a listener's open connections. It is safe for
// concurrent use.
type ConnTracker struct {
	// Max is the cap on open connections.
	Max int
	// log, if not nil, hears of the cap being hit (rate-limited).
	log *slog.Logger

	// evicted and refused count the connections dropped to make room,
	// and those refused, since the tracker started.
	evicted, refused atomic.Int64
	// logged is when the cap was last logged (Unix nanoseconds), and the
	// counts then.
	logged                     atomic.Int64
	loggedEvicted, loggedRefus atomic.Int64

	// crashed is set when a crash begins (crash): every write on a
	// connection fails from then on, as if it were closed already.
	crashed atomic.Bool

	mu sync.Mutex
	// now is the clock stalls are judged by (read and set under mu).
	now func() time.Time
	// pending reports whether a connection has bytes received and not
	// read yet (pendingInput; a test's own in tests).
	pending func(net.Conn) bool
	// open lists the connections counted in by phase, each in the order
	// they entered it: the front of each has been in it longest.
	open     [phases]*list.List // of *trackedConn
	stopping bool
	refusing map[net.Conn]struct{}
	refusals sync.WaitGroup
	// live counts the connections admitted and not yet closed by their
	// server (which may still be busy with one it was told to drop).
	live sync.WaitGroup
}

// maxIdleLooks bounds the idle connections a newcomer looks at for one
// to take the place of, passing over those with a request unread: an
// admission costs a few system calls at most.
const maxIdleLooks = 8

// NewConnTracker returns a tracker that keeps a listener's connections to
// max, logging to log (if not nil) when the cap is hit.
func NewConnTracker(max int, log *slog.Logger) *ConnTracker {
	t := &ConnTracker{Max: max, log: log, now: time.Now, pending: pendingInput, refusing: map[net.Conn]struct{}{}}
	for p := range t.open {
		t.open[p] = list.New()
	}
	return t
}

// phase is where a connection is in its request cycle.
type phase int

const (
	// waiting: admitted, no request head yet.
	waiting phase = iota
	// idle: between requests, its last one answered.
	idle
	// reading: a request head in, no turn running (its body is coming,
	// or the request is being refused).
	reading
	// working: a turn runs on it; it is never dropped for a newcomer.
	working
	phases
)

// openLocked is how many connections are counted in.
func (t *ConnTracker) openLocked() int {
	n := 0
	for _, l := range t.open {
		n += l.Len()
	}
	return n
}

// Conn is a connection the tracker counts. Its handler tells it when
// a turn runs on it (work), and when a handler runs on it at all (enter,
// leave).
type Conn struct {
	net.Conn
	tracker *ConnTracker
	// handling counts the handlers running on the connection: what is
	// written while none is, net/http writes itself.
	handling atomic.Int32
	closed   sync.Once

	// isIdle is set while the connection is idle (leave), so that its
	// reads and writes outside a handler (Read, Write) can tell, without
	// the tracker's lock, that they end or follow its idleness.
	isIdle atomic.Bool

	// Under tracker.mu:
	elem  *list.Element // in tracker.open[phase]; nil once counted out
	phase phase
	// since is when it entered its phase.
	since time.Time
}

// moveLocked puts tc, counted in, in phase p from now on. Called under
// tracker.mu.
func (tc *Conn) moveLocked(p phase) {
	if tc.elem == nil {
		return
	}
	t := tc.tracker
	t.open[tc.phase].Remove(tc.elem)
	tc.phase, tc.since = p, t.now()
	tc.elem = t.open[p].PushBack(tc)
	tc.isIdle.Store(p == idle)
}

// Listener wraps ln so that its connections are tracked.
func (t *ConnTracker) Listener(ln net.Listener) net.Listener { return trackingListener{ln, t} }

type trackingListener struct {
	net.Listener
	t *ConnTracker
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

// admit counts c in, making room past the cap (victimLocked), or refuses
// it (nil) if there is none to make.
func (t *ConnTracker) admit(c net.Conn) *Conn {
	t.mu.Lock()
	if t.stopping {
		t.mu.Unlock()
		_ = c.Close()
		return nil
	}
	var victim *Conn
	if t.openLocked() >= t.Max {
		victim = t.victimLocked()
		if victim == nil {
			t.mu.Unlock()
			t.refused.Add(1)
			t.logCap()
			t.refuse(c)
			return nil
		}
		t.countOutLocked(victim)
		t.evicted.Add(1)
	}
	tc := &Conn{Conn: c, tracker: t, phase: waiting, since: t.now()}
	tc.elem = t.open[waiting].PushBack(tc)
	t.live.Add(1)
	t.mu.Unlock()
	if victim != nil {
		t.logCap()
		// Its handler, if one runs, sees its reads and writes fail.
		_ = victim.Conn.Close()
	}
	return tc
}

// victimLocked is the connection to drop for a newcomer: the one stalled
// longest waiting for a head, idle, or reading a body, in that order; else
// the oldest newcomer; nil if every connection has a request in. Each
// phase's list is in the order its connections entered it, so only the
// fronts are looked at, but for idle ones: an idle connection whose next
// request is in its socket buffer, unread (pendingInput), is not idle but
// on a server too busy to read it yet, and is passed over, as are at most
// maxIdleLooks of them. (One answered or reading its next request within
// stallAfter is never at the front as stalled: Write and Read move it.)
func (t *ConnTracker) victimLocked() *Conn {
	now := t.now()
	for _, p := range []phase{waiting, idle, reading} {
		looks := 1
		if p == idle {
			looks = maxIdleLooks
		}
		for e := t.open[p].Front(); e != nil && looks > 0; e, looks = e.Next(), looks-1 {
			tc := e.Value.(*Conn)
			if now.Sub(tc.since) < stallAfter {
				break
			}
			if p != idle || !t.pending(tc.Conn) {
				return tc
			}
		}
	}
	if e := t.open[waiting].Front(); e != nil {
		return e.Value.(*Conn)
	}
	return nil
}

// logCap logs the cap being hit, with what it cost since the last time,
// at most once per capLogEvery.
func (t *ConnTracker) logCap() {
	if t.log == nil {
		return
	}
	now, last := time.Now().UnixNano(), t.logged.Load()
	if now-last < int64(capLogEvery) || !t.logged.CompareAndSwap(last, now) {
		return
	}
	ev, rf := t.evicted.Load(), t.refused.Load()
	t.log.Warn("connection cap reached: stalled or newest connections dropped to make room, new ones refused when every connection has a request in",
		"max_conns", t.Max, "dropped", ev-t.loggedEvicted.Swap(ev), "refused", rf-t.loggedRefus.Swap(rf))
}

func (t *ConnTracker) countOutLocked(tc *Conn) {
	if tc.elem != nil {
		t.open[tc.phase].Remove(tc.elem)
		tc.elem = nil
	}
}

// refuse answers c 503 and closes it, in the background.
func (t *ConnTracker) refuse(c net.Conn) {
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

// Stop refuses every new connection from now on and closes every one on
// which no turn runs: a graceful stop need not wait for a client that is
// idle or still sending its request, which has cost nothing yet. It does
// not wait; see wait.
func (t *ConnTracker) Stop() { t.drop(working) }

// Crash is stop for a kill -9: from the moment it is called nothing more
// is written on any connection (Write fails), and it closes every one,
// those on which a turn runs too. The closes come one after another, and
// a turn may end as soon as its own connection goes: the turn waiting
// behind it then starts, or is refused, and without the gate could answer
// on a connection not closed yet. It does not wait; see wait.
func (t *ConnTracker) Crash() {
	t.crashed.Store(true)
	t.drop(phases)
}

// drop refuses every new connection from now on and closes every one in
// a phase before upTo, and every one being refused.
func (t *ConnTracker) drop(upTo phase) {
	t.mu.Lock()
	t.stopping = true
	var drop []net.Conn
	for p := range upTo {
		for e := t.open[p].Front(); e != nil; {
			next := e.Next()
			tc := e.Value.(*Conn)
			t.countOutLocked(tc)
			drop = append(drop, tc.Conn)
			e = next
		}
	}
	for c := range t.refusing {
		drop = append(drop, c)
	}
	t.mu.Unlock()
	for _, c := range drop {
		_ = c.Close()
	}
}

// Wait waits for the refusals in progress to end, and for the server to
// be done with every connection it was given: after an http.Server's
// Close, its connections' goroutines may still run (net/http lingers half
// a second on a connection whose request body it gave up on).
func (t *ConnTracker) Wait() {
	t.refusals.Wait()
	t.live.Wait()
}

// connKey is the context key of the *trackedConn a request came on.
type connKey struct{}

// ConnContext is http.Server.ConnContext: it puts the tracked connection in
// its requests' contexts.
func (t *ConnTracker) ConnContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*Conn); ok {
		return context.WithValue(ctx, connKey{}, tc)
	}
	return ctx
}

// ConnOf returns the tracked connection of a request's context, or nil for
// a request that did not come through the tracking listener (a handler
// served by another http.Server); every method below is a no-op on nil.
func ConnOf(ctx context.Context) *Conn {
	tc, _ := ctx.Value(connKey{}).(*Conn)
	return tc
}

// Enter marks a handler running on the connection: its request head is
// in, and its body is coming.
func (tc *Conn) Enter() {
	if tc == nil {
		return
	}
	tc.handling.Add(1)
	tc.tracker.mu.Lock()
	tc.moveLocked(reading)
	tc.tracker.mu.Unlock()
}

// WatchBody marks the connection's request in once r's body has been
// read to its end, at once for a request without one: from then on the
// cap never drops the connection for one without, whatever its handler
// does next (a turn, or a health check or a session made, which may wait
// on the store).
func (tc *Conn) WatchBody(r *http.Request) {
	if tc == nil {
		return
	}
	if r.Body == nil || r.Body == http.NoBody {
		tc.Work()
		return
	}
	r.Body = &bodyIn{ReadCloser: r.Body, conn: tc}
}

// bodyIn is a request body that marks its connection's request in when
// it has been read to its end.
type bodyIn struct {
	io.ReadCloser
	conn *Conn
}

// Read reads the body, and marks its connection as past its head once
// the first byte of it is in.
func (b *bodyIn) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.conn.Work()
	}
	return n, err
}

// Leave marks the handler done: the connection is idle, waiting for its
// next request.
func (tc *Conn) Leave() {
	if tc == nil {
		return
	}
	tc.tracker.mu.Lock()
	tc.moveLocked(idle)
	tc.tracker.mu.Unlock()
	tc.handling.Add(-1)
}

// Work marks a turn running on the connection, so that it is not evicted.
// It reports false if the connection was evicted or dropped by a stop
// already: its client is gone.
func (tc *Conn) Work() bool {
	if tc == nil {
		return true
	}
	tc.tracker.mu.Lock()
	defer tc.tracker.mu.Unlock()
	if tc.elem == nil {
		return false
	}
	tc.moveLocked(working)
	return true
}

// Read reads from the connection. The first bytes read on an idle one
// are its next request coming, before its handler runs: from then on it
// is reading, not idle, so that a server too busy to get to the handler
// within stallAfter does not drop it for a newcomer as if idle.
func (tc *Conn) Read(p []byte) (int, error) {
	n, err := tc.Conn.Read(p)
	if n > 0 && tc.isIdle.Load() {
		tc.tracker.mu.Lock()
		if tc.phase == idle {
			tc.moveLocked(reading)
		}
		tc.tracker.mu.Unlock()
	}
	return n, err
}

// Close counts the connection out and closes it.
func (tc *Conn) Close() error {
	tc.tracker.mu.Lock()
	tc.tracker.countOutLocked(tc)
	tc.tracker.mu.Unlock()
	err := tc.Conn.Close()
	tc.closed.Do(tc.tracker.live.Done)
	return err
}

// CloseWrite half-closes the connection, as net/http does before it
// hangs up on a request it refused.
func (tc *Conn) CloseWrite() error {
	if cw, ok := tc.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Write writes p, turning the plain-text error answers net/http writes
// itself (malformed requests, headers too large) into the JSON error
// shape. Those are written only when no handler runs on the connection.
// Once a crash has begun it writes nothing (connTracker.crash).
//
// A write on an idle connection is the end of its answer, which net/http
// flushes after its handler has returned (leave): the connection's
// idleness is counted from then, so that one answered within stallAfter
// is never dropped as idle.
func (tc *Conn) Write(p []byte) (int, error) {
	if tc.tracker.crashed.Load() {
		// A killed process writes nothing more.
		return 0, net.ErrClosed
	}
	if tc.isIdle.Load() {
		defer func() {
			tc.tracker.mu.Lock()
			if tc.phase == idle {
				tc.moveLocked(idle)
			}
			tc.tracker.mu.Unlock()
		}()
	}
	if bytes.HasPrefix(p, []byte("HTTP/1.1 ")) && tc.handling.Load() == 0 {
		if j, ok := jsonHTTPError(p); ok {
			if _, err := tc.Conn.Write(j); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	return tc.Conn.Write(p)
}

// SetClock sets the clock stalls are judged by: a test's own.
func (t *ConnTracker) SetClock(now func() time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.now = now
}
