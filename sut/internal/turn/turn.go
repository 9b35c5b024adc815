// Package turn runs a turn, whatever protocol it came through: its
// conversation's lock, the tool loop and the model client, the agent it is
// bound to, compaction, the interruption policy, and its commit. An
// adapter hands the Engine a Turn, a context and a Client, and a
// responder that says the answer in its protocol.
package turn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/store"
)

// systemPrompt is prepended to every model request of a turn bound to no
// agent (stateless, or no agents loaded) and never stored: real servers
// decorate histories this way, and the harness must not mind. A bound turn
// gets its agent's instruction in its place.
const systemPrompt = "You are the turncheck reference agent."

// Turn is one request's work: the history the model is sent, and how the
// result is committed.
type Turn struct {
	// Key names the conversation the turn runs on; none for a stateless one.
	Key store.Key
	// Stateful is set for a turn on a conversation, which commits.
	Stateful bool
	// Proto is the client protocol the turn came through.
	Proto config.Protocol
	// Chained marks a turn of the Responses API that makes a response of
	// its own: key names that response, and the turn commits its whole
	// history there (committed is 0), never on the response it chains
	// from.
	Chained bool
	// agent is the agent source the turn runs with; nil for none.
	agent *agentSource
	// Work is the working copy the turn runs on, committed only if it ends ok.
	Work *store.Conversation // the working copy the turn runs on
	// Committed is how many messages of Work are already committed under Key.
	Committed int // messages of work already committed under key
	// Own is the index in work of the turn's first message: those before
	// it are the history the turn continues (for chat, committed).
	Own int
	// settled is the length of work at the end of its last completed tool
	// round (all its results in); 0 before one completes.
	settled int
	// Hid are the indexes of the committed messages this turn's
	// compaction hid; they are committed with the turn.
	Hid []int
	// overwrite commits over whatever another turn committed meanwhile:
	// set only by the mutants that run a turn without the lock.
	overwrite bool
	// ToolNotes, if not nil, hears of the turn's tool rounds as they run:
	// only a protocol that shows tools to its client sets it (ACP).
	ToolNotes toolObserver
	// Release gives up the conversation's lock; it may be called more than
	// once. The turn calls it as soon as its outcome is decided, before
	// the client hears that outcome, so that a client that sends its next
	// turn the moment it has read this one's end finds the lock free.
	Release func()
	// Lease is the conversation's lease in a store shared by other
	// processes (PostgreSQL), until release: the turn commits under it
	// (WithLease), and only while it is still the turn's. nil for none.
	Lease *store.Lease
}

// Converse runs turn t, whose key and protocol are set, on its
// conversation, under the conversation's lock and by the server's
// concurrency policy, with input appended to the history: the turn of a
// chat request with a conversation id, of a Responses request in
// conversation mode, of a session.
func (s *Engine) Converse(rctx context.Context, c Client, t *Turn, input []openai.Message, model string, resp responder) {
	t.Stateful = true
	t.Release = func() {}
	base, err := s.acquire(rctx, t)
	switch {
	case err == nil && s.Crashing.Load():
		// The server is crashing, and this turn got its conversation
		// only now (the turn ahead of it died with the process, or let
		// go just as the crash began): it dies with the process too,
		// unstarted. Its own context ends only once net/http sees its
		// connection closed, or s.life ends, both after the turn ahead
		// let go: that is no sign it may run.
		err = errCrashing
	case err == nil && s.dropping.Load():
		// A stop dropped the turns still running just as this one got
		// its conversation (a turn ahead of it let go): it must not
		// start, though its own context may not have ended yet.
		err = errStopping
	}
	// Every way out releases the lock; the turn's own release comes
	// earlier, as soon as the turn is decided.
	defer func() { t.Release() }()
	if err != nil {
		t.Release()
		s.Refuse(rctx, c, t, err)
		return
	}
	t.Committed = len(base.Messages)
	if !s.Prepare(c, t, base, input, model) {
		return
	}
	s.Run(rctx, c, t, resp)
}

// UserInput is the input of a turn of chat or of a session: its new user
// message alone, kept as text: whatever else the client put on it is not
// the conversation's.
func UserInput(user openai.Message) []openai.Message {
	return []openai.Message{{Role: openai.RoleUser, Content: user.Content}}
}

// Prepare readies stateful turn t on the committed history base, for its
// input (the new user message, or a Responses request's items): it
// refuses (answering, and releasing t's lock) a turn that would overfill
// the history, whose client tool outputs answer no call, or that has no
// agent to run with, before any model call; otherwise it sets the turn's
// agent and its working copy, the input last, and reports true. A history
// that starts with this turn records the agent's source key, with its
// first commit, never changed after.
func (s *Engine) Prepare(c Client, t *Turn, base *store.Conversation, input []openai.Message, model string) bool {
	if t.Proto == config.ProtoResponses {
		input = s.replayOnToolOutput(base, input)
	}
	err := s.CheckHistory(base.Messages, input)
	if err == nil {
		err = checkToolInput(base.Messages, input)
	}
	if err != nil {
		// Refused before any model call: nothing changes.
		t.Release()
		s.Log.Info("input refused", "conversation", t.Key.ID, "err", err)
		c.Refuse(admission.Refuse(http.StatusBadRequest, "invalid_request_error", err.Error()))
		return false
	}
	agent, err := s.agentFor(t, base, model)
	if err != nil {
		// Refused before any model call: nothing changes.
		t.Release()
		s.refuseAgent(c, t, err)
		return false
	}
	t.agent = agent
	t.Own = len(base.Messages)
	t.Work = s.workingCopy(t, base)
	if len(base.Messages) == 0 && t.agent != nil {
		t.Work.Source = t.agent.Key
	}
	for _, m := range input {
		t.Work.Messages = append(t.Work.Messages, &store.Message{Message: m})
	}
	return true
}

// workingCopy returns the copy of the committed conversation base that the
// turn runs on: a deep copy, so that nothing the turn does shows in base
// before it commits. Three mutants change it: mutate-before-run runs on
// base itself, branch-mutates-base on the cached history of the response
// a Responses turn chains from, shallow-clone on a copy that shares base's
// messages.
func (s *Engine) workingCopy(t *Turn, base *store.Conversation) *store.Conversation {
	switch s.Cfg.Mutant {
	case config.MutateBeforeRun:
		// The bug: run on the cached conversation itself, so whatever
		// the turn appends stays even when the turn fails.
		s.Convs.Cache.Add(t.Key, base)
		return base
	case config.BranchMutatesBase:
		if t.Chained {
			// The bug: base is the cached history of the response the
			// turn chains from (loaded under its lock, lockBase), and
			// the turn appends to it in place, so every later request
			// chained from that response sees this turn once it has
			// committed (lockBase's release takes back one that did
			// not). The first response of a chain has a fresh base that
			// nothing else holds.
			return base
		}
	case config.ShallowClone:
		// The bug: the slice is copied, the messages are shared, so the
		// turn's compaction marks land on the committed conversation.
		return base.ShallowClone()
	}
	return base.Clone()
}

// acquire takes the turn's conversation lock, by the server's concurrency
// policy, and returns the committed conversation as it stands under the
// lock. The mutants that skip the lock load the conversation without it,
// and mark the turn to commit over whatever another turn commits meanwhile;
// refuse-concurrent-new refuses (errSessionBusy) a request that finds the
// lock of a conversation with nothing committed taken.
func (s *Engine) acquire(ctx context.Context, t *Turn) (*store.Conversation, error) {
	switch s.Cfg.Mutant {
	case config.NoConversationLock, config.ACPConcurrentPrompts, config.A2AContextRace:
		if s.Cfg.Mutant == config.NoConversationLock || s.Cfg.Mutant == config.ACPConcurrentPrompts && t.Proto == config.ProtoACP ||
			s.Cfg.Mutant == config.A2AContextRace && t.Proto == config.ProtoA2A {
			// The bug: the turn runs at once, beside any other of its
			// conversation (or, under acp-concurrent-prompts, of its ACP
			// session), on the history committed when it came.
			t.overwrite = true
			return s.Convs.Peek(ctx, t.Key)
		}
	case config.ForkNewSession:
		// The bug: the conversation is resolved before its lane, and one
		// with nothing committed yet is started outside it.
		base, err := s.Convs.Peek(ctx, t.Key)
		if err != nil || len(base.Messages) == 0 {
			t.overwrite = true
			return base, err
		}
	case config.RefuseConcurrentNew:
		// The bug: a request that finds the lane taken by the first turn
		// of a conversation not yet committed is refused as busy, where
		// it should wait its turn (or, under Reject, get 409).
		lease, unlock, busy, err := s.quickTry(ctx, t)
		switch {
		case err != nil:
			return nil, err
		case unlock != nil:
			return s.loadUnder(ctx, t, lease, unlock, s.Convs.Get)
		case busy:
			base, err := s.Convs.Peek(ctx, t.Key)
			if err != nil {
				return nil, err
			}
			if len(base.Messages) == 0 {
				return nil, store.ErrSessionBusy
			}
			// A conversation with a committed turn: its lane as usual.
		}
	}
	if s.Store.Shared != nil {
		switch s.Cfg.Mutant {
		case config.ReplicaLocalLock:
			// The bug (the lock of this process alone): the base may miss
			// another replica's turn running meanwhile, and the later
			// commit goes over the earlier.
			t.overwrite = true
		case config.ReplicaStaleCache:
			// The bug: a turn that finds the lock free takes it that
			// nobody else held the conversation since it cached it, and
			// serves its cached copy unchecked, committing over whatever
			// another replica committed meanwhile. Only a turn that waited
			// for another replica's checks its cache.
			lease, unlock, _, err := s.quickTry(ctx, t)
			if err != nil {
				return nil, err
			}
			if unlock != nil {
				t.overwrite = true
				return s.loadUnder(ctx, t, lease, unlock, s.Convs.GetUnchecked)
			}
		case config.ReplicaCommitUnlocked:
			return s.acquireBaseFirst(ctx, t)
		}
	}
	lease, unlock, err := s.Locks.Lock(ctx, t.Key, s.Cfg.Concurrency, s.Cfg.RequestTimeout)
	if err != nil {
		return nil, err
	}
	return s.loadUnder(ctx, t, lease, unlock, s.Convs.Get)
}

// quickTry takes t's conversation lock at once, with no wait, as the
// mutants that act on a lock found free do; lease is nil where the store
// is one process's. Where it cannot be had this instant, unlock is nil:
// busy says another turn holds it; otherwise the
// store had no connection free, or this replica's beats did not land,
// and the turn's usual lane waits for those. err is any other failure.
func (s *Engine) quickTry(ctx context.Context, t *Turn) (lease *store.Lease, unlock func(), busy bool, err error) {
	lease, unlock, err = s.Locks.Lock(ctx, t.Key, config.Reject, 0)
	switch {
	case err == nil:
		return lease, unlock, false, nil
	case errors.Is(err, store.ErrConversationBusy):
		return nil, nil, true, nil
	case errors.Is(err, store.ErrLeaseLost) || store.StoreFull(err):
		return nil, nil, false, nil
	}
	return nil, nil, false, err
}

// loadUnder loads t's base with get under lease, which t holds from now
// until its release (unlock), and then gives back the connection the
// lease was taken on: a turn holds no connection to the store while it
// is at its model.
func (s *Engine) loadUnder(ctx context.Context, t *Turn, lease *store.Lease, unlock func(),
	get func(context.Context, store.Key) (*store.Conversation, error)) (*store.Conversation, error) {
	t.Release, t.Lease = unlock, lease
	defer lease.Rest()
	return get(store.WithLease(ctx, lease), t.Key)
}

// sharedLocks is the cross-process lock of st for a server with mutant m:
// none under replica-local-lock, whose turns take the lock of their own
// process alone.
func sharedLocks(st *store.Store, m config.Mutant) *store.Leases {
	if m == config.ReplicaLocalLock {
		return nil
	}
	return st.Shared
}

// acquireBaseFirst is acquire under the replica-commit-unlocked mutant, on
// a shared store: the turn loads its base (checking the cache against the
// store) under the lock of its own process, and only then takes the
// shared one, and commits over whatever another replica committed while
// it waited for it.
func (s *Engine) acquireBaseFirst(ctx context.Context, t *Turn) (*store.Conversation, error) {
	deadline := time.Now().Add(s.Cfg.RequestTimeout)
	local, err := s.Locks.LockLocal(ctx, t.Key, s.Cfg.Concurrency, s.Cfg.RequestTimeout)
	if err != nil {
		return nil, err
	}
	// The bug: the base is current for this process only; another
	// replica's turn may commit before the shared lock is ours.
	base, err := s.Convs.Get(ctx, t.Key)
	if err != nil {
		local()
		return nil, err
	}
	lease, shared, err := s.Locks.Shared.Lock(ctx, t.Key, s.Cfg.Concurrency, time.Until(deadline), s.Locks.Gauge)
	if err != nil {
		local()
		return nil, err
	}
	// Taken, it is given back at once: the base is loaded already.
	lease.Rest()
	var once sync.Once
	t.Release = func() { once.Do(func() { shared(); local() }) }
	t.Lease = lease
	t.overwrite = true
	return base, nil
}

// Refuse answers a turn that could not start: its conversation was busy,
// its client went away while it waited, or the conversation did not load.
// The refuse-concurrent-new mutant's busy new session is a 500, as
// openclaw's "session is busy" is.
func (s *Engine) Refuse(rctx context.Context, c Client, t *Turn, err error) {
	switch {
	case errors.Is(err, store.ErrConversationBusy):
		c.Refuse(admission.Refuse(http.StatusConflict, "conflict",
			"a turn on this conversation is already in flight; nothing was changed: send this turn again once that one has ended"))
	case errors.Is(err, store.ErrSessionBusy):
		c.Refuse(admission.Refuse(http.StatusInternalServerError, "server_error", "session is busy"))
	case errors.Is(err, store.ErrWaitTimedOut):
		c.Refuse(&admission.Refusal{Status: http.StatusServiceUnavailable, Type: "conversation_busy", RetryAfter: true,
			Message: fmt.Sprintf("waited %s for a turn on this conversation already in flight; nothing was changed: retry", s.Cfg.RequestTimeout)})
	case store.StoreFull(err):
		s.refuseStoreFull(c, t, err)
	case errors.Is(err, store.ErrLeaseLost):
		s.Log.Warn("turn refused: this server could not reach its store for a while", "conversation", t.Key.ID)
		c.Refuse(lapsed())
	case errors.Is(err, errCrashing):
		s.Log.Info("server crashing: turn dropped before it started", "conversation", t.Key.ID)
		c.Refuse(admission.ClientGone(false))
	case errors.Is(err, errStopping):
		s.answerDropped(c, nil)
	case s.stopDropped(rctx, c, nil):
	case rctx.Err() != nil:
		c.Refuse(admission.ClientGone(false))
	default:
		s.Log.Error("load conversation", "conversation", t.Key.ID, "err", err)
		c.Refuse(admission.Refuse(http.StatusInternalServerError, "server_error", "cannot load the conversation"))
	}
}

// refuseStoreFull answers a turn refused, before any model call, because
// no connection to the store was to be had within its wait: the server's
// own were all held by turns (MaxStoreConns), or the database took no
// more. It is load, not a fault: 503 with Retry-After, nothing changed.
func (s *Engine) refuseStoreFull(c Client, _ *Turn, err error) {
	c.Refuse(s.StoreFullRefusal(err, "nothing was changed"))
}

// StoreFullRefusal is the refusal, for load, of a request that got no
// connection to the store within its wait (err, store.StoreFull), saying
// who refused it, PostgreSQL or the server's own pool; it is logged
// (Gate.Refusals). undone says what the request did not do.
func (s *Engine) StoreFullRefusal(err error, undone string) *admission.Refusal {
	who, why := store.RefusedBy(err), ""
	if who == "postgresql" {
		why = "PostgreSQL took no new connection to the server's store (it is at its max_connections, or not taking any) within the request's wait"
	} else {
		why = fmt.Sprintf("every connection of the server's store pool (--max-store-conns %d) was held by other turns for the request's whole wait", s.Cfg.MaxStoreConns)
	}
	s.Gate.Refusals.Refused(who, why)
	return admission.Overloaded(why + "; " + undone + ": retry shortly")
}

// lapsed is the answer to a turn whose process lost its hold on its
// conversation (store.ErrLeaseLost), before the turn or during it.
func lapsed() *admission.Refusal {
	return admission.Overloaded("this server could not reach its store for a while; nothing was changed: retry shortly")
}

// Run runs the turn's tool loop on its working copy, answers the client in
// its protocol (resp), and commits the turn if and only if it ended ok; an
// interrupted turn leaves what the interruption policy says
// (interruption.go).
func (s *Engine) Run(rctx context.Context, c Client, t *Turn, resp responder) {
	// ctx is the turn's: it ends when the client goes away, when the
	// server crashes, and when a write to the client fails. Each model
	// call and lookup has its own deadline under it. A turn that
	// completes (Complete) runs on whatever its client does: only the
	// server ends it early.
	ctx, cancel, completes := s.turnContext(rctx, t)
	defer cancel()
	if t.Lease != nil {
		// A lease whose process lost its hold on it ends the turn,
		// whatever the client does: another replica may take the
		// conversation soon (store.Leases).
		defer context.AfterFunc(t.Lease.Context(), cancel)()
	}
	// A client that stops reading must not hold the conversation: a write
	// that fails, or blocks past StreamWriteTimeout, ends the turn; one
	// that completes, it only stops writing to.
	o := newOutput(c, resp, completes, cancel)
	if s.Cfg.Stall > 0 {
		o.stall = func() { s.stall(ctx) }
	}
	defer c.Done() // the connection lives on
	resp.Begin(o)
	endTitle := s.title(ctx, t)
	reply, err := s.loop(ctx, t, func() { resp.Started(o) }, func(text string) { resp.Delta(o, text) })
	endTitle()
	switch {
	case err != nil && t.Lease.Lapsed() && !s.Crashing.Load():
		t.Release()
		s.Log.Warn("turn stopped and rolled back: this server could not reach its store for a while, and another may take the conversation", "conversation", t.Key.ID)
		s.answer(c, o, lapsed())
		return
	case completes:
		// Whether or not the client is still there: the turn ran to its
		// end, and settles as if it had stayed, unless the server ended
		// it first.
		if s.dropped(rctx, c, ctx, t, o, err) {
			return
		}
		if err != nil {
			s.Fail(c, t, o, reply, err)
			return
		}
	case o.Err != nil:
		// Whether or not the model finished (its last chunks may have been
		// buffered already), the turn never reached the client.
		t.Release()
		s.Log.Info("client stopped reading; turn rolled back", "conversation", t.Key.ID, "err", o.Err)
		return
	case s.dropping.Load() && !s.Crashing.Load() && rctx.Err() != nil:
		// The server's stop dropped the turn before its end: it commits
		// nothing, and the client hears so.
		t.Release()
		s.Log.Info("server stopping, its grace ran out: turn dropped by the server and rolled back", "conversation", t.Key.ID)
		s.stopDropped(rctx, c, o)
		return
	case s.interrupted(rctx):
		// Whatever the loop returned: the client is gone, and whether the
		// model finished or failed meanwhile, it never heard of it.
		kept := s.interrupt(t)
		if !o.Streaming() {
			c.Refuse(admission.ClientGone(kept))
		}
		return
	case s.Crashing.Load() || rctx.Err() != nil:
		// The server crashed under the turn: it commits nothing. Its
		// request's context may not have ended yet (net/http notices a
		// closed connection, and s.life's end reaches the request, each
		// on a goroutine of its own), but crashing is set before
		// anything of the crash is done.
		s.crashedUnder(c, t, o)
		return
	case err != nil:
		s.Fail(c, t, o, reply, err)
		return
	}
	if t.Stateful {
		t.Work.Messages = append(t.Work.Messages, &store.Message{Message: openai.Message{Role: openai.RoleAssistant, Content: openai.Content(reply)}})
		// Acknowledge only what is durable: commit before the client hears
		// the turn ended ok.
		s.stall(ctx)
		if s.Crashing.Load() {
			// The crash was ordered while the turn waited to commit: a
			// killed process commits nothing more.
			s.crashedUnder(c, t, o)
			return
		}
		err := s.Convs.Commit(store.WithLease(ctx, t.Lease), t.Key, t.Committed, t.Hid, t.Work, t.overwrite)
		if err == nil {
			// All of work is committed now: a release that takes back a
			// turn that did not commit (branch-mutates-base's) keeps it.
			t.Committed = len(t.Work.Messages)
		}
		t.Release()
		if err != nil {
			s.Log.Error("commit", "conversation", t.Key.ID, "err", err)
			if store.StoreFull(err) {
				// No connection to commit on came within the commit's
				// time: nothing of the turn is in the store.
				s.answer(c, o, admission.Overloaded("the server's store took no connection to commit the turn on; nothing was changed: retry shortly"))
				return
			}
			s.answerError(c, o, http.StatusInternalServerError, "server_error", "the turn could not be committed")
			return
		}
		if completes && (o.Err != nil || rctx.Err() != nil) {
			s.Log.Info("client went away; turn completed and committed", "conversation", t.Key.ID)
		}
	}
	resp.Succeeded(o, reply)
}

// Fail answers a turn whose model call failed, in any round, or that
// asked for too many rounds. Nothing is committed, except under the
// mutants that keep a failed turn (keepsFailed). It releases the
// conversation before it answers.
func (s *Engine) Fail(c Client, t *Turn, o *Output, partial string, err error) {
	if s.keepsFailed(t, err) {
		if partial != "" {
			t.Work.Messages = append(t.Work.Messages, &store.Message{Message: openai.Message{Role: openai.RoleAssistant, Content: openai.Content(partial)}})
		}
		_ = s.Convs.Commit(store.WithLease(context.Background(), t.Lease), t.Key, t.Committed, t.Hid, t.Work, t.overwrite)
	}
	// The turn is decided (rolled back, or committed by a mutant):
	// release before the client hears of it.
	t.Release()
	if errors.Is(err, admission.ErrOverBudget) {
		s.Log.Info("memory budget taken by the requests in flight; turn rolled back", "conversation", t.Key.ID, "max_memory", s.Cfg.MaxMemory)
		s.answer(c, o, s.Gate.OverBudget())
		return
	}
	if errors.Is(err, context.DeadlineExceeded) {
		s.Log.Info("model timed out; turn rolled back", "conversation", t.Key.ID, "timeout", s.Cfg.RequestTimeout)
		s.answerError(c, o, http.StatusGatewayTimeout, "upstream_timeout", msgModelTimedOut)
		return
	}
	if r, ok := o.resp.(refusalResponder); ok && refusedByModel(err) {
		// A protocol that tells a refusal from a failure (ACP's
		// stopReason refusal) says so; the turn is rolled back all the
		// same.
		s.Log.Info("model refused the prompt; turn rolled back", "conversation", t.Key.ID)
		r.Refused(o)
		return
	}
	// The details are the operator's: the client gets the class alone.
	attrs := []any{"conversation", t.Key.ID, "err", s.Redact(err.Error())}
	var upErr *upstreamError
	if errors.As(err, &upErr) && upErr.cause != nil {
		attrs = append(attrs, "cause", s.Redact(upErr.cause.Error()))
	}
	s.Log.Warn("model failed; turn rolled back", attrs...)
	s.answerError(c, o, http.StatusBadGateway, "upstream_error", msgModelFailed)
}

// keepsFailed reports whether the failed turn t is committed all the same:
// only under mutants. commit-on-stream-error keeps a stateful turn
// whose model stream had begun, with its partial reply;
// failed-response-chainable keeps a chained response however it failed.
func (s *Engine) keepsFailed(t *Turn, err error) bool {
	if !t.Stateful {
		return false
	}
	switch s.Cfg.Mutant {
	case config.CommitOnStreamError:
		var upErr *upstreamError
		return errors.As(err, &upErr) && upErr.started
	case config.FailedResponseChainable:
		// The bug: the response was minted, and its id told the client,
		// before the turn ran; it is stored whatever became of the turn.
		return t.Chained
	case config.ACPRefusalKeepsPrompt:
		// The bug: the prompt went into the session before the model
		// ran, and a refusal does not take it out.
		return t.Proto == config.ProtoACP && refusedByModel(err)
	case config.A2AFailedTaskStays:
		// The bug: the message went into the context's session before
		// the run, and a failed task does not take it out.
		return t.Proto == config.ProtoA2A
	}
	return false
}

// answerError reports a failure: as a status before the answer's stream
// began, on the stream (in the turn's protocol) after.
func (s *Engine) answerError(c Client, o *Output, status int, typ, msg string) {
	s.answer(c, o, admission.Refuse(status, typ, msg))
}

// answer reports a failure, r: as a status (with Retry-After if r asks
// for it) before the answer's stream began, on the stream (in the turn's
// Protocol) after.
func (s *Engine) answer(c Client, o *Output, r *admission.Refusal) {
	if !o.Streaming() {
		c.Refuse(r)
		return
	}
	o.resp.Failed(o, r.Type, r.Message)
}

// stopDropped answers a request that a stop dropped (its grace ran out)
// with 503, or on a stream with a failure, and reports whether it was one:
// nothing of its turn was kept.
func (s *Engine) stopDropped(rctx context.Context, c Client, o *Output) bool {
	if !s.dropping.Load() || s.Crashing.Load() || rctx.Err() == nil {
		return false
	}
	s.answerDropped(c, o)
	return true
}

// errStopping is a turn refused because a stop is dropping the turns.
var errStopping = errors.New("the server is stopping")

// errCrashing is a turn refused because the server is crashing: it got
// its conversation only after the crash was ordered.
var errCrashing = errors.New("the server is crashing")

// crashedUnder settles a turn the server crashed under before it
// committed: it commits nothing, as a killed process does, and releases
// the lock. Nobody hears the answer (the connections are dropped), but
// the handler must not end without one: net/http would send a 200.
func (s *Engine) crashedUnder(c Client, t *Turn, o *Output) {
	t.Release()
	s.Log.Info("server stopped under the turn; turn rolled back", "conversation", t.Key.ID)
	if !o.Streaming() {
		c.Refuse(admission.ClientGone(false))
	}
}

// answerDropped answers a turn a stop dropped: 503, or on a stream a
// failure.
func (s *Engine) answerDropped(c Client, o *Output) {
	s.answer(c, o, &admission.Refusal{Status: http.StatusServiceUnavailable, Type: "unavailable",
		Message: "the server is stopping and dropped this turn before its end; nothing was changed: retry", RetryAfter: true})
}

// DropTurns ends the turns still running, each answered that the server
// dropped it, and waits at most wait for their handlers to return (an
// HTTP server's answers are written after that: sut.Running waits for
// its connections instead).
func (s *Engine) DropTurns(wait time.Duration) {
	s.dropping.Store(true)
	s.EndTurns()
	deadline := time.Now().Add(wait)
	for s.Gate.Handling() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// Engine runs turns: every protocol's adapter hands it a turn, a context
// and a Client, and it runs the turn on its conversation, under its lock,
// with the tool loop, and commits it or not.
type Engine struct {
	// Cfg is the server's configuration, its defaults filled in.
	Cfg config.Config
	// Sources are the agent definitions loaded at start.
	Sources *sources
	// Store is the durable store.
	Store *store.Store
	// Convs is the cache of committed conversations over Store.
	Convs *store.Conversations
	// Locks serialize the turns of each conversation.
	Locks store.Locks
	// Up is the client of the model.
	Up    *upstream
	tools *toolbox
	// Log receives what the server logs.
	Log *slog.Logger
	// IDs numbers the chat completions answered.
	IDs atomic.Int64
	// LineEpoch is new at each start: under Config.ResponsesLine, a line
	// named by response ids is kept under it, so that, as openclaw's
	// ids (kept in memory), those ids name nothing after a restart;
	// lines named by user outlive it.
	LineEpoch string
	// Gate admits every request, of every protocol, to the turns.
	Gate *admission.Gate
	// Redact hides credentials in what the server logs of a model failure.
	Redact func(string) string

	// life ends when the server crashes: every request's context, and so
	// every model call, ends with it.
	life context.Context
	// Kill ends life: a crash.
	Kill context.CancelFunc
	// turns ends with life, or when a stop drops the turns still running
	// (endTurns): the turns that complete whatever their client does
	// (Complete) run under it, not under their request.
	turns context.Context
	// EndTurns ends turns: a stop that drops the turns still running.
	EndTurns context.CancelFunc
	// Crashing is set as a crash begins, before the connections drop: a
	// turn whose client then seems gone dies with the process, and is no
	// interruption (interruption.go).
	Crashing atomic.Bool
	// dropping is set when a stop drops the turns still running (its
	// grace ran out, or Close): their requests end, and each is answered
	// that the server dropped it, before the connections close.
	dropping atomic.Bool
}

// Parts are what an engine runs on, opened by the server.
type Parts struct {
	// Sources are the agent definitions loaded.
	Sources *sources
	// Store is the durable store opened.
	Store *store.Store
	// Convs is the cache over Store.
	Convs *store.Conversations
	// Mem is the memory budget, which Convs charges too.
	Mem *admission.Budget
	// ModelURL is the model provider's base URL.
	ModelURL *url.URL
	// Log receives what the server logs.
	Log *slog.Logger
	// Scopes[i] is the scope of cfg.Keys[i]: a keyed digest (store.KeyScope),
	// as it is stored with every message and the store must hold no
	// Usable key.
	Scopes []string
}

// NewEngine returns the engine of a server configured by cfg (its
// defaults filled in) over p.
func NewEngine(cfg config.Config, p Parts) *Engine {
	e := newEngine(cfg, p)
	if p.Store != nil && p.Store.Shared != nil {
		// PostgreSQL's refusals of a connection are load, logged as
		// such, though a later try may get one.
		e.Store.Shared.Refused = func(err error) {
			e.Gate.Refusals.Refused("postgresql", "PostgreSQL refused a new connection: "+err.Error())
		}
	}
	return e
}

// newEngine is NewEngine, before the store hears of the gate.
func newEngine(cfg config.Config, p Parts) *Engine {
	life, kill := context.WithCancel(context.Background())
	turns, endTurns := context.WithCancel(life)
	up := newUpstream(p.ModelURL, cfg.ModelName, cfg.MaxRequests)
	return &Engine{
		LineEpoch: NewID("")[:8],
		Sources:   p.Sources,
		life:      life,
		Kill:      kill,
		turns:     turns,
		EndTurns:  endTurns,
		Cfg:       cfg,
		Store:     p.Store,
		Convs:     p.Convs,
		Locks:     store.Locks{Gauge: cfg.Gauge, Shared: sharedLocks(p.Store, cfg.Mutant)},
		Up:        up,
		tools:     newToolbox(p.ModelURL, up.client, cfg.Deadlines, cfg.RequestTimeout),
		Log:       p.Log,
		Redact:    NewRedactor(cfg.Keys, p.ModelURL).Redact,
		Gate: admission.NewGate(admission.GateConfig{Gauge: cfg.Gauge, Memory: p.Mem, MaxRequests: cfg.MaxRequests,
			Delay: cfg.TurnDelay, Life: life, Turns: turns,
			HTTP: admission.HTTPConfig{Keys: cfg.Keys, Scopes: p.Scopes, MaxBodyBytes: cfg.MaxBodyBytes, BodyTimeout: cfg.BodyTimeout},
			Log:  p.Log}),
	}
}

// checkToolInput refuses a Responses request's input whose client tool
// items do not pair, as OpenAI refuses it: an output that answers no call
// of the history or of the input before it ("no tool call found for
// function call output"), a call answered twice, or a call of the input
// left without its output. A model must never be sent a tool result
// without its call, nor a call without its result (T9).
func checkToolInput(history []*store.Message, input []openai.Message) error {
	if !slices.ContainsFunc(input, func(m openai.Message) bool { return m.Role == openai.RoleTool || len(m.ToolCalls) > 0 }) {
		return nil // nothing to pair: the history's calls are paired already
	}
	open := map[string]bool{} // calls not answered yet
	for _, m := range history {
		for _, c := range m.ToolCalls {
			open[c.ID] = true
		}
		if m.Role == openai.RoleTool {
			delete(open, m.ToolCallID)
		}
	}
	asked := map[string]bool{}
	for _, m := range input {
		for _, c := range m.ToolCalls {
			open[c.ID], asked[c.ID] = true, true
		}
		if m.Role != openai.RoleTool {
			continue
		}
		if !open[m.ToolCallID] {
			return fmt.Errorf("no tool call found for function call output with call_id %.300q: it answers no open call of the history or the input", m.ToolCallID)
		}
		delete(open, m.ToolCallID)
		delete(asked, m.ToolCallID)
	}
	for _, m := range input {
		for _, c := range m.ToolCalls {
			if asked[c.ID] {
				return fmt.Errorf("no tool output found for function call %.300q: send its function_call_output with it", c.ID)
			}
		}
	}
	return nil
}

// replayOnToolOutput is input, but under the replay-on-tool-output mutant,
// for an input without a usable user message (a client tool's output, a
// blank message), input followed by the last user message of the history
// it continues: that turn runs again as if it were new.
func (s *Engine) replayOnToolOutput(base *store.Conversation, input []openai.Message) []openai.Message {
	if s.Cfg.Mutant != config.ReplayOnToolOutput || slices.ContainsFunc(input, Usable) {
		return input
	}
	for i := len(base.Messages) - 1; i >= 0; i-- {
		if m := base.Messages[i]; m.Role == openai.RoleUser && Usable(m.Message) {
			return append(slices.Clip(input), openai.Message{Role: openai.RoleUser, Content: m.Content})
		}
	}
	return input
}

// refusalResponder is a responder whose protocol tells a turn the model
// refused from one that failed: fail calls refused in place of answering
// an error.
type refusalResponder interface {
	Refused(o *Output)
}

// refusedByModel reports whether err is the model refusing the prompt: an
// answer of 400, as Azure OpenAI answers a prompt its content filter
// refuses. The fake model gives it for a Status fault of 400.
func refusedByModel(err error) bool {
	var upErr *upstreamError
	return errors.As(err, &upErr) && upErr.status == http.StatusBadRequest
}

// DropAnswerWait bounds how long a stop waits for the turns it drops to
// be answered (503, or an error chunk and [DONE]) before it closes their
// connections: a model call ends at once when its context does, so the
// answers take milliseconds; a client that does not read is not waited
// for past it.
const DropAnswerWait = time.Second
