package sut

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/turncheck/turncheck/sut/internal/admission"

	"github.com/turncheck/turncheck/sut/internal/config"
)

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
	gauge *admission.Gauge
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
// Work in the store on (withConn) until unlock; nil otherwise.
func (l *convLocks) lock(ctx context.Context, k convKey, policy config.Concurrency, maxWait time.Duration) (conn *sql.Conn, unlock func(), err error) {
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
func (l *convLocks) lockLocal(ctx context.Context, k convKey, policy config.Concurrency, maxWait time.Duration) (unlock func(), err error) {
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
	if policy == config.Reject {
		l.mu.Unlock()
		return nil, errConversationBusy
	}
	w := &convWaiter{granted: make(chan struct{})}
	cl.queue = append(cl.queue, w)
	l.gauge.Add(0, 1)
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
	l.gauge.Add(0, -1)
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
	l.gauge.Add(0, -1)
	close(next.granted)
}
