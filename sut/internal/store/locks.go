package store

import (
	"context"
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
	// ErrConversationBusy: the lock was held and the policy is Reject.
	ErrConversationBusy = errors.New("a turn on this conversation is already in flight")
	// ErrWaitTimedOut: the request waited its turn for RequestTimeout.
	ErrWaitTimedOut = errors.New("waited too long for the conversation's turn")
	// ErrSessionBusy: under the refuse-concurrent-new mutant, the lock of
	// a conversation with nothing committed yet was held.
	ErrSessionBusy = errors.New("session is busy")
)

// Locks serializes turns per conversation. Waiters queue explicitly and
// the lock is handed to the first of them, so turns run in the order their
// requests started waiting: neither the scheduler nor a request arriving
// just as the lock is released can jump the queue.
//
// Where other processes share the store (PostgreSQL), a turn also takes
// the conversation's lock there (shared), once it has the one here: the
// lock here keeps a process's own waiters off the database, the shared
// one alone makes turns on one conversation run one after another.
type Locks struct {
	// Gauge counts the requests waiting for a lock.
	Gauge *admission.Gauge
	// Shared is the store's cross-process lock; nil for a store one
	// process alone opens.
	Shared *Leases

	mu    sync.Mutex
	locks map[Key]*convLock
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

// Lock takes k's lock, here and then, if the store is shared, its lease
// in the store. When it is held, it fails at once with errConversationBusy under
// Reject; under Serialize it waits until it gets both, ctx ends (ctx's
// error) or maxWait passes (errWaitTimedOut), maxWait bounding both waits
// together. The wait is timed by the clock, not by the server's
// Deadlines: those decide when a model call times out, and a harness that
// holds them must not thereby hold every waiter forever. The unlock it
// returns may be called more than once. With a shared store, lease is
// the conversation's lease, which the turn loads (WithLease) and commits
// under until unlock, and which holds a connection until its Rest; nil
// otherwise.
func (l *Locks) Lock(ctx context.Context, k Key, policy config.Concurrency, maxWait time.Duration) (lease *Lease, unlock func(), err error) {
	deadline := time.Now().Add(maxWait)
	local, err := l.LockLocal(ctx, k, policy, maxWait)
	if err != nil || l.Shared == nil {
		return nil, local, err
	}
	lease, shared, err := l.Shared.Lock(ctx, k, policy, time.Until(deadline), l.Gauge)
	if err != nil {
		local()
		return nil, nil, err
	}
	var once sync.Once
	return lease, func() { once.Do(func() { shared(); local() }) }, nil
}

// LockLocal takes k's lock in this process: waiting in line under
// Serialize, first come first served, until the lock is handed over.
func (l *Locks) LockLocal(ctx context.Context, k Key, policy config.Concurrency, maxWait time.Duration) (unlock func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[Key]*convLock{}
	}
	cl, held := l.locks[k]
	if !held {
		l.locks[k] = &convLock{}
		l.mu.Unlock()
		return l.unlocker(k), nil
	}
	if policy == config.Reject {
		l.mu.Unlock()
		return nil, ErrConversationBusy
	}
	w := &convWaiter{granted: make(chan struct{})}
	cl.queue = append(cl.queue, w)
	l.Gauge.Add(0, 1)
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
		err = ErrWaitTimedOut
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
	l.Gauge.Add(0, -1)
	return nil, err
}

// unlocker returns a release of k's lock that is safe to call more than
// once, so that a turn can release the lock as soon as it is decided and
// still keep a deferred release for every other way out.
func (l *Locks) unlocker(k Key) func() {
	var once sync.Once
	return func() { once.Do(func() { l.unlock(k) }) }
}

func (l *Locks) unlock(k Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.handOver(k)
}

// handOver releases k's lock to the first waiter, or frees it if none
// waits. The caller holds l.mu. The waiter stops counting as waiting here,
// when it gets the lock, not when its goroutine next runs.
func (l *Locks) handOver(k Key) {
	cl := l.locks[k]
	if len(cl.queue) == 0 {
		delete(l.locks, k)
		return
	}
	next := cl.queue[0]
	cl.queue = slices.Delete(cl.queue, 0, 1)
	l.Gauge.Add(0, -1)
	close(next.granted)
}
