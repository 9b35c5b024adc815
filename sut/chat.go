package sut

import (
	"net/http"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/store"
)

// chat serves POST /v1/chat/completions.
func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var id string
	check := func() (err error) {
		id, err = s.conversationID(r)
		return err
	}
	s.gate.AdmitHTTP(w, r, check, func(scope string, body []byte) { s.chatTurn(w, r, scope, id, body) })
}

// chatTurn runs the turn of an admitted chat request: on conversation id
// of scope, or stateless when id is "".
func (s *Server) chatTurn(w http.ResponseWriter, r *http.Request, scope, id string, body []byte) {
	req, err := decodeRequest(body)
	if err != nil {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	user, err := s.newUserMessage(req.Messages)
	if err != nil {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	resp := s.newChatResponder(req)
	if id != "" {
		key := store.Key{Scope: scope, ID: id}
		if s.cfg.Mutant == config.CrossKeyLeak {
			key.Scope = ""
		}
		s.converse(r.Context(), NewHTTP(w), &turn{key: key, proto: config.ProtoChat}, userInput(user), req.Model, resp)
		return
	}
	// Stateless: the array is the whole history.
	if err := s.checkHistory(store.Wrap(req.Messages[:len(req.Messages)-1]), userInput(user)); err != nil {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	s.run(r.Context(), NewHTTP(w), &turn{proto: config.ProtoChat, release: func() {}, work: &store.Conversation{Messages: store.Wrap(req.Messages)}}, resp)
}
