package store

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// FlushInterval is how often the ack-before-durable mutant writes its queue
// to the store. A variable only so that tests can decide whether a flush
// falls between an acknowledgement and a crash.
var FlushInterval = 500 * time.Millisecond

// writeBehind is the store writer of the ack-before-durable mutant: a
// commit is queued and acknowledged at once, and a background goroutine
// writes the queue every flushInterval and on a graceful close. A crash
// drops the queue: the acknowledged turns in it are lost (T7). Loads see the
// queue on top of the store, so that nothing but a crash shows the bug.
type writeBehind struct {
	store *Store
	log   *slog.Logger
	every time.Duration

	// mu is held across a flush and across a load, so that a load sees a
	// queued write either in the queue or in the store, never in neither.
	mu      sync.Mutex
	queue   []pendingWrite
	stopped bool // closed or crashed: nothing is queued any more

	stop chan struct{}
	done chan struct{}
}

// pendingWrite is a commit not yet in the store: its messages, and the
// hidden marks it set on earlier ones.
type pendingWrite struct {
	k  Key
	ch change
}

func newWriteBehind(st *Store, log *slog.Logger) *writeBehind {
	w := &writeBehind{store: st, log: log, every: FlushInterval, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *writeBehind) run() {
	defer close(w.done)
	tick := time.NewTicker(w.every)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
			w.mu.Lock()
			w.flush()
			w.mu.Unlock()
		}
	}
}

// enqueue queues the commit ch. Once stopped it drops it, as a dead
// process would.
func (w *writeBehind) enqueue(k Key, ch change) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.queue = append(w.queue, pendingWrite{k: k, ch: ch})
}

// flush writes the queue in order and empties it. The caller holds w.mu.
// A write that fails is logged and lost: it was acknowledged long ago.
func (w *writeBehind) flush() {
	for _, p := range w.queue {
		if err := w.store.appendMessages(context.Background(), p.k, p.ch); err != nil {
			w.log.Error("write-behind flush", "conversation", p.k.ID, "err", err)
		}
	}
	w.queue = nil
}

// load returns conversation k as committed: the store, with the queued
// writes for k on top.
func (w *writeBehind) load(ctx context.Context, k Key) (*Conversation, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c, err := w.store.load(ctx, k)
	if err != nil {
		return nil, err
	}
	for _, p := range w.queue {
		if p.k != k || p.ch.seq > len(c.Messages) {
			continue
		}
		c.Messages = c.Messages[:p.ch.seq:p.ch.seq]
		for _, m := range p.ch.msgs {
			c.Messages = append(c.Messages, m.copy())
		}
		for _, seq := range p.ch.hide {
			if seq < len(c.Messages) {
				c.Messages[seq].Hidden = true
			}
		}
		if p.ch.seq == 0 && p.ch.source != "" {
			c.Source = p.ch.source
		}
	}
	return c, nil
}

// Close stops the writer and flushes the queue: a graceful stop loses
// nothing.
func (w *writeBehind) Close() {
	w.end(true)
}

// Crash stops the writer and drops the queue unwritten.
func (w *writeBehind) Crash() {
	w.end(false)
}

func (w *writeBehind) end(flush bool) {
	w.mu.Lock()
	already := w.stopped
	w.stopped = true
	if !already {
		close(w.stop)
	}
	if flush {
		w.flush()
	}
	w.queue = nil
	w.mu.Unlock()
	<-w.done
}
