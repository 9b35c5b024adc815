package sut

import (
	"fmt"
	"net/http"
)

// Interruption is what a turn leaves in its conversation when its client
// disconnects while it runs (PROTOCOL.md, T10). Either way the turn stops
// at once: no model call and no tool run starts for it after the
// disconnect is seen.
type Interruption string

// The interruption policies PROTOCOL.md allows a server to declare (T10).
const (
	// Rollback leaves the conversation as it was before the turn: nothing
	// of the turn is committed.
	Rollback Interruption = "rollback"
	// KeepConsistent commits, if at least one of the turn's tool rounds
	// completed, the turn's user message and its completed rounds (each
	// assistant tool call message with all its results), and nothing
	// after: never a round whose results are not all in, never a reply.
	// With no round completed it commits nothing, as Rollback.
	KeepConsistent Interruption = "keep-consistent"
)

// ParseInterruption returns the policy named s ("" for Rollback), or an
// error naming the valid values.
func ParseInterruption(s string) (Interruption, error) {
	switch p := Interruption(s); p {
	case "":
		return Rollback, nil
	case Rollback, KeepConsistent:
		return p, nil
	}
	return "", fmt.Errorf("unknown interruption policy %q (want %s or %s)", s, Rollback, KeepConsistent)
}

// interrupted reports whether the turn of r was interrupted: its client
// went away. A crash drops every connection and ends every request's
// context too, but a killed process commits nothing, so that is no
// interruption.
func (s *Server) interrupted(r *http.Request) bool {
	return r.Context().Err() != nil && !s.crashing.Load() && s.life.Err() == nil
}

// interrupt settles an interrupted turn by the server's policy, under the
// conversation's lock, and releases the lock. A commit is durable before
// the lock goes, though nobody hears of it: the client is gone, and its
// next turn finds the conversation as committed. It reports whether
// anything was committed.
func (s *Server) interrupt(t *turn) bool {
	defer t.release()
	keep := s.interruptedKeeps(t)
	if keep == nil {
		s.log.Info("client went away; turn rolled back", "conversation", t.key.id)
		return false
	}
	if err := s.convs.commit(t.key, t.committed, t.hid, keep, t.overwrite); err != nil {
		s.log.Error("commit of an interrupted turn", "conversation", t.key.id, "err", err)
		return false
	}
	s.log.Info("client went away; turn kept up to its last completed tool round",
		"conversation", t.key.id, "messages", len(keep.messages)-t.committed)
	return true
}

// interruptedKeeps is what an interrupted turn commits: nil for nothing.
// The orphan-tool-call-on-interrupt mutant keeps the working copy as it
// stands, whatever the policy.
func (s *Server) interruptedKeeps(t *turn) *conversation {
	if !t.stateful {
		return nil
	}
	if s.cfg.Mutant == OrphanToolCallOnInterrupt {
		// The bug (goose's replace_conversation on cancel): the working
		// copy is persisted as it stands, a round whose results are not
		// all in included: an assistant tool call without its result.
		return t.work
	}
	if s.cfg.Interruption != KeepConsistent || t.settled == 0 {
		return nil
	}
	return &conversation{messages: t.work.messages[:t.settled:t.settled], source: t.work.source}
}
