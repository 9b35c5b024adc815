// Package chat is the adapter of the OpenAI chat completions endpoint
// (POST /v1/chat/completions).
package chat

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/store"
	"github.com/turncheck/turncheck/sut/internal/turn"
)

// Chat serves POST /v1/chat/completions.
func (s *Handler) Chat(w http.ResponseWriter, r *http.Request) {
	var id string
	check := func() (err error) {
		id, err = s.conversationID(r)
		return err
	}
	s.Gate.AdmitHTTP(w, r, check, func(scope string, body []byte) { s.chatTurn(w, r, scope, id, body) })
}

// chatTurn runs the turn of an admitted chat request: on conversation id
// of scope, or stateless when id is "".
func (s *Handler) chatTurn(w http.ResponseWriter, r *http.Request, scope, id string, body []byte) {
	req, err := decodeRequest(body)
	if err != nil {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	user, err := s.NewUserMessage(req.Messages)
	if err != nil {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	resp := s.newChatResponder(req)
	if id != "" {
		key := store.Key{Scope: scope, ID: id}
		if s.Cfg.Mutant == config.CrossKeyLeak {
			key.Scope = ""
		}
		s.Converse(r.Context(), turn.NewHTTP(w), &turn.Turn{Key: key, Proto: config.ProtoChat}, turn.UserInput(user), req.Model, resp)
		return
	}
	// Stateless: the array is the whole history.
	if err := s.CheckHistory(store.Wrap(req.Messages[:len(req.Messages)-1]), turn.UserInput(user)); err != nil {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	s.Run(r.Context(), turn.NewHTTP(w), &turn.Turn{Proto: config.ProtoChat, Release: func() {}, Work: &store.Conversation{Messages: store.Wrap(req.Messages)}}, resp)
}

// chatResponder answers a chat turn: a chat.completion object, or a stream
// of chat.completion.chunk objects closed by [DONE].
type chatResponder struct {
	id      string
	created int64
	model   string
	stream  bool
}

// newChatResponder returns the responder of chat request req.
func (s *Handler) newChatResponder(req *openai.ChatRequest) *chatResponder {
	model := req.Model
	if model == "" {
		model = s.Cfg.ModelName
	}
	return &chatResponder{id: "chatcmpl-" + strconv.FormatInt(s.IDs.Add(1), 10), created: time.Now().Unix(),
		model: model, stream: req.Stream}
}

// Begin does nothing: a chat stream opens when the model has answered, so
// that a model that fails at once is a status.
func (c *chatResponder) Begin(*turn.Output) {}

// Started is called once the model first answered.
func (c *chatResponder) Started(o *turn.Output) {
	if c.stream {
		o.Open()
		o.Write("", openai.Encode(c.chunk(openai.Delta{Role: openai.RoleAssistant}, nil)))
	}
}

// Delta relays a piece of the reply's text.
func (c *chatResponder) Delta(o *turn.Output, text string) {
	if c.stream {
		o.Write("", openai.Encode(c.chunk(openai.Delta{Content: text}, nil)))
	}
}

// Succeeded answers a turn that ended ok, once its commit is durable.
func (c *chatResponder) Succeeded(o *turn.Output, reply string) {
	if o.Streaming() {
		o.Write("", openai.Encode(c.chunk(openai.Delta{}, openai.Ptr(openai.FinishStop))))
		o.Write("", openai.DoneSentinel)
		return
	}
	o.JSON(http.StatusOK, openai.Encode(openai.Completion{
		ID: c.id, Object: openai.ObjectCompletion, Created: c.created, Model: c.model,
		Choices: []openai.Choice{{
			Message:      &openai.Message{Role: openai.RoleAssistant, Content: openai.Content(reply)},
			FinishReason: openai.Ptr(openai.FinishStop),
		}},
	}))
}

// Failed writes an error chunk, then [DONE].
func (c *chatResponder) Failed(o *turn.Output, typ, msg string) {
	o.Write("", openai.Encode(openai.Completion{Object: openai.ObjectChunk, Choices: []openai.Choice{},
		Error: &openai.ErrorDetail{Message: msg, Type: typ}}))
	o.Write("", openai.DoneSentinel)
}

func (c *chatResponder) chunk(d openai.Delta, finish *string) openai.Completion {
	return openai.Completion{ID: c.id, Object: openai.ObjectChunk, Created: c.created, Model: c.model,
		Choices: []openai.Choice{{Delta: &d, FinishReason: finish}}}
}

// conversationID returns the request's conversation id, "" for a stateless
// request. A request that names two (two headers) or an id that is not one
// (empty, too long, not UTF-8, control characters) is refused: a proxy and
// the server must not disagree on which conversation a turn is for.
func (s *Handler) conversationID(r *http.Request) (string, error) {
	vals := r.Header.Values(s.Cfg.ConversationHeader)
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("more than one %s header: a request is a turn of one conversation", s.Cfg.ConversationHeader)
	}
	id := vals[0]
	if strings.TrimSpace(id) == "" {
		return "", fmt.Errorf("%s is empty: name the conversation, or leave the header out for a stateless turn", s.Cfg.ConversationHeader)
	}
	return id, turn.CheckID("conversation id", id)
}

// decodeRequest parses a chat request strictly (openai.DecodeChatRequest)
// and checks its fields against the server's bounds.
func decodeRequest(body []byte) (*openai.ChatRequest, error) {
	req, err := openai.DecodeChatRequest(body)
	if err != nil {
		return nil, err
	}
	if len(req.Model) > turn.MaxModelBytes {
		return nil, fmt.Errorf(`"model" is over %d bytes`, turn.MaxModelBytes)
	}
	if len(req.Messages) > turn.MaxMessages {
		return nil, fmt.Errorf(`"messages" has over %d messages`, turn.MaxMessages)
	}
	for i, m := range req.Messages {
		switch m.Role {
		case openai.RoleSystem, openai.RoleUser, openai.RoleAssistant, openai.RoleTool:
		default:
			return nil, fmt.Errorf("messages[%d]: unknown role %.32q (want system, user, assistant or tool)", i, m.Role)
		}
		if len(m.Content) > turn.MaxContentBytes {
			return nil, fmt.Errorf("messages[%d].content is over %d bytes", i, turn.MaxContentBytes)
		}
	}
	return req, nil
}

// Handler serves the chat completions endpoint over the engine.
type Handler struct{ *turn.Engine }
