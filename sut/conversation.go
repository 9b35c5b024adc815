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
	// overwriting orders overwrite commits, so that the commit that wrote
	// the store last is also the one left in the cache.
	overwriting sync.Mutex
}

func newConversations(st *store, size int) (*conversations, error) {
	c, err := lru.New[convKey, *conversation](size)
	if err != nil {
		return nil, err
	}
	return &conversations{store: st, cache: c}, nil
}

// get returns the committed conversation k, empty if it was never
// committed. The caller holds k's lock, so what it loads is current and may
// go into the cache.
func (cs *conversations) get(ctx context.Context, k convKey) (*conversation, error) {
	c, err := cs.peek(ctx, k)
	if err == nil && len(c.messages) > 0 {
		cs.cache.Add(k, c)
	}
	return c, err
}

// peek returns the committed conversation k, as get does, without k's lock
// (the mutants that skip it). It never fills the cache: what it loaded may
// be stale by the time it would land there, over a newer commit.
func (cs *conversations) peek(ctx context.Context, k convKey) (*conversation, error) {
	if c, ok := cs.cache.Get(k); ok {
		return c, nil
	}
	msgs, err := cs.store.load(ctx, k)
	if err != nil {
		return nil, err
	}
	return &conversation{messages: msgs}, nil
}

// commit makes next the committed state of k: the messages after the
// first committedLen go to the store durably, then next replaces the cached
// conversation. Under the lock nothing else can have been committed since
// committedLen, and a clash fails the commit; with overwrite (the mutants
// that run turns without the lock) the messages replace whatever another
// turn committed at the same places, and the later commit wins.
func (cs *conversations) commit(k convKey, committedLen int, next *conversation, overwrite bool) error {
	if !overwrite {
		if err := cs.store.appendMessages(k, committedLen, next.messages[committedLen:]); err != nil {
			return err
		}
		cs.cache.Add(k, next)
		return nil
	}
	cs.overwriting.Lock()
	defer cs.overwriting.Unlock()
	if err := cs.store.overwriteMessages(k, committedLen, next.messages[committedLen:]); err != nil {
		return err
	}
	cs.cache.Add(k, next)
	return nil
}
