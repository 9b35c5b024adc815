package openai

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
)

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
