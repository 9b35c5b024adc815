package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"
)

// MaxRequestDepth bounds how deeply a client's request may nest JSON
// values. A chat request nests a handful of levels (tool schemas a few
// dozen); the bound keeps a body of a million '[' from costing a frame
// each.
const MaxRequestDepth = 64

// DecodeChatRequest decodes a client's chat request strictly, so that the
// server reads exactly what a proxy or a log in front of it reads:
//   - the body is read as every body is (DecodeStrict): one JSON object in
//     valid UTF-8, with nothing after it, and no object anywhere in it
//     with the same key twice (encoding/json would silently keep the last
//     one, another parser the first);
//   - keys match exactly: a key that differs from a field the server reads
//     only by case ("MESSAGES", "Role") is refused, where encoding/json
//     would take it for the field;
//   - "messages" is present: an array of {"role","content"} objects, with
//     content a string, null or an array of {"type":"text","text"} parts.
//
// Keys the server does not read are ignored, as OpenAI-compatible servers
// do. Every error says what is wrong in terms of the JSON, never of Go
// types, as it goes to the client.
func DecodeChatRequest(body []byte) (*ChatRequest, error) {
	var top map[string]json.RawMessage
	err := DecodeStrict(body, &top)
	var strict *StrictError
	if errors.As(err, &strict) {
		return nil, strict
	}
	if err != nil || top == nil {
		return nil, errors.New(`the body must be a JSON object: {"model","messages","stream"}`)
	}
	if err := checkKeys("", top, "model", "messages", "stream", "stream_options"); err != nil {
		return nil, err
	}
	var req ChatRequest
	if raw, ok := top["model"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &req.Model); err != nil {
			return nil, errors.New(`"model": want a string`)
		}
	}
	if raw, ok := top["stream"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &req.Stream); err != nil {
			return nil, errors.New(`"stream": want true or false`)
		}
	}
	raw, ok := top["messages"]
	if !ok || isNull(raw) {
		return nil, errors.New(`"messages" is required: an array of {"role","content"}`)
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, errors.New(`"messages": want an array of {"role","content"} objects`)
	}
	req.Messages = make([]Message, len(msgs))
	for i, raw := range msgs {
		m, err := decodeMessage(raw)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]%s", i, err)
		}
		req.Messages[i] = m
	}
	return &req, nil
}

// decodeMessage decodes one message; its errors start with the path inside
// it (".role: ...", ": ...") for the caller to prefix.
func decodeMessage(raw json.RawMessage) (Message, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return Message{}, errors.New(`: want an object {"role","content"}`)
	}
	if err := checkKeys(": ", obj, "role", "content"); err != nil {
		return Message{}, err
	}
	var m Message
	if raw, ok := obj["role"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &m.Role); err != nil {
			return Message{}, errors.New(".role: want a string")
		}
	}
	if raw, ok := obj["content"]; ok {
		c, err := decodeContent(raw)
		if err != nil {
			return Message{}, fmt.Errorf(".content%s", err)
		}
		m.Content = c
	}
	return m, nil
}

// decodeContent decodes a message's content as Content.UnmarshalJSON
// does, with the keys of text parts matched exactly.
func decodeContent(raw json.RawMessage) (Content, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case isNull(raw):
		return "", nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", errors.New(": want a string")
		}
		return Content(s), nil
	case raw[0] == '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", errors.New(": want a string or an array of text parts")
		}
		var sb strings.Builder
		for i, p := range parts {
			text, err := decodeTextPart(p)
			if err != nil {
				return "", fmt.Errorf("[%d]%s", i, err)
			}
			sb.WriteString(text)
		}
		return Content(sb.String()), nil
	}
	return "", errors.New(": want a string or an array of text parts")
}

func decodeTextPart(raw json.RawMessage) (string, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return "", errors.New(`: want a text part {"type":"text","text":...}`)
	}
	if err := checkKeys(": ", obj, "type", "text"); err != nil {
		return "", err
	}
	var typ, text string
	if json.Unmarshal(obj["type"], &typ) != nil || typ != "text" {
		return "", errors.New(": only text parts are supported")
	}
	rawText, ok := obj["text"]
	if !ok || isNull(rawText) || json.Unmarshal(rawText, &text) != nil {
		return "", errors.New(`.text: want a string`)
	}
	return text, nil
}

// DecodeStrict decodes body into v as every JSON body a server of this
// project reads is read, whatever its API: one JSON value in valid UTF-8,
// nested at most MaxRequestDepth deep, with no key twice in any object
// (encoding/json would silently keep the last one, another parser the
// first) and nothing after it. Its error says what is wrong in terms of
// the JSON, for the client; one from decoding into v (a value of another
// JSON type than v wants) is encoding/json's, for the caller to word.
func DecodeStrict(body []byte, v any) error {
	if !utf8.Valid(body) {
		return &StrictError{errors.New("the body is not valid UTF-8")}
	}
	if err := checkJSON(body); err != nil {
		return &StrictError{err}
	}
	return json.Unmarshal(body, v)
}

// StrictError is why DecodeStrict refused a body before decoding it: its
// message is for the client as it is.
type StrictError struct{ Err error }

// Error returns the message of the error e wraps, as the client reads it.
func (e *StrictError) Error() string { return e.Err.Error() }

// Unwrap returns the error e wraps.
func (e *StrictError) Unwrap() error { return e.Err }

// checkKeys refuses a key of obj that differs from one of known only by
// case; where prefixes the error. Keys are looked at in order, so that the
// error is the same every time.
func checkKeys(where string, obj map[string]json.RawMessage, known ...string) error {
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		for _, want := range known {
			if k != want && strings.EqualFold(k, want) {
				return fmt.Errorf("%skey %.64q: keys are case-sensitive; did you mean %q?", where, k, want)
			}
		}
	}
	return nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// checkJSON walks body's tokens: it must hold one JSON value, nested at
// most MaxRequestDepth deep, with no key twice in any object, and nothing
// after it but white space.
func checkJSON(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	// Numbers stay text: a number too large for a float64 is still JSON,
	// and its error would name a Go type.
	dec.UseNumber()
	// frame is an open object (keys set) or array (keys nil).
	type frame struct {
		keys    map[string]struct{}
		wantKey bool // an object's next token is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return jsonError(err, len(stack) == 0)
		}
		var top *frame
		if n := len(stack); n > 0 {
			top = stack[n-1]
		}
		inObject := top != nil && top.keys != nil
		switch {
		case inObject && top.wantKey:
			// A key, or the '}' that closes the object.
			key, ok := tok.(string)
			if !ok {
				stack = stack[:len(stack)-1]
				break
			}
			if _, dup := top.keys[key]; dup {
				return fmt.Errorf("malformed JSON body: duplicate key %.64q", key)
			}
			top.keys[key] = struct{}{}
			top.wantKey = false
			continue
		case tok == json.Delim('{') || tok == json.Delim('['):
			if len(stack) == MaxRequestDepth {
				return fmt.Errorf("malformed JSON body: nested deeper than %d levels", MaxRequestDepth)
			}
			f := &frame{}
			if tok == json.Delim('{') {
				f.keys, f.wantKey = map[string]struct{}{}, true
			}
			stack = append(stack, f)
			if inObject {
				top.wantKey = true // after this value, a key
			}
			continue
		case tok == json.Delim(']'):
			stack = stack[:len(stack)-1]
		case inObject:
			top.wantKey = true // a scalar value; a key comes next
		}
		if len(stack) == 0 {
			break // the one value is complete
		}
	}
	// Decoder.More would miss a stray '}' or ']': look at the rest itself.
	if len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
		return errors.New("malformed JSON body: data after the JSON value")
	}
	return nil
}

// jsonError words a token error for the client; first says no token had
// been read yet.
func jsonError(err error, first bool) error {
	var syntax *json.SyntaxError
	switch {
	case errors.Is(err, io.EOF) && first:
		return errors.New("malformed JSON body: the body is empty")
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("malformed JSON body: it ends before the JSON value does")
	case errors.As(err, &syntax):
		return fmt.Errorf("malformed JSON body: %s (at byte %d)", syntax.Error(), syntax.Offset)
	}
	return errors.New("malformed JSON body")
}
