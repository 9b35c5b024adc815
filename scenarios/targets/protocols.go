package targets

import (
	"cmp"
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
	// A2A is the Agent2Agent protocol: JSON-RPC 2.0 over HTTP, a turn a
	// message/stream (or message/send) that starts a task in a context;
	// a conversation is a context (A2AAPI).
	A2A Protocol = "a2a"
)

// ProtocolInfo is one protocol turncheck speaks: its name, what it is,
// and the rules by which it is judged where they differ from chat's.
type ProtocolInfo struct {
	Name Protocol
	// Says what it is, in a few words, for a help text.
	Says string
	// Refusal says how the protocol refuses a request, where its
	// refusals carry no HTTP status: then any failure of a request
	// without a usable message, before any model call, refuses it (T3;
	// model.Turn.AnyRefusal). "" for a protocol that refuses with 400,
	// as chat does.
	Refusal string
	// Unusable names, in the protocol's words, the requests without a
	// usable message that a protocol whose request carries one message
	// (its last user message's text, and nothing else) can send: one with
	// no content at all, one whose only content is blank, and, where the
	// protocol has tasks that end (A2A), one that names the conversation's
	// finished task, carrying its message again. Empty for a protocol
	// whose request carries a list of messages.
	Unusable []string
}

// Protocols are the protocols turncheck speaks, in the order every list a
// person reads gives them: the one registry that help texts, error
// messages and the documents' lists (tested) derive theirs from, so that
// a protocol added here is named everywhere.
var Protocols = []ProtocolInfo{
	{Chat, "POST /v1/chat/completions under a conversation header (default)", "", nil},
	{Responses, "the OpenAI Responses API, chained by previous_response_id", "", nil},
	{Sessions, "a session API the profile describes (create, then turns)", "", nil},
	{ACP, "the Agent Client Protocol: an agent driven over its stdio", "a JSON-RPC error, or stopReason refusal",
		[]string{"a prompt without content blocks", "a prompt of one blank text block"}},
	{A2A, "the Agent2Agent protocol: JSON-RPC, a context per conversation", "a JSON-RPC error, or a task rejected or failed before any model call",
		[]string{"a message without parts", "a message of one blank text part",
			"a message naming its conversation's finished task, with that task's message again"}},
}

// Info is p's entry of the registry; chat's for "" (the default), and a
// bare one, judged as chat, for a name it does not hold.
func (p Protocol) Info() ProtocolInfo {
	for _, info := range Protocols {
		if info.Name == cmp.Or(p, Chat) {
			return info
		}
	}
	return ProtocolInfo{Name: p}
}

// ProtocolNames lists the protocols' names for a sentence: "chat,
// responses, sessions, acp or a2a".
func ProtocolNames() string {
	names := make([]string, len(Protocols))
	for i, p := range Protocols {
		names[i] = string(p.Name)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// ParseProtocol is the protocol named s; an error that lists them for any
// other.
func ParseProtocol(s string) (Protocol, error) {
	for _, p := range Protocols {
		if string(p.Name) == s {
			return p.Name, nil
		}
	}
	return "", fmt.Errorf("%q; want %s", s, ProtocolNames())
}

// ProtocolsHelp is one line per protocol, its name and what it says, each
// after indent: the list a help text shows.
func ProtocolsHelp(indent string) string {
	var b strings.Builder
	for _, p := range Protocols {
		fmt.Fprintf(&b, "%s%-10s %s\n", indent, p.Name, p.Says)
	}
	return b.String()
}

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

// ResponsesAPI is what a Responses API server declares of its semantics,
// where servers differ (profiles/README.md, "responses"): each is judged
// as strictly as the default.
type ResponsesAPI struct {
	// Chain says how a turn chained by previous_response_id continues:
	// "tree" (the default, OpenAI's: from the response named, so that two
	// turns chained from one response start two branches) or "line" (on
	// the conversation line the response named belongs to, as openclaw
	// reuses the response's session: turns chained from one response run
	// on one line, judged as a chat conversation's, by the concurrency
	// policy).
	Chain string `yaml:"chain"`
	// NamedBy is how a conversation may be named apart from chaining, one
	// conversation in four then named so: "conversation" (the
	// conversation parameter), "user" (the user field), "header" (the
	// header Header names); "" for none: chaining only.
	NamedBy string `yaml:"named_by"`
	Header  string `yaml:"header"`
	// UnknownPrevious is what a previous_response_id the server does not
	// hold gets: "not-found" (the default: 404, or 400
	// previous_response_not_found) or "new" (a new, empty conversation,
	// answered 200). Under new, a turn that chains from a response the
	// server may not hold (one whose outcome the client never learned, a
	// failed one, one not stored) would run on nothing, which cannot be
	// told from a conversation lost: the client chains only from
	// responses that completed.
	UnknownPrevious string `yaml:"unknown_previous"`
	// StoreFalse is what store: false does: "honoured" (the default: the
	// response is no base) or "ignored" (it is stored all the same, as
	// openclaw documents): the client then never sends it.
	StoreFalse string `yaml:"store_false"`
	// IDsSurvive says whether response ids survive a restart, apart from
	// the conversations (nil: they do; openclaw keeps them in memory).
	// Without, a conversation only chained is over at a restart: the
	// client goes on only with those it names (NamedBy).
	IDsSurvive *bool `yaml:"ids_survive_restart"`
}

// The values of the ResponsesAPI fields.
const (
	ChainTree       = "tree"
	ChainLine       = "line"
	NamedByConv     = "conversation"
	NamedByUser     = "user"
	NamedByHeader   = "header"
	UnknownNotFound = "not-found"
	UnknownNew      = "new"
	StoreHonoured   = "honoured"
	StoreIgnored    = "ignored"
)

// pick sets *v, field's value, to the first of values where it is
// empty, and says what is wrong with one that is none of them.
func pick(field string, v *string, values ...string) error {
	if *v == "" {
		*v = values[0]
	}
	if !slices.Contains(values, *v) {
		return fmt.Errorf("%s: %q; want %s", field, *v, strings.Join(values, " or "))
	}
	return nil
}

// check fills in a's defaults and says what is wrong with it, nil if
// nothing.
func (a *ResponsesAPI) check() error {
	if err := errors.Join(
		pick("chain", &a.Chain, ChainTree, ChainLine),
		pick("unknown_previous", &a.UnknownPrevious, UnknownNotFound, UnknownNew),
		pick("store_false", &a.StoreFalse, StoreHonoured, StoreIgnored),
	); err != nil {
		return err
	}
	switch a.NamedBy {
	case "", NamedByConv, NamedByUser:
		if a.Header != "" {
			return errors.New("header: names the header a conversation is named by; say named_by: header")
		}
	case NamedByHeader:
		if !validHeader(a.Header) {
			return fmt.Errorf("header: %q; named_by: header needs the header's name", a.Header)
		}
	default:
		return fmt.Errorf("named_by: %q; want conversation, user or header, or nothing (chaining only)", a.NamedBy)
	}
	return nil
}

// Branches reports whether turns chained from one response start branches
// (the tree a chain is by default).
func (a *ResponsesAPI) Branches() bool { return a == nil || a.Chain != ChainLine }

// ChainsFromAny reports whether the client may chain from a response the
// server may not hold (its outcome unknown, failed, not stored).
func (a *ResponsesAPI) ChainsFromAny() bool { return a == nil || a.UnknownPrevious != UnknownNew }

// StoresAll reports whether the server stores a response whose request
// said store: false.
func (a *ResponsesAPI) StoresAll() bool { return a != nil && a.StoreFalse == StoreIgnored }

// IDsSurviveRestart reports whether response ids outlive a restart.
func (a *ResponsesAPI) IDsSurviveRestart() bool {
	return a == nil || a.IDsSurvive == nil || *a.IDsSurvive
}

// Naming is how a conversation may be named apart from chaining, "" for
// none.
func (a *ResponsesAPI) Naming() string {
	if a == nil {
		return ""
	}
	return a.NamedBy
}

// A2AAPI is what an A2A agent declares where the Agent2Agent protocol
// leaves it to the agent (PROTOCOL.md, "The Agent2Agent protocol"): each is
// judged as strictly as the default.
type A2AAPI struct {
	// Path is where the agent takes JSON-RPC ("/invoke"); "" reads it from
	// the url of its agent card (/.well-known/agent-card.json).
	Path string `yaml:"path"`
	// ContextIDs says who names a context: "server" (the default: a
	// conversation's first message goes without a contextId, and the
	// agent's answer gives it) or "client" (the client names each
	// context from its first message, as many agents accept).
	ContextIDs string `yaml:"context_ids"`
	// DroppedStream says what a client that drops a task's stream does to
	// the task: "runs-on" (the default: A2A tasks outlive their
	// connection, so the task runs to its end, an unknown outcome, whole
	// or nothing) or "cancels" (the agent cancels the task as it would on
	// tasks/cancel: an interrupted turn, judged by the interruption
	// policy). tasks/cancel is the client's explicit abort under both.
	DroppedStream string `yaml:"dropped_stream"`
}

// The values of the A2AAPI fields.
const (
	ContextsServer = "server"
	ContextsClient = "client"
	DroppedRunsOn  = "runs-on"
	DroppedCancels = "cancels"
)

// check fills in a's defaults and says what is wrong with it, nil if
// nothing.
func (a *A2AAPI) check() error {
	if a.Path != "" && !strings.HasPrefix(a.Path, "/") {
		return fmt.Errorf("path: %q must start with /", a.Path)
	}
	return errors.Join(
		pick("context_ids", &a.ContextIDs, ContextsServer, ContextsClient),
		pick("dropped_stream", &a.DroppedStream, DroppedRunsOn, DroppedCancels),
	)
}

// ClientNamesContexts reports whether the client names each context.
func (a *A2AAPI) ClientNamesContexts() bool { return a != nil && a.ContextIDs == ContextsClient }

// DropRunsOn reports whether a task runs on once its client dropped the
// stream (the default).
func (a *A2AAPI) DropRunsOn() bool { return a == nil || a.DroppedStream != DroppedCancels }
