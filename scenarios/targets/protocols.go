package targets

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Protocol is the client protocol through which a server keeps a
// conversation: how a conversation and a turn are named on the wire.
type Protocol string

// The protocols turncheck speaks.
const (
	// Chat is POST /v1/chat/completions with the conversation named by a
	// header; the zero value.
	Chat Protocol = "chat"
	// Responses is the OpenAI Responses API: POST /v1/responses, each turn
	// chained to the last one by previous_response_id.
	Responses Protocol = "responses"
	// Sessions is a session API the profile describes (SessionsAPI): a
	// session is created, then turns run in it.
	Sessions Protocol = "sessions"
	// ACP is the Agent Client Protocol: the server is an agent the
	// harness starts as a child process and drives with JSON-RPC over its
	// stdin and stdout; a conversation is a session (session/new), a turn
	// a session/prompt.
	ACP Protocol = "acp"
)

// SessionsAPI describes a session API: how a session is created, how a turn
// runs in it, and how the turn's event stream says how it ended. Its
// templates take {session} (the id the create call returned), {agent} (the
// profile's model), {source} (the agent reference the session was created
// under: the first the server loaded then, which a session keeps naming
// after a restart that loads others; in a path it is escaped as a query
// value is, the way docker-agent keys a URL source), {message} (the new
// user message's text, as a JSON string) and {messages} (the turn's
// messages, as a JSON array of role and content).
type SessionsAPI struct {
	// Create is the call that creates a session; ID is where the session's
	// id is in its JSON answer (a top-level field name).
	Create Call   `yaml:"create"`
	ID     string `yaml:"id"`
	// Turn is the call that runs one turn in a session.
	Turn Call `yaml:"turn"`
	// Events says how the turn's event stream is read.
	Events EventRules `yaml:"events"`
	// Input says what the server makes of a turn's messages: "appended"
	// (every one is appended to the session, as docker-agent's serve api
	// does; the default) or "last" (the last is the new user message and
	// the rest are ignored, as under chat). It decides the continuations
	// without a new user message the client sends (T3).
	Input string `yaml:"input"`
}

// The values of SessionsAPI.Input.
const (
	InputAppended = "appended"
	InputLast     = "last"
)

// Call is one HTTP call of a session API.
type Call struct {
	Method string `yaml:"method"`
	// Path is the path on the server, with placeholders.
	Path string `yaml:"path"`
	// Body is the JSON body, with placeholders; "" sends none.
	Body string `yaml:"body"`
}

// EventRules say how a turn's event stream is read: every event is a JSON
// object whose TypeField names its type. A field may be nested: its path
// joins names of object fields and indexes of arrays by dots
// ("message.content.0.text").
type EventRules struct {
	// TypeField is the field that names an event's type; "" means "type".
	TypeField string `yaml:"type_field"`
	// Text is the type of the events that carry reply text, in TextField.
	Text      string `yaml:"text"`
	TextField string `yaml:"text_field"`
	// Done are the types that end a turn that succeeded; Failure those
	// that end one that failed, with its message in ErrorField.
	Done       []string `yaml:"done"`
	Failure    []string `yaml:"failure"`
	ErrorField string   `yaml:"error_field"`
}

// NamesSource reports whether a call of the API names the agent source
// ({source}).
func (a *SessionsAPI) NamesSource() bool {
	for _, t := range []string{a.Create.Path, a.Create.Body, a.Turn.Path, a.Turn.Body} {
		if strings.Contains(t, "{source}") {
			return true
		}
	}
	return false
}

// check says what is wrong with the description, nil if nothing.
func (a *SessionsAPI) check() error {
	for name, c := range map[string]*Call{"create": &a.Create, "turn": &a.Turn} {
		if c.Method == "" {
			c.Method = http.MethodPost
		}
		if !slices.Contains([]string{http.MethodPost, http.MethodPut}, c.Method) {
			return fmt.Errorf("%s.method: %q; want POST or PUT", name, c.Method)
		}
		if !strings.HasPrefix(c.Path, "/") {
			return fmt.Errorf("%s.path: %q must start with /", name, c.Path)
		}
	}
	switch {
	case a.ID == "":
		return errors.New("id: name the field of the create call's answer that holds the session's id")
	case !strings.Contains(a.Turn.Path, "{session}"):
		return errors.New("turn.path: must contain {session}, or the turn runs in no session")
	case !strings.Contains(a.Turn.Body, "{message}") && !strings.Contains(a.Turn.Body, "{messages}"):
		return errors.New("turn.body: must contain {message} or {messages}, or the turn carries no user message")
	case len(a.Events.Done) == 0:
		return errors.New("events.done: name the event types that end a turn that succeeded")
	case a.Events.Text == "" || a.Events.TextField == "":
		return errors.New("events.text and events.text_field: name the events that carry the reply and their field")
	}
	if a.Events.TypeField == "" {
		a.Events.TypeField = "type"
	}
	switch a.Input {
	case "":
		a.Input = InputAppended
	case InputAppended, InputLast:
	default:
		return fmt.Errorf("input: %q; want %s (every message of a turn is appended to the session) or %s (only the last is the new user message)",
			a.Input, InputAppended, InputLast)
	}
	return nil
}
