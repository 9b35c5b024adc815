package sut

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
func (s *engine) turnContext(rctx context.Context, t *turn) (ctx context.Context, cancel context.CancelFunc, completes bool) {
	if s.cfg.Interruption != config.Complete || !t.stateful {
		ctx, cancel = context.WithCancel(s.noticed(rctx))
		s.cfg.Gauge.DoneWhen(ctx, admission.TicketOf(rctx).Tag())
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
func (s *engine) dropped(rctx context.Context, c Client, ctx context.Context, t *turn, o *output, err error) bool {
	switch {
	case s.crashing.Load() || s.life.Err() != nil:
		s.crashedUnder(c, t, o)
		return true
	case err != nil && ctx.Err() != nil:
		t.release()
		s.log.Info("server stopping, its grace ran out: turn dropped by the server and rolled back", "conversation", t.key.ID)
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
func (s *engine) interrupted(rctx context.Context) bool {
	return rctx.Err() != nil && !s.crashing.Load() && !s.dropping.Load() && s.life.Err() == nil
}

// interrupt settles an interrupted turn by the server's policy, under the
// Conversation's lock, and releases the lock. A commit is durable before
// the lock goes, though nobody hears of it: the client is gone, and its
// next turn finds the conversation as committed. It reports whether
// anything was committed.
func (s *engine) interrupt(t *turn) bool {
	defer t.release()
	keep := s.interruptedKeeps(t)
	if keep == nil {
		s.log.Info("client went away; turn rolled back", "conversation", t.key.ID)
		return false
	}
	s.stall(s.turns)
	if s.crashing.Load() {
		// The crash was ordered while the turn waited to commit: a
		// killed process commits nothing more.
		s.log.Info("server stopped under the interrupted turn; turn rolled back", "conversation", t.key.ID)
		return false
	}
	if err := s.convs.Commit(store.WithConn(context.Background(), t.conn), t.key, t.committed, t.hid, keep, t.overwrite); err != nil {
		s.log.Error("commit of an interrupted turn", "conversation", t.key.ID, "err", err)
		return false
	}
	s.log.Info("client went away; turn kept up to its last completed tool round",
		"conversation", t.key.ID, "messages", len(keep.Messages)-t.committed)
	return true
}

// interruptedKeeps is what an interrupted turn commits: nil for nothing.
// The orphan-tool-call-on-interrupt mutant keeps the working copy as it
// stands, whatever the policy.
func (s *engine) interruptedKeeps(t *turn) *store.Conversation {
	if !t.stateful {
		return nil
	}
	if s.cfg.Mutant == config.OrphanToolCallOnInterrupt {
		// The bug (goose's replace_conversation on cancel): the working
		// copy is persisted as it stands, a round whose results are not
		// all in included: an assistant tool call without its result.
		return t.work
	}
	if s.cfg.Mutant == config.ACPCancelCommitsPrompt && t.proto == config.ProtoACP {
		// The bug (an agent that adds the prompt to its session before
		// the run): the cancelled turn keeps its user message, and the
		// tool rounds it completed.
		return &store.Conversation{Messages: t.work.Messages[:max(t.settled, t.own+1)], Source: t.work.Source}
	}
	if s.cfg.Interruption != config.KeepConsistent || t.settled == 0 {
		return nil
	}
	return &store.Conversation{Messages: t.work.Messages[:t.settled:t.settled], Source: t.work.Source}
}
