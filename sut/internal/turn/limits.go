package turn

import (
	"fmt"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/store"
)

// CheckHistory refuses a turn that would take its conversation past the
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
func (s *Engine) CheckHistory(committed []*store.Message, input []openai.Message) error {
	if n := len(committed) + len(input) + 1; n > s.Cfg.MaxHistoryMessages {
		return fmt.Errorf("the conversation is full: with this turn and its reply it would hold %d messages, over the server's limit of %d; nothing was changed: start a new conversation",
			n, s.Cfg.MaxHistoryMessages)
	}
	var size int64
	for _, m := range input {
		size += (&store.Message{Message: m}).Size()
	}
	for _, m := range committed {
		size += m.Size()
	}
	if size > s.Cfg.MaxHistoryBytes {
		return fmt.Errorf("the conversation is full: with this turn its history would be %d bytes, over the server's limit of %d; nothing was changed: start a new conversation",
			size, s.Cfg.MaxHistoryBytes)
	}
	return nil
}
