package sut

import (
	"errors"
	"fmt"
	"net/http"
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

// conversationID returns the request's conversation id, "" for a stateless
// request. A request that names two (two headers) or an id that is not one
// (empty, too long, not UTF-8, control characters) is refused: a proxy and
// the server must not disagree on which conversation a turn is for.
func (s *Server) conversationID(r *http.Request) (string, error) {
	vals := r.Header.Values(s.cfg.ConversationHeader)
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("more than one %s header: a request is a turn of one conversation", s.cfg.ConversationHeader)
	}
	id := vals[0]
	if strings.TrimSpace(id) == "" {
		return "", fmt.Errorf("%s is empty: name the conversation, or leave the header out for a stateless turn", s.cfg.ConversationHeader)
	}
	return id, checkID("conversation id", id)
}

// checkID refuses an id a client gives (what it names) that is not one:
// blank, too long, not UTF-8, or with control characters, which the
// server keeps for the namespaces of its protocols (nsResponse).
func checkID(what, id string) error {
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

// decodeRequest parses a chat request strictly (openai.DecodeChatRequest)
// and checks its fields against the server's bounds.
func decodeRequest(body []byte) (*openai.ChatRequest, error) {
	req, err := openai.DecodeChatRequest(body)
	if err != nil {
		return nil, err
	}
	if len(req.Model) > MaxModelBytes {
		return nil, fmt.Errorf(`"model" is over %d bytes`, MaxModelBytes)
	}
	if len(req.Messages) > MaxMessages {
		return nil, fmt.Errorf(`"messages" has over %d messages`, MaxMessages)
	}
	for i, m := range req.Messages {
		switch m.Role {
		case openai.RoleSystem, openai.RoleUser, openai.RoleAssistant, openai.RoleTool:
		default:
			return nil, fmt.Errorf("messages[%d]: unknown role %.32q (want system, user, assistant or tool)", i, m.Role)
		}
		if len(m.Content) > MaxContentBytes {
			return nil, fmt.Errorf("messages[%d].content is over %d bytes", i, MaxContentBytes)
		}
	}
	return req, nil
}

// newUserMessage returns the request's usable new user message: the last
// element of the array, with role user and non-blank content. Nothing else
// in the array is ever used, so an older message cannot be replayed (T3).
func (s *engine) newUserMessage(msgs []openai.Message) (openai.Message, error) {
	if n := len(msgs); n > 0 && usable(msgs[n-1]) {
		return msgs[n-1], nil
	}
	if s.cfg.Mutant == config.ReplayWithoutUser {
		// The bug: fall back to the latest earlier user message.
		for i := len(msgs) - 1; i >= 0; i-- {
			if usable(msgs[i]) {
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

func usable(m openai.Message) bool {
	return m.Role == openai.RoleUser && strings.TrimSpace(string(m.Content)) != ""
}
