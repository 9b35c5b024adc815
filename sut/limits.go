package sut

import (
	"fmt"
	"sync/atomic"

	"github.com/turncheck/turncheck/internal/openai"
)

// requestSlots bounds the turn requests a server works on at once, counted
// from the moment their body is in: each may hold a model connection, a
// reply of up to maxReplyBytes, and a conversation's history. Requests
// still sending their body are bounded by the connection cap and the body
// deadline instead, so that slow senders cannot take the slots of turns.
type requestSlots struct {
	max  int64
	used atomic.Int64
}

// take takes a slot, or reports that all are taken.
func (rs *requestSlots) take() bool {
	if rs.used.Add(1) > rs.max {
		rs.used.Add(-1)
		return false
	}
	return true
}

func (rs *requestSlots) give() { rs.used.Add(-1) }

// checkHistory refuses a turn that would take its conversation past the
// history limits: committed is the history so far, user the turn's new
// message. The reply's size is not known before the model call, so the
// turn must leave room for one more message, and its history with the new
// message must be within MaxHistoryBytes; a reply may then take it past
// that, and the next turn is refused.
//
// A turn's tool rounds are not known before it runs either: they may take
// a conversation past either limit too, by at most MaxToolRounds rounds,
// and then the next turn is refused. Text counts with the arguments of
// the tool calls.
//
// A full conversation is refused, never trimmed: every committed turn
// stays in every later model request (PROTOCOL.md, T2), but for the tool
// rounds compaction hides. The client learns why, with the limit, instead
// of a model error on every later turn.
func (s *Server) checkHistory(committed []*message, input []openai.Message) error {
	if n := len(committed) + len(input) + 1; n > s.cfg.MaxHistoryMessages {
		return fmt.Errorf("the conversation is full: with this turn and its reply it would hold %d messages, over the server's limit of %d; nothing was changed: start a new conversation",
			n, s.cfg.MaxHistoryMessages)
	}
	var size int64
	for _, m := range input {
		size += (&message{Message: m}).size()
	}
	for _, m := range committed {
		size += m.size()
	}
	if size > s.cfg.MaxHistoryBytes {
		return fmt.Errorf("the conversation is full: with this turn its history would be %d bytes, over the server's limit of %d; nothing was changed: start a new conversation",
			size, s.cfg.MaxHistoryBytes)
	}
	return nil
}
