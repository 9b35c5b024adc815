package sut

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strings"
	"time"
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

// errBodyTimeout is a body that did not arrive within BodyTimeout.
var errBodyTimeout = errors.New("request body timed out")

// checkContentType refuses a body that says it is not JSON. A missing
// Content-Type is let through: a browser's POST always carries an Origin,
// which checkOrigin judges, and OpenAI-compatible clients that leave the
// header out still get served. A present one that is not application/json
// (text/plain, a form) is what a browser's simple request sends.
func checkContentType(r *http.Request) error {
	vals := r.Header.Values("Content-Type")
	if len(vals) == 0 {
		return nil
	}
	if len(vals) > 1 {
		return errors.New("more than one Content-Type header; send Content-Type: application/json")
	}
	mt, _, err := mime.ParseMediaType(vals[0])
	if err != nil || mt != "application/json" {
		return fmt.Errorf("Content-Type %.64q: send Content-Type: application/json", vals[0])
	}
	return nil
}

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

// readBody reads the request's body, within MaxBodyBytes and the body
// deadline ServeHTTP set. Once the whole body is in, it lifts that
// deadline: from then on the connection's only read is net/http's watch
// for the client going away, which must last as long as the turn does.
// Its error is an *http.MaxBytesError, errBodyTimeout, or the read's.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, errBodyTimeout
	}
	if err != nil {
		return nil, err
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	return body, nil
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
func (s *Server) newUserMessage(msgs []openai.Message) (openai.Message, error) {
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
