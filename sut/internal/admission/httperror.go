package admission

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/turncheck/turncheck/internal/openai"
)

// MaxHeaderBytes bounds a request's header block; past it net/http answers
// 431 (with a few KiB of slack of its own).
const MaxHeaderBytes = 64 << 10

// net/http answers a request it cannot parse (headers too large, a bad
// header line, an unsupported transfer coding) itself, before any handler,
// in plain text, in one write of exactly this shape:
//
//	HTTP/1.1 <code> <text>\r\n<netHTTPErrorHeaders><body>
//
// No handler response looks like it: those carry a Date header, and their
// headers are sorted (Connection before Content-Type). The tracked
// connection rewrites such a write into the OpenAI error shape, so that a
// client gets JSON for every error.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// jsonHTTPError returns p, one of net/http's own plain-text error answers,
// as a JSON error answer with the same status; false if p is not one.
func jsonHTTPError(p []byte) ([]byte, bool) {
	rest, ok := bytes.CutPrefix(p, []byte("HTTP/1.1 "))
	if !ok {
		return nil, false
	}
	if bytes.HasPrefix(rest, []byte("417 ")) && bytes.HasSuffix(rest, []byte("Content-Length: 0\r\n\r\n")) {
		// Its answer to an Expect it does not understand, a 417 with no
		// body, has a Date header, unlike the others; a handler never
		// answers 417.
		return []byte(jsonResponse(417, "Expectation Failed", "invalid_request_error",
			"the request's Expect header asks for what this server does not do (only 100-continue is understood)", "")), true
	}
	statusLine, body, ok := bytes.Cut(rest, []byte(netHTTPErrorHeaders))
	if !ok || bytes.Contains(statusLine, []byte("\r\n")) || len(statusLine) < 4 || statusLine[3] != ' ' {
		return nil, false
	}
	code, err := strconv.Atoi(string(statusLine[:3]))
	if err != nil || code < 400 || code > 599 {
		return nil, false
	}
	// The body repeats the status line ("431 Request Header Fields Too
	// Large", "400 Bad Request: invalid header ...") or says what is
	// unsupported; the message is that, without the code.
	msg := strings.TrimSpace(string(body))
	if c, after, ok := strings.Cut(msg, " "); ok && c == strconv.Itoa(code) {
		msg = after
	}
	if code == 431 {
		msg += fmt.Sprintf(" (the limit is %d bytes)", MaxHeaderBytes)
	}
	reason, _, _ := strings.Cut(string(statusLine[4:]), ":")
	return []byte(jsonResponse(code, reason, "invalid_request_error", msg, "")), true
}

// jsonResponse is a whole HTTP/1.1 response that closes its connection,
// with an OpenAI error body; extra holds more header lines, each ending
// in \r\n.
func jsonResponse(code int, reason, typ, msg, extra string) string {
	body := openai.Encode(openai.ErrorBody{Error: openai.ErrorDetail{Message: msg, Type: typ}})
	return fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n%s",
		code, reason, len(body), extra, body)
}
