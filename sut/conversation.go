package sut

import (
	"context"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/turncheck/turncheck/internal/openai"
)

// convKey names a conversation: its id, scoped by the API key it was
// created with ("" when the server has no keys).
type convKey struct {
	scope string
	id    string
}

// conversation is a committed history. The server never runs a turn on a
// cached conversation: it runs it on a clone and swaps the clone in only
// when the turn is committed (T1).
type conversation struct {
	messages []openai.Message
}

// clone returns a copy that shares no mutable state with c. Messages hold
// only strings, so copying the slice copies them whole.
func (c *conversation) clone() *conversation {
	return &conversation{messages: append([]openai.Message(nil), c.messages...)}
}

// conversations is the bounded cache of committed conversations over the
// durable store. Eviction loses nothing: a miss reloads from the store.
type conversations struct {
	store *store
	cache *lru.Cache[convKey, *conversation]
}

func newConversations(st *store, size int) (*conversations, error) {
	c, err := lru.New[convKey, *conversation](size)
	if err != nil {
		return nil, err
	}
	return &conversations{store: st, cache: c}, nil
}

// get returns the committed conversation k, empty if it was never
// committed. The caller holds k's lock.
func (cs *conversations) get(ctx context.Context, k convKey) (*conversation, error) {
	if c, ok := cs.cache.Get(k); ok {
		return c, nil
	}
	msgs, err := cs.store.load(ctx, k)
	if err != nil {
		return nil, err
	}
	c := &conversation{messages: msgs}
	if len(msgs) > 0 {
		cs.cache.Add(k, c)
	}
	return c, nil
}

// commit makes next the committed state of k: the messages after the
// first committedLen go to the store durably, then next replaces the cached
// conversation.
func (cs *conversations) commit(k convKey, committedLen int, next *conversation) error {
	if err := cs.store.appendMessages(k, committedLen, next.messages[committedLen:]); err != nil {
		return err
	}
	cs.cache.Add(k, next)
	return nil
}

// convLocks serializes turns per conversation. A waiter gives up when its
// request's context ends, so a client that goes away stops waiting.
type convLocks struct {
	mu    sync.Mutex
	locks map[convKey]*convLock
}

type convLock struct {
	held chan struct{} // a token in the channel means the lock is taken
	refs int           // holders and waiters; the entry goes at zero
}

// lock takes k's lock, or returns ctx's error if ctx ends first.
func (l *convLocks) lock(ctx context.Context, k convKey) (unlock func(), err error) {
	l.mu.Lock()
	if l.locks == nil {
		l.locks = map[convKey]*convLock{}
	}
	cl := l.locks[k]
	if cl == nil {
		cl = &convLock{held: make(chan struct{}, 1)}
		l.locks[k] = cl
	}
	cl.refs++
	l.mu.Unlock()

	release := func() {
		l.mu.Lock()
		cl.refs--
		if cl.refs == 0 {
			delete(l.locks, k)
		}
		l.mu.Unlock()
	}
	select {
	case cl.held <- struct{}{}:
		unlock = func() { <-cl.held; release() }
		if err := ctx.Err(); err != nil {
			// Both were ready and select chose the lock: the waiter is
			// gone all the same.
			unlock()
			return nil, err
		}
		return unlock, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}
