package store

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
)

// Key names a conversation: its id, scoped by the API key it was
// created with ("" when the server has no keys).
type Key struct {
	// Scope is the scope of the key the conversation was created with.
	Scope string
	// ID is the conversation's id, in its protocol's namespace.
	ID string
}

// Message is one message of a conversation, with what the server keeps
// about it besides its wire form. Conversations hold pointers to messages,
// so that compaction can mark one in place: a working copy must therefore
// copy every message it may mark (clone), or a failed turn's marks would
// show in the committed conversation (T11).
type Message struct {
	openai.Message
	// Hidden marks a message that compaction took out of what the model
	// is sent (compaction.go). It stays in the conversation and the store.
	Hidden bool
}

// copy returns a message that shares nothing mutable with m.
func (m *Message) copy() *Message {
	c := *m
	c.ToolCalls = slices.Clone(m.ToolCalls)
	return &c
}

// ToolPair reports whether m belongs to a tool round: an assistant message
// that asks for tool calls, or a tool result.
func (m *Message) ToolPair() bool {
	return m.Role == openai.RoleTool || (m.Role == openai.RoleAssistant && len(m.ToolCalls) > 0)
}

// Size is what m counts for against MaxHistoryBytes: its text, and the
// arguments of the tool calls it asks for.
func (m *Message) Size() int64 {
	n := int64(len(m.Content))
	for _, c := range m.ToolCalls {
		n += int64(len(c.Function.Arguments))
	}
	return n
}

// Wrap returns msgs as conversation messages, none hidden.
func Wrap(msgs []openai.Message) []*Message {
	out := make([]*Message, len(msgs))
	for i, m := range msgs {
		out[i] = (&Message{Message: m}).copy()
	}
	return out
}

// Conversation is a committed history. The server never runs a turn on a
// cached conversation: it runs it on a clone and swaps the clone in only
// when the turn is committed (T1).
type Conversation struct {
	// Messages are the committed messages, oldest first.
	Messages []*Message
	// Source is the key of the agent source the conversation was started
	// under; "" when it is bound to none (no agents were loaded).
	Source string
	// epoch is the epoch of the lease (PostgreSQL) under which this copy
	// was last known to be the store's: loaded or committed. 0: none. A
	// lease taken next at epoch+1 shows that no other process held the
	// conversation since, so nobody committed to it (fresh).
	epoch int64
}

// Clone returns a copy that shares no mutable state with c: new message
// structs, tool calls copied, so that marking a message of the copy leaves
// c as it was.
func (c *Conversation) Clone() *Conversation {
	msgs := make([]*Message, len(c.Messages))
	for i, m := range c.Messages {
		msgs[i] = m.copy()
	}
	return &Conversation{Messages: msgs, Source: c.Source, epoch: c.epoch}
}

// ShallowClone copies the slice of c's messages and not the messages: the
// copy can grow on its own, but a mark on one of its messages is a mark on
// c's. Only the shallow-clone mutant runs turns on it.
func (c *Conversation) ShallowClone() *Conversation {
	return &Conversation{Messages: slices.Clone(c.Messages), Source: c.Source, epoch: c.epoch}
}

// Visible returns the messages the model is sent: all but the hidden.
func (c *Conversation) Visible() []openai.Message {
	out := make([]openai.Message, 0, len(c.Messages))
	for _, m := range c.Messages {
		if !m.Hidden {
			out = append(out, m.Message)
		}
	}
	return out
}

// Conversations is the bounded cache of committed conversations over the
// durable store. Eviction loses nothing: a miss reloads from the store.
type Conversations struct {
	store *Store
	// Cache holds the conversations in memory, within the budget.
	Cache *convCache
	// behind, set only under the ack-before-durable mutant, queues the
	// store writes of commits instead of making them before the ack.
	behind *writeBehind
	// overwriting orders overwrite commits, so that the commit that wrote
	// the store last is also the one left in the cache.
	overwriting sync.Mutex
	// cacheCopies, set only under the branch-mutates-base mutant, caches
	// a copy of what is committed: a turn chained from a response runs
	// on that response's cached history itself, which must not become
	// the new response's too (one history under two ids, written under
	// two locks at once).
	cacheCopies bool
	// verify checks a cached conversation against the store before it
	// is served: set where other processes commit to the same store
	// (PostgreSQL), whose commits this cache never sees.
	verify bool
	// dropStoreErrors, set only under the store-error-acked mutant,
	// acknowledges a commit whose store write failed.
	dropStoreErrors bool
}

// NewConversations returns the cache over st, of at most size
// conversations and what budget leaves it. Four mutants change it:
// lost-on-evict deletes what it evicts from the store, ack-before-durable
// writes behind, branch-mutates-base caches copies, store-error-acked
// drops the store's errors.
func NewConversations(st *Store, size int, budget *admission.Budget, m config.Mutant, log *slog.Logger) (*Conversations, error) {
	var onEvict func(Key, *Conversation)
	if m == config.LostOnEvict {
		onEvict = func(k Key, _ *Conversation) {
			// The bug: eviction is taken for the end of the conversation,
			// though the server claims durable storage.
			if err := st.forget(k); err != nil {
				log.Error("forget evicted conversation", "conversation", k.ID, "err", err)
			}
		}
	}
	c, err := newConvCache(size, budget, onEvict)
	if err != nil {
		return nil, err
	}
	cs := &Conversations{store: st, Cache: c, cacheCopies: m == config.BranchMutatesBase, verify: st.Shared != nil,
		dropStoreErrors: m == config.StoreErrorAcked}
	if m == config.AckBeforeDurable {
		cs.behind = newWriteBehind(st, log)
	}
	return cs, nil
}

// Close writes what is not durable yet (only the ack-before-durable mutant
// has any), for a graceful stop.
func (cs *Conversations) Close() {
	if cs.behind != nil {
		cs.behind.Close()
	}
}

// Crash drops what is not durable yet, as a killed process does.
func (cs *Conversations) Crash() {
	if cs.behind != nil {
		cs.behind.Crash()
	}
}

// Get returns the committed conversation k, empty if it was never
// committed. The caller holds k's lock, so what it loads is current and may
// go into the cache; a cached conversation that another process may have
// committed to since is loaded again.
func (cs *Conversations) Get(ctx context.Context, k Key) (*Conversation, error) {
	cached, ok := cs.Cache.Get(k)
	if ok && cs.fresh(ctx, cached) {
		cached.epoch = leaseEpoch(ctx)
		return cached, nil
	}
	c, err := cs.load(ctx, k)
	if err == nil {
		c.epoch = leaseEpoch(ctx)
	}
	// A stale entry is replaced, not removed: a removal counts as an
	// eviction (lost-on-evict would delete the conversation).
	if err == nil && (ok || len(c.Messages) > 0) {
		cs.Cache.Add(k, c)
	}
	return c, err
}

// GetUnchecked is get without the check of a cached conversation against
// the store: only the replica-stale-cache mutant serves its cache so.
func (cs *Conversations) GetUnchecked(ctx context.Context, k Key) (*Conversation, error) {
	if c, ok := cs.Cache.Get(k); ok {
		return c, nil
	}
	return cs.Get(ctx, k)
}

// fresh reports whether the cached c is surely still its conversation as
// committed: always where no other process commits to the store (not
// verify); else only under the lease taken right after the one c was
// loaded or committed under, when nobody held the conversation in between
// and so nobody committed to it. Otherwise it is loaded again, in one
// statement: asking the store whether it changed first would cost a round
// trip more whenever it did, which is every turn where replicas take a
// conversation's turns in turn.
func (cs *Conversations) fresh(ctx context.Context, c *Conversation) bool {
	if !cs.verify {
		return true
	}
	e := leaseEpoch(ctx)
	return e != 0 && c.epoch != 0 && e == c.epoch+1
}

// Peek returns the committed conversation k, as get does, without k's lock
// (the mutants that skip it). It never fills the cache: what it loaded may
// be stale by the time it would land there, over a newer commit.
func (cs *Conversations) Peek(ctx context.Context, k Key) (*Conversation, error) {
	if c, ok := cs.Cache.Get(k); ok {
		return c, nil
	}
	return cs.load(ctx, k)
}

// load reads conversation k as committed, past the cache.
func (cs *Conversations) load(ctx context.Context, k Key) (*Conversation, error) {
	if cs.behind != nil {
		return cs.behind.load(ctx, k)
	}
	return cs.store.load(ctx, k)
}

// Commit makes next the committed state of k: the messages after the
// first committedLen go to the store durably, with the hidden marks the
// turn set on earlier messages (hid, their indexes), then next (a copy of
// it under branch-mutates-base: cacheCopies) replaces the cached
// conversation. Under the lock nothing else can have been committed
// since committedLen, and a clash fails the commit; with overwrite (the
// mutants that run turns without the lock) the messages replace whatever
// another turn committed at the same places, and the later commit wins.
// The store writes on the connection ctx carries (withConn), if any; ctx
// does not end the commit.
func (cs *Conversations) Commit(ctx context.Context, k Key, committedLen int, hid []int, next *Conversation, overwrite bool) error {
	if cs.cacheCopies {
		next = next.Clone()
	}
	// Known to be the store's under no lease until a commit under one
	// lands (below).
	next.epoch = 0
	ch := change{seq: committedLen, msgs: snapshot(next.Messages[committedLen:]), hide: slices.Clone(hid), source: next.Source}
	if !overwrite {
		if cs.behind != nil {
			// The bug: acknowledged before it is durable.
			cs.behind.enqueue(k, ch)
			cs.Cache.Add(k, next)
			return nil
		}
		err := cs.store.appendMessages(ctx, k, ch)
		if err != nil && !cs.dropStoreErrors {
			return err
		}
		// Committed under the lease's epoch, which the commit gave back:
		// the store's as of it. A copy whose commit failed is no one's.
		if err == nil {
			next.epoch = leaseEpoch(ctx)
		}
		cs.Cache.Add(k, next)
		return nil
	}
	cs.overwriting.Lock()
	defer cs.overwriting.Unlock()
	if err := cs.store.overwriteMessages(ctx, k, ch); err != nil {
		return err
	}
	cs.Cache.Add(k, next)
	return nil
}

// change is one commit's change to a stored conversation: messages from
// seq on, hidden marks set on earlier ones, and the source key (written
// with the first messages only).
type change struct {
	seq    int
	msgs   []Message // values: what they were at the commit
	hide   []int     // indexes of earlier messages now hidden
	source string
}

// snapshot copies msgs as values, so that a change queued behind (the
// ack-before-durable mutant) is what was committed, whatever happens to
// the messages after.
func snapshot(msgs []*Message) []Message {
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		out[i] = *m.copy()
	}
	return out
}

// convCache is the LRU cache of committed conversations, charged to the
// server's memory budget: each conversation by what it costs
// (conversationCost), given back when it is evicted or replaced. It
// drops its least recently used conversations when it holds more than
// its size, when it grows past the budget, and when a request needs room
// (memBudget.evict). It is safe for concurrent use.
type convCache struct {
	budget *admission.Budget
	mu     sync.Mutex
	lru    *simplelru.LRU[Key, cached]
}

// cached is a cache entry: the conversation and what it was charged.
type cached struct {
	c    *Conversation
	cost int64
}

// newConvCache returns a cache of at most size conversations, charged to
// budget; onEvict, if not nil, hears of each conversation evicted (not
// of one replaced).
func newConvCache(size int, budget *admission.Budget, onEvict func(Key, *Conversation)) (*convCache, error) {
	cc := &convCache{budget: budget}
	lru, err := simplelru.NewLRU(size, func(k Key, e cached) {
		budget.Release(e.cost)
		if onEvict != nil {
			onEvict(k, e.c)
		}
	})
	if err != nil {
		return nil, err
	}
	cc.lru = lru
	budget.Evict = cc.evictOldest
	return cc, nil
}

// Get returns the cached conversation k, marking it recently used.
func (cc *convCache) Get(k Key) (*Conversation, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	e, ok := cc.lru.Get(k)
	return e.c, ok
}

// Add caches c as k, charging the budget what it costs, and drops the
// least recently used conversations (c itself last) while the budget is
// exceeded: what a turn committed is in the store whatever the cache
// keeps.
func (cc *convCache) Add(k Key, c *Conversation) {
	cost := conversationCost(c)
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if old, ok := cc.lru.Peek(k); ok {
		// Replaced, not evicted: the old charge is given back here.
		cc.budget.Release(old.cost)
	}
	cc.budget.Charge(cost)
	cc.lru.Add(k, cached{c: c, cost: cost})
	for cc.budget.Over() && cc.lru.Len() > 0 {
		cc.lru.RemoveOldest()
	}
}

// evictOldest drops the least recently used conversation, and reports
// false if there was none.
func (cc *convCache) evictOldest() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	_, _, ok := cc.lru.RemoveOldest()
	return ok
}
