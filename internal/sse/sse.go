// Package sse reads and writes the server-sent-events framing that OpenAI
// streams use: "data: <payload>" lines, each event closed by a blank line.
package sse

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// MaxEventBytes bounds one event, so that a hostile peer that never ends a
// line cannot make a reader grow without limit.
const MaxEventBytes = 1 << 20

// ErrEventTooLarge is returned for an event over MaxEventBytes.
var ErrEventTooLarge = errors.New("sse: event too large")

// Reader reads the data payloads of an event stream.
type Reader struct {
	s *bufio.Scanner
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 4096), MaxEventBytes)
	return &Reader{s: s}
}

// Next returns the data of the next event: its data lines joined by "\n".
// Events without data (comments, retry hints) are skipped. At the end of
// the stream it returns io.EOF; a last event not closed by a blank line is
// returned as it is. An event over MaxEventBytes, in one line or many, is
// ErrEventTooLarge.
func (r *Reader) Next() (string, error) {
	var data []string
	pending := false
	size := 0
	for r.s.Scan() {
		line := r.s.Text()
		if line == "" {
			if pending {
				return strings.Join(data, "\n"), nil
			}
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue // comment
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		if field == "data" {
			if size += len(value) + 1; size > MaxEventBytes {
				return "", ErrEventTooLarge
			}
			data = append(data, value)
			pending = true
		}
	}
	if err := r.s.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return "", ErrEventTooLarge
		}
		return "", err
	}
	if pending {
		// A last event without its blank line: servers often close right
		// after "data: [DONE]\n". Accept it; the payload is complete.
		return strings.Join(data, "\n"), nil
	}
	return "", io.EOF
}

// Writer writes events and flushes each one at once, or, made by
// NewBufferedWriter, only when told to (Flush) and when the handler
// returns.
type Writer struct {
	w        http.ResponseWriter
	f        http.Flusher
	buffered bool
}

// NewWriter sets the event-stream headers on w and returns a Writer. It does
// not write the status line; the first event does.
func NewWriter(w http.ResponseWriter) *Writer {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	f, _ := w.(http.Flusher)
	return &Writer{w: w, f: f}
}

// NewBufferedWriter is NewWriter for a stream whose events need not
// reach the reader one by one: they go in as few writes as the response's
// buffer allows, and at once where the writer says (Flush).
func NewBufferedWriter(w http.ResponseWriter) *Writer {
	sw := NewWriter(w)
	sw.buffered = true
	return sw
}

// Flush sends the events written so far.
func (w *Writer) Flush() {
	if w.f != nil {
		w.f.Flush()
	}
}

// Data writes one event with the given payload, which must not contain a
// newline (JSON from encoding/json never does).
func (w *Writer) Data(payload string) error {
	return w.write("data: %s\n\n", payload)
}

// Event writes one event named name (its "event:" line) with the given
// payload, which must not contain a newline, as Data does.
func (w *Writer) Event(name, payload string) error {
	return w.write("event: %s\ndata: %s\n\n", name, payload)
}

func (w *Writer) write(format string, args ...any) error {
	if _, err := fmt.Fprintf(w.w, format, args...); err != nil {
		return err
	}
	if !w.buffered {
		w.Flush()
	}
	return nil
}
