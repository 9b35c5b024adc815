// Package sessions is the adapter of the sessions API (POST /api/sessions,
// POST /api/sessions/{session}/agent/{agent}).
package sessions

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/store"
	"github.com/turncheck/turncheck/sut/internal/turn"
)

// The sessions API, shaped like docker-agent's `serve api`: a client
// creates a session (POST /api/sessions), then sends each turn to
// POST /api/sessions/{session}/agent/{agent} as an array of messages, the
// new user message last. A session is a conversation scoped by the API
// key, under a namespace of its own (nsSession), with chat's turn
// machinery: its lock and concurrency policy, its agent binding (the
// session's first turn records the agent's source key; later turns resume
// with it, T8), durability and interruption policy. The answer is always
// an event stream of data lines.

// Path is the sessions API's root.
const Path = "/api/sessions"

// sessionEvent is one event of a session turn's stream.
type sessionEvent struct {
	Type    string `json:"type"`
	Content string `json:"content,omitempty"`
	Error   string `json:"error,omitempty"`
}

// CreateSession serves POST /api/sessions: a new empty session of the
// key, stored durably before its id is answered (201 {"id"}). The body is
// empty or a JSON object, whose members are ignored.
func (s *Handler) CreateSession(w http.ResponseWriter, r *http.Request) {
	s.Gate.AdmitHTTP(w, r, nil, func(scope string, body []byte) {
		if len(bytes.TrimSpace(body)) > 0 {
			if _, err := turn.DecodeObject(body, "{} or no body"); err != nil {
				openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
				return
			}
		}
		id := turn.NewID("")
		if err := s.Store.CreateSession(store.Key{Scope: scope, ID: turn.NsSession + id}); err != nil {
			if store.StoreFull(err) {
				s.StoreFullRefusal(err, "no session was created").Write(w)
				return
			}
			s.Log.Error("create session", "err", err)
			openai.WriteError(w, http.StatusInternalServerError, "server_error", "the session could not be created")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(turn.MustJSON(map[string]string{"id": id}))
	})
}

// TurnPath returns the session and the agent that the path of a
// session turn names (/api/sessions/{session}/agent/{agent}, each segment
// path-escaped), or false if u is no such path.
func TurnPath(u *url.URL) (session, agent string, ok bool) {
	rest, ok := strings.CutPrefix(u.EscapedPath(), Path+"/")
	if !ok {
		return "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || parts[1] != "agent" {
		return "", "", false
	}
	session, err := url.PathUnescape(parts[0])
	if err != nil {
		return "", "", false
	}
	agent, err = url.PathUnescape(parts[2])
	if err != nil || turn.CheckID("session id", session) != nil || agent == "" {
		return "", "", false
	}
	return session, agent, true
}

// SessionTurn serves POST /api/sessions/{session}/agent/{agent}: one turn
// of session with the agent named as chat's "model" names it.
func (s *Handler) SessionTurn(w http.ResponseWriter, r *http.Request, session, agent string) {
	s.Gate.AdmitHTTP(w, r, nil, func(scope string, body []byte) {
		msgs, err := decodeSessionMessages(body)
		if err != nil {
			openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		user, err := s.NewUserMessage(msgs)
		input := turn.UserInput(user)
		switch {
		case err != nil && s.Cfg.Mutant == config.SessionEmptyRuns && !slices.ContainsFunc(msgs, turn.Usable):
			// The bug: no usable message appends nothing, and the turn
			// runs on the session as it is.
			input = nil
		case err != nil:
			openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		t := &turn.Turn{Key: store.Key{Scope: scope, ID: turn.NsSession + session}, Proto: config.ProtoSessions}
		switch found, err := s.Store.SessionExists(r.Context(), t.Key); {
		case err != nil:
			t.Release = func() {}
			s.Refuse(r.Context(), turn.NewHTTP(w), t, err)
			return
		case !found:
			openai.WriteError(w, http.StatusNotFound, "not_found", "no such session: create one with POST "+Path)
			return
		}
		s.Converse(r.Context(), turn.NewHTTP(w), t, input, agent, sessionResponder{})
	})
}

// decodeSessionMessages reads a session turn's body: a JSON array of
// messages (decodeItems), in valid UTF-8, with nothing after it.
func decodeSessionMessages(body []byte) ([]openai.Message, error) {
	var raw json.RawMessage
	if err := turn.DecodeStrict(body, &raw, `a JSON array of {"role","content"} messages, the new user message last`); err != nil {
		return nil, err
	}
	return turn.DecodeItems(raw, "messages")
}

// sessionResponder answers a session turn: always an event stream, open
// from the turn's start, of agent_choice events, then stream_stopped once
// the commit is durable, or error.
type sessionResponder struct{}

// Begin is called before the turn's first model call.
func (sessionResponder) Begin(o *turn.Output) { o.Open() }

// Started is called once the model first answered.
func (sessionResponder) Started(*turn.Output) {}

// Delta relays a piece of the reply's text.
func (sessionResponder) Delta(o *turn.Output, text string) {
	o.Write("", string(turn.MustJSON(sessionEvent{Type: "agent_choice", Content: text})))
}

// Succeeded answers a turn that ended ok, once its commit is durable.
func (sessionResponder) Succeeded(o *turn.Output, _ string) {
	o.Write("", string(turn.MustJSON(sessionEvent{Type: "stream_stopped"})))
}

// Failed reports a failure on the open stream.
func (sessionResponder) Failed(o *turn.Output, _, msg string) {
	o.Write("", string(turn.MustJSON(sessionEvent{Type: "error", Error: msg})))
}

// Handler serves the sessions API over the engine.
type Handler struct{ *turn.Engine }
