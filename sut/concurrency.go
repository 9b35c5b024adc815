package sut

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Concurrency is what the server does with a request for a conversation
// whose turn is already running.
type Concurrency string

// The concurrency policies PROTOCOL.md allows a server to declare (T4).
const (
	// Serialize makes the request wait its turn, first come first served,
	// for at most RequestTimeout (then 503 conversation_busy).
	Serialize Concurrency = "serialize"
	// Reject answers the request 409 conflict at once, before any model
	// call; nothing changes.
	Reject Concurrency = "reject"
	// Supersede, for an ACP prompt, cancels the session's running prompt
	// (answered stopReason cancelled, its turn ended as one whose client
	// sent session/cancel: the interruption policy decides what stays),
	// then runs the new one once it is done, as docker-agent's and
	// openclaw's agents do. Other protocols serialize.
	Supersede Concurrency = "supersede"
)

// ParseConcurrency returns the policy named s ("" for Serialize), or an
// error naming the valid values.
func ParseConcurrency(s string) (Concurrency, error) {
	switch c := Concurrency(s); c {
	case "":
		return Serialize, nil
	case Serialize, Reject, Supersede:
		return c, nil
	}
	return "", fmt.Errorf("unknown concurrency policy %q (want %s, %s or %s)", s, Serialize, Reject, Supersede)
}

// Gauge counts the requests a server is working on and, of those, the ones
// waiting for their conversation's turn, and signals every change. A test
// harness reads it to know, without timers, when concurrent requests have
// all come to rest: each is either queued on its conversation or gone. It
// is safe for concurrent use; the zero value is ready.
type Gauge struct {
	mu      sync.Mutex
	working int
	waiting int
	// changed is closed at the next change; nil until someone reads, so
	// that a gauge nobody watches costs no allocation per change.
	changed chan struct{}
	// done are the tags (RequestTagHeader) of the latest requests the
	// server is done with (DoneWith), oldest first in doneOrder, at most
	// maxDone.
	done      map[string]bool
	doneOrder []string
}

// RequestTagHeader is the header a harness tags a request with, so that
// the Gauge can tell it which requests the server is done with
// (DoneWith).
const RequestTagHeader = "Turncheck-Request"

// maxDone bounds how many tags of requests it is done with a Gauge
// remembers.
const maxDone = 1024

// doneWhen marks tag as done with when ctx ends: the context a turn
// runs on, which ends when the turn sees its client go away, or when the
// turn is over. "" marks nothing.
func (g *Gauge) doneWhen(ctx context.Context, tag string) {
	if g == nil || tag == "" {
		return
	}
	context.AfterFunc(ctx, func() { g.markDone(tag) })
}

// markDone marks tag as done with. "" marks nothing.
func (g *Gauge) markDone(tag string) {
	if g == nil || tag == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done[tag] {
		return
	}
	if g.done == nil {
		g.done = map[string]bool{}
	}
	if len(g.doneOrder) == maxDone {
		delete(g.done, g.doneOrder[0])
		g.doneOrder = g.doneOrder[1:]
	}
	g.done[tag] = true
	g.doneOrder = append(g.doneOrder, tag)
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}

// DoneWith reports whether the server is done with the request tagged
// tag: its turn saw its client go away (the turn's context ended), or its
// handler returned. A server that stops starts nothing more for it from
// then on.
func (g *Gauge) DoneWith(tag string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.done[tag]
}

// Read returns how many requests the server is working on, how many of
// them wait for their conversation's turn, and a channel that is closed at
// the next change of either.
func (g *Gauge) Read() (working, waiting int, changed <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	return g.working, g.waiting, g.changed
}

// add moves the counts by the deltas and wakes every reader. A nil gauge
// counts nothing.
func (g *Gauge) add(working, waiting int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.working += working
	g.waiting += waiting
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}

// Why a request did not get its conversation's lock, besides its context
// ending.
var (
	// errConversationBusy: the lock was held and the policy is Reject.
	errConversationBusy = errors.New("a turn on this conversation is already in flight")
	// errWaitTimedOut: the request waited its turn for RequestTimeout.
	errWaitTimedOut = errors.New("waited too long for the conversation's turn")
	// errSessionBusy: under the refuse-concurrent-new mutant, the lock of
	// a conversation with nothing committed yet was held.
	errSessionBusy = errors.New("session is busy")
)

// convLocks serializes turns per conversation. Waiters queue explicitly and
// the lock is handed to the first of them, so turns run in the order their
// requests started waiting: neither the scheduler nor a request arriving
// just as the lock is released can jump the queue.
//
// Where other processes share the store (PostgreSQL), a turn also takes
// the conversation's lock there (shared), once it has the one here: the
// lock here keeps a process's own waiters off the database, the shared
// one alone makes turns on one conversation run one after another.
type convLocks struct {
	gauge *Gauge
	// shared is the store's cross-process lock; nil for a store one
	// process alone opens.
	shared *advisoryLocks

	mu    sync.Mutex
	locks map[convKey]*convLock
}

// convLock is one conversation's lock; the entry exists while the lock is
// held and goes when it is released to nobody.
type convLock struct {
	queue []*convWaiter // in the order they started waiting
}

// convWaiter is a request queued for a conversation's lock.
type convWaiter struct {
	// granted is closed when the lock is handed to this waiter.
	granted chan struct{}
}

// lock takes k's lock, here and then, if the store is shared, in the
// store. When it is held, it fails at once with errConversationBusy under
// Reject; under Serialize it waits until it gets both, ctx ends (ctx's
// error) or maxWait passes (errWaitTimedOut), maxWait bounding both waits
// together. The wait is timed by the clock, not by the server's
// Deadlines: those decide when a model call times out, and a harness that
// holds them must not thereby hold every waiter forever. The unlock it
// returns may be called more than once. With a shared store, conn is the
// connection the store's lock is held on, which the turn does all its
// work in the store on (withConn) until unlock; nil otherwise.
func (l *convLocks) lock(ctx context.Context, k convKey, policy Concurrency, maxWait time.Duration) (conn *sql.Conn, unlock func(), err error) {
	deadline := time.Now().Add(maxWait)
	local, err := l.lockLocal(ctx, k, policy, maxWait)
	if err != nil || l.shared == nil {
		return nil, local, err
	}
	conn, shared, err := l.shared.lock(ctx, k, policy, time.Until(deadline), l.gauge)
	if err != nil {
		local()
		return nil, nil, err
	}
	var once sync.Once
	return conn, func() { once.Do(func() { shared(); local() }) }, nil
}

// lockLocal takes k's lock in this process: waiting in line under
// Serialize, first come first served, until the lock is handed over.
func (l *convLocks) lockLocal(ctx context.Context, k convKey, policy Concurrency, maxWait time.Duration) (unlock func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[convKey]*convLock{}
	}
	cl, held := l.locks[k]
	if !held {
		l.locks[k] = &convLock{}
		l.mu.Unlock()
		return l.unlocker(k), nil
	}
	if policy == Reject {
		l.mu.Unlock()
		return nil, errConversationBusy
	}
	w := &convWaiter{granted: make(chan struct{})}
	cl.queue = append(cl.queue, w)
	l.gauge.add(0, 1)
	l.mu.Unlock()

	timer := time.NewTimer(maxWait)
	defer timer.Stop()
	select {
	case <-w.granted:
		if err := ctx.Err(); err != nil {
			// The lock came as the client left: pass it on.
			l.unlock(k)
			return nil, err
		}
		return l.unlocker(k), nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = errWaitTimedOut
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-w.granted:
		// Handed over while giving up: the lock is ours, so pass it on.
		l.handOver(k)
		return nil, err
	default:
	}
	cl.queue = slices.DeleteFunc(cl.queue, func(q *convWaiter) bool { return q == w })
	l.gauge.add(0, -1)
	return nil, err
}

// unlocker returns a release of k's lock that is safe to call more than
// once, so that a turn can release the lock as soon as it is decided and
// still keep a deferred release for every other way out.
func (l *convLocks) unlocker(k convKey) func() {
	var once sync.Once
	return func() { once.Do(func() { l.unlock(k) }) }
}

func (l *convLocks) unlock(k convKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.handOver(k)
}

// handOver releases k's lock to the first waiter, or frees it if none
// waits. The caller holds l.mu. The waiter stops counting as waiting here,
// when it gets the lock, not when its goroutine next runs.
func (l *convLocks) handOver(k convKey) {
	cl := l.locks[k]
	if len(cl.queue) == 0 {
		delete(l.locks, k)
		return
	}
	next := cl.queue[0]
	cl.queue = slices.Delete(cl.queue, 0, 1)
	l.gauge.add(0, -1)
	close(next.granted)
}
