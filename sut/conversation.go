package sut

import (
	"context"
	"log/slog"
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
	// source is the key of the agent source the conversation was started
	// under; "" when it is bound to none (no agents were loaded).
	source string
}

// clone returns a copy that shares no mutable state with c. Messages hold
// only strings, so copying the slice copies them whole.
func (c *conversation) clone() *conversation {
	return &conversation{messages: append([]openai.Message(nil), c.messages...), source: c.source}
}

// conversations is the bounded cache of committed conversations over the
// durable store. Eviction loses nothing: a miss reloads from the store.
type conversations struct {
	store *store
	cache *lru.Cache[convKey, *conversation]
	// behind, set only under the ack-before-durable mutant, queues the
	// store writes of commits instead of making them before the ack.
	behind *writeBehind
	// overwriting orders overwrite commits, so that the commit that wrote
	// the store last is also the one left in the cache.
	overwriting sync.Mutex
}

// newConversations returns the cache over st. Two mutants change it:
// lost-on-evict deletes what it evicts from the store, ack-before-durable
// writes behind.
func newConversations(st *store, size int, m Mutant, log *slog.Logger) (*conversations, error) {
	var onEvict func(convKey, *conversation)
	if m == LostOnEvict {
		onEvict = func(k convKey, _ *conversation) {
			// The bug: eviction is taken for the end of the conversation,
			// though the server claims durable storage.
			if err := st.forget(k); err != nil {
				log.Error("forget evicted conversation", "conversation", k.id, "err", err)
			}
		}
	}
	c, err := lru.NewWithEvict(size, onEvict)
	if err != nil {
		return nil, err
	}
	cs := &conversations{store: st, cache: c}
	if m == AckBeforeDurable {
		cs.behind = newWriteBehind(st, log)
	}
	return cs, nil
}

// close writes what is not durable yet (only the ack-before-durable mutant
// has any), for a graceful stop.
func (cs *conversations) close() {
	if cs.behind != nil {
		cs.behind.close()
	}
}

// crash drops what is not durable yet, as a killed process does.
func (cs *conversations) crash() {
	if cs.behind != nil {
		cs.behind.crash()
	}
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
	if cs.behind != nil {
		return cs.behind.load(ctx, k)
	}
	return cs.store.load(ctx, k)
}

// commit makes next the committed state of k: the messages after the
// first committedLen go to the store durably, then next replaces the cached
// conversation. Under the lock nothing else can have been committed since
// committedLen, and a clash fails the commit; with overwrite (the mutants
// that run turns without the lock) the messages replace whatever another
// turn committed at the same places, and the later commit wins.
func (cs *conversations) commit(k convKey, committedLen int, next *conversation, overwrite bool) error {
	msgs := next.messages[committedLen:]
	if !overwrite {
		if cs.behind != nil {
			// The bug: acknowledged before it is durable.
			cs.behind.enqueue(k, committedLen, msgs, next.source)
			cs.cache.Add(k, next)
			return nil
		}
		if err := cs.store.appendMessages(k, committedLen, msgs, next.source); err != nil {
			return err
		}
		cs.cache.Add(k, next)
		return nil
	}
	cs.overwriting.Lock()
	defer cs.overwriting.Unlock()
	if err := cs.store.overwriteMessages(k, committedLen, msgs, next.source); err != nil {
		return err
	}
	cs.cache.Add(k, next)
	return nil
}
