package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
)

// DecodeObject decodes body, which must hold one JSON value and nothing
// after it but white space, into v.
func DecodeObject(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return err
	}
	// Decoder.More would miss a stray '}' or ']': look at the rest itself.
	if len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
		return errors.New("data after the JSON value")
	}
	return nil
}

// Encode returns the JSON of v, one of this package's types, which always
// encode.
func Encode(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic("openai: encode: " + err.Error())
	}
	return string(b)
}

// WriteError writes an error response: status and an ErrorBody.
func WriteError(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, Encode(ErrorBody{Error: ErrorDetail{Message: msg, Type: typ}}))
}

// ReadErrorMessage reads at most 4 KiB of an error response and returns its
// message. ok is false when the body is not an ErrorBody; msg is then the
// raw body, clipped.
func ReadErrorMessage(r io.Reader) (msg string, ok bool) {
	raw, _ := io.ReadAll(io.LimitReader(r, 4096))
	var eb ErrorBody
	if json.Unmarshal(raw, &eb) == nil && eb.Error.Message != "" {
		return eb.Error.Message, true
	}
	s := strings.TrimSpace(string(raw))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s, false
}
