package turn

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/config"
)

// Bounds on the fields of a chat request. They hold whatever the body
// limit: a field the server copies (the model name goes into every stream
// chunk) must not turn a small body into a large response.
const (
	// MaxModelBytes bounds the request's "model".
	MaxModelBytes = 256
	// MaxContentBytes bounds the text of each message of a request.
	MaxContentBytes = 64 << 10
	// MaxMessages bounds the messages of one request (a stateless request
	// carries its whole history).
	MaxMessages = 1024
	// MaxConversationIDBytes bounds a conversation id.
	MaxConversationIDBytes = 256
)

// CheckID refuses an id a client gives (what it names) that is not one:
// blank, too long, not UTF-8, or with control characters, which the
// server keeps for the namespaces of its protocols (nsResponse).
func CheckID(what, id string) error {
	switch {
	case strings.TrimSpace(id) == "":
		return fmt.Errorf("%s is blank", what)
	case len(id) > MaxConversationIDBytes:
		return fmt.Errorf("%s over %d bytes", what, MaxConversationIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("%s is not valid UTF-8", what)
	case strings.IndexFunc(id, unicode.IsControl) >= 0:
		return fmt.Errorf("%s has control characters", what)
	}
	return nil
}

// NewUserMessage returns the request's usable new user message: the last
// element of the array, with role user and non-blank content. Nothing else
// in the array is ever used, so an older message cannot be replayed (T3).
func (s *Engine) NewUserMessage(msgs []openai.Message) (openai.Message, error) {
	if n := len(msgs); n > 0 && Usable(msgs[n-1]) {
		return msgs[n-1], nil
	}
	if s.Cfg.Mutant == config.ReplayWithoutUser {
		// The bug: fall back to the latest earlier user message.
		for i := len(msgs) - 1; i >= 0; i-- {
			if Usable(msgs[i]) {
				return msgs[i], nil
			}
		}
	}
	if len(msgs) == 0 {
		return openai.Message{}, errors.New("no new user message: messages is empty")
	}
	last := msgs[len(msgs)-1]
	if last.Role != openai.RoleUser {
		return openai.Message{}, fmt.Errorf("no new user message: the last message has role %q; send the new user message last", last.Role)
	}
	return openai.Message{}, errors.New("no new user message: the last user message is blank")
}

// Usable reports whether m can be a turn's new user message: a user
// message that is not blank.
func Usable(m openai.Message) bool {
	return m.Role == openai.RoleUser && strings.TrimSpace(string(m.Content)) != ""
}
