package turn

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/turncheck/turncheck/internal/openai"
)

// The protocols besides chat keep their histories in the store and the
// cache beside chat's conversations, as conversations of ids in namespaces
// of their own. A chat conversation id has no control character
// (conversationID), so no chat id can start with one of these prefixes,
// and none of them is a prefix of another: a Responses conversation named
// "x", a response "resp_x", a session "x", an A2A context "x" and a chat
// conversation "x" are five histories.
const (
	// NsResponse holds each stored response: its whole history, up to
	// and including its own output.
	NsResponse = "\x1eresponse:"
	// NsResponseConversation holds the conversations of Responses
	// requests in conversation mode.
	NsResponseConversation = "\x1econversation:"
	// NsSession holds the sessions of the sessions API.
	NsSession = "\x1esession:"
	// NsResponseLine holds the lines of responses under Config.ResponsesLine.
	NsResponseLine = "\x1eline:"
	// NsContext holds the contexts of the Agent2Agent protocol.
	NsContext = "\x1econtext:"
)

// NewID returns prefix and 16 random bytes in hex: an id that no client can
// guess.
func NewID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return prefix + hex.EncodeToString(b[:])
}

// DecodeObject decodes body as one JSON object, read strictly as chat's
// is (openai.DecodeStrict: valid UTF-8, no key twice in any object,
// nothing after it), into its members. Unknown members are the caller's
// to ignore; a name matched exactly, never by case, is the member.
func DecodeObject(body []byte, want string) (map[string]json.RawMessage, error) {
	var top map[string]json.RawMessage
	if err := DecodeStrict(body, &top, "a JSON object: "+want); err != nil {
		return nil, err
	}
	if top == nil {
		return nil, fmt.Errorf("the body must be a JSON object: %s", want)
	}
	return top, nil
}

// DecodeStrict decodes a request's body into v by the one reading every
// API of the server shares (openai.DecodeStrict): its error says what is
// malformed, or that the body must be want.
func DecodeStrict(body []byte, v any, want string) error {
	err := openai.DecodeStrict(body, v)
	var strict *openai.StrictError
	switch {
	case errors.As(err, &strict):
		return strict
	case err != nil:
		return fmt.Errorf("the body must be %s", want)
	}
	return nil
}

// Member decodes top[name] into v unless it is missing or null, and
// reports whether it was there; a value of another JSON type is an error
// that says what was wanted, in terms of the JSON.
func Member(top map[string]json.RawMessage, name string, v any, want string) (bool, error) {
	raw, ok := top[name]
	if !ok || IsNullJSON(raw) {
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return false, fmt.Errorf("%q: want %s", name, want)
	}
	return true, nil
}

// IsNullJSON reports whether raw is JSON null.
func IsNullJSON(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// ValidRPCID reports whether id, a JSON-RPC call's id as it came, is one
// JSON-RPC allows: a string, a number or null (A2A's and ACP's calls).
func ValidRPCID(id json.RawMessage) bool {
	if IsNullJSON(id) {
		return true
	}
	switch c := bytes.TrimSpace(id); {
	case len(c) == 0:
		return false
	case c[0] == '"', c[0] == '-', c[0] >= '0' && c[0] <= '9':
		return true
	}
	return false
}

// DecodeItems decodes an array of input items, as the Responses API's
// "input" array and the sessions API's body are: each a message, an
// object with a "role" and a "content" that is a string or an array of
// text parts ({"type":"input_text"|"output_text"|"text","text":...}); or,
// as the Responses API has them, a client tool's call ({"type":
// "function_call","call_id","name","arguments"}), read as an assistant
// message that asks for it, or its output ({"type":
// "function_call_output","call_id","output"}), read as the tool message
// that answers it. An item of any other "type" is kept as a message
// without role: it can never be the new user message. where names the
// array in errors. The items are bounded as chat's messages are.
func DecodeItems(raw json.RawMessage, where string) ([]openai.Message, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || items == nil {
		return nil, fmt.Errorf(`%s: want an array of {"role","content"} items`, where)
	}
	if len(items) > MaxMessages {
		return nil, fmt.Errorf("%s has over %d items", where, MaxMessages)
	}
	out := make([]openai.Message, len(items))
	for i, item := range items {
		m, err := decodeItem(item)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]%s", where, i, err)
		}
		out[i] = m
	}
	return out, nil
}

// decodeItem decodes one input item; its errors start with the path
// inside it, for the caller to prefix.
func decodeItem(raw json.RawMessage) (openai.Message, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return openai.Message{}, errors.New(`: want an object {"role","content"}`)
	}
	var typ string
	if _, err := Member(obj, "type", &typ, "a string"); err != nil {
		return openai.Message{}, fmt.Errorf(".%v", err)
	}
	switch typ {
	case "", "message":
	case "function_call", "function_call_output":
		return decodeToolItem(obj, typ)
	default:
		return openai.Message{}, nil
	}
	var m openai.Message
	if _, err := Member(obj, "role", &m.Role, "a string"); err != nil {
		return openai.Message{}, fmt.Errorf(".%v", err)
	}
	content, err := decodeItemContent(obj["content"])
	if err != nil {
		return openai.Message{}, fmt.Errorf(".content%v", err)
	}
	if len(content) > MaxContentBytes {
		return openai.Message{}, fmt.Errorf(".content is over %d bytes", MaxContentBytes)
	}
	m.Content = openai.Content(content)
	return m, nil
}

// decodeToolItem decodes a client tool's call or output (decodeItems).
func decodeToolItem(obj map[string]json.RawMessage, typ string) (openai.Message, error) {
	var call openai.FunctionCall
	var id, output string
	for _, f := range []struct {
		name string
		v    *string
		want bool
	}{
		{"call_id", &id, true},
		{"name", &call.Name, typ == "function_call"},
		{"arguments", &call.Arguments, typ == "function_call"},
		{"output", &output, typ == "function_call_output"},
	} {
		if !f.want {
			continue
		}
		if ok, err := Member(obj, f.name, f.v, "a string"); err != nil || !ok {
			return openai.Message{}, fmt.Errorf(".%s: want a string, in a %s item", f.name, typ)
		}
	}
	if err := CheckID(".call_id", id); err != nil {
		return openai.Message{}, err
	}
	if len(call.Arguments)+len(output) > MaxContentBytes {
		return openai.Message{}, fmt.Errorf(": a %s item over %d bytes", typ, MaxContentBytes)
	}
	if typ == "function_call" {
		return openai.Message{Role: openai.RoleAssistant, ToolCalls: []openai.ToolCall{{ID: id, Type: openai.TypeFunction, Function: call}}}, nil
	}
	return openai.Message{Role: openai.RoleTool, ToolCallID: id, Content: openai.Content(output)}, nil
}

// decodeItemContent decodes an item's content: a string, null or missing
// (blank), or an array of text parts, joined.
func decodeItemContent(raw json.RawMessage) (string, error) {
	if raw == nil || IsNullJSON(raw) {
		return "", nil
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return text, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New(": want a string or an array of text parts")
	}
	var b bytes.Buffer
	for i, p := range parts {
		switch {
		case p.Type != "input_text" && p.Type != "output_text" && p.Type != "text":
			return "", fmt.Errorf("[%d]: only text parts (input_text) are supported", i)
		case p.Text == nil:
			return "", fmt.Errorf("[%d].text: want a string", i)
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// codedError is an error body that carries a code beside its type, as the
// Responses API's errors do.
type codedError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

// WriteCodedError writes an error response with a code.
func WriteCodedError(w http.ResponseWriter, status int, typ, code, msg string) {
	var e codedError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, typ, code
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(MustJSON(e))
}

// MustJSON encodes v, a value of this package's wire types, which always
// encode.
func MustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("sut: encode: " + err.Error())
	}
	return b
}
