package turn

import (
	"context"
	"net/http"

	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/store"
)

// turnContext returns the context the turn t runs on, and whether the
// turn completes whatever its client does. A turn's context ends when its
// client goes away, and so when the server crashes (ServeHTTP ends every
// request's context then). Under Complete a stateful turn's is detached
// from its client: it ends only with s.turns (a crash, or a stop that
// drops the turns still running); each model call and lookup keeps its
// own deadline under it. A stateless turn has no conversation to complete:
// it stops with its client under any policy.
func (s *Engine) turnContext(rctx context.Context, t *Turn) (ctx context.Context, cancel context.CancelFunc, completes bool) {
	if s.Cfg.Interruption != config.Complete || !t.Stateful {
		ctx, cancel = context.WithCancel(s.noticed(rctx))
		s.Cfg.Gauge.DoneWhen(ctx, admission.TicketOf(rctx).Tag())
		return ctx, cancel, false
	}
	ctx, end := context.WithCancel(context.WithoutCancel(rctx))
	stop := context.AfterFunc(s.turns, end)
	return ctx, func() { stop(); end() }, true
}

// dropped settles a turn under Complete that the server itself ended
// before it could: a crash, or a stop that dropped the turns still
// running. Neither commits anything: a killed process commits nothing,
// and the turn did not end. It releases the lock and reports true for
// such a turn; for any other it does nothing and reports false. A turn
// that ended ok just as a stop came is not dropped: it commits.
func (s *Engine) dropped(rctx context.Context, c Client, ctx context.Context, t *Turn, o *Output, err error) bool {
	switch {
	case s.Crashing.Load() || s.life.Err() != nil:
		s.crashedUnder(c, t, o)
		return true
	case err != nil && ctx.Err() != nil:
		t.Release()
		s.Log.Info("server stopping, its grace ran out: turn dropped by the server and rolled back", "conversation", t.Key.ID)
		if !s.stopDropped(rctx, c, o) && rctx.Err() == nil {
			s.answerError(c, o, http.StatusServiceUnavailable, "unavailable", "the server is stopping; the turn was rolled back")
		}
		return true
	}
	return false
}

// interrupted reports whether the turn of request context rctx was interrupted: its client
// went away. Under Complete it does not matter (see turnContext). A crash drops every connection and ends every request's
// context too, but a killed process commits nothing, so that is no
// interruption.
func (s *Engine) interrupted(rctx context.Context) bool {
	return rctx.Err() != nil && !s.Crashing.Load() && !s.dropping.Load() && s.life.Err() == nil
}

// interrupt settles an interrupted turn by the server's policy, under the
// conversation's lock, and releases the lock. A commit is durable before
// the lock goes, though nobody hears of it: the client is gone, and its
// next turn finds the conversation as committed. It reports whether
// anything was committed.
func (s *Engine) interrupt(t *Turn) bool {
	defer t.Release()
	keep := s.interruptedKeeps(t)
	if keep == nil {
		s.Log.Info("client went away; turn rolled back", "conversation", t.Key.ID)
		return false
	}
	s.stall(s.turns)
	if s.Crashing.Load() {
		// The crash was ordered while the turn waited to commit: a
		// killed process commits nothing more.
		s.Log.Info("server stopped under the interrupted turn; turn rolled back", "conversation", t.Key.ID)
		return false
	}
	if err := s.Convs.Commit(store.WithLease(context.Background(), t.Lease), t.Key, t.Committed, t.Hid, keep, t.overwrite); err != nil {
		s.Log.Error("commit of an interrupted turn", "conversation", t.Key.ID, "err", err)
		return false
	}
	s.Log.Info("client went away; turn kept up to its last completed tool round",
		"conversation", t.Key.ID, "messages", len(keep.Messages)-t.Committed)
	return true
}

// interruptedKeeps is what an interrupted turn commits: nil for nothing.
// The orphan-tool-call-on-interrupt mutant keeps the working copy as it
// stands, whatever the policy.
func (s *Engine) interruptedKeeps(t *Turn) *store.Conversation {
	if !t.Stateful {
		return nil
	}
	if s.Cfg.Mutant == config.OrphanToolCallOnInterrupt {
		// The bug (goose's replace_conversation on cancel): the working
		// copy is persisted as it stands, a round whose results are not
		// all in included: an assistant tool call without its result.
		return t.Work
	}
	if s.Cfg.Mutant == config.ACPCancelCommitsPrompt && t.Proto == config.ProtoACP ||
		s.Cfg.Mutant == config.A2ACancelCommits && t.Proto == config.ProtoA2A {
		// The bug (an agent that adds the prompt to its session before
		// the run): the cancelled turn keeps its user message, and the
		// tool rounds it completed.
		return &store.Conversation{Messages: t.Work.Messages[:max(t.settled, t.Own+1)], Source: t.Work.Source}
	}
	if s.Cfg.Interruption != config.KeepConsistent || t.settled == 0 {
		return nil
	}
	return &store.Conversation{Messages: t.Work.Messages[:t.settled:t.settled], Source: t.Work.Source}
}
