// Package stdio guards both ends of an ACP agent's pipe: the lines it
// reads (one JSON-RPC message each, bounded) and writes (each within a
// timeout), and the answers it owes before it closes its output.
package stdio

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/turn"
)

// The ACP connection's two ends, as the server guards them. JSON-RPC
// itself is the SDK's (acp.go); these only make sure that nothing a
// client writes, or fails to read, stops the server: a line that is no
// JSON-RPC message is answered with a JSON-RPC error and skipped (the
// SDK would only log it), a line over the size limit is answered and
// skipped unread, and a client that stops reading the server's output
// is taken for gone.

// WriteTimeout bounds one write of a line to the client, as
// StreamWriteTimeout bounds one write on HTTP: past it the client is
// taken for gone. A variable only so that a test can show it without
// waiting 30 s.
var WriteTimeout = config.StreamWriteTimeout

// errClientStalled is a write to the client that did not complete within
// WriteTimeout.
var errClientStalled = errors.New("the client did not read the server's output in time")

// LineWriter writes whole lines to the client, one at a time, each
// within acpWriteTimeout. The SDK writes each JSON-RPC message with one
// Write call; so does the server's own error for a bad line. A write that
// fails or stalls breaks the writer: every later one fails at once (the
// line cut short has broken the framing anyway), and broken is closed.
// It is safe for concurrent use.
type LineWriter struct {
	mu      sync.Mutex // one line at a time, whole
	timeout time.Duration
	lines   chan []byte
	results chan error
	err     error
	// Broken is closed when a write failed or stalled.
	Broken chan struct{}
	// done is closed when the writing goroutine has returned.
	done chan struct{}
}

// NewLineWriter returns a writer to out, whose writes a goroutine of its
// own makes, so that a write that blocks can be given up on.
func NewLineWriter(out io.Writer, timeout time.Duration) *LineWriter {
	w := &LineWriter{timeout: timeout, lines: make(chan []byte), results: make(chan error, 1),
		Broken: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for line := range w.lines {
			_, err := out.Write(line)
			w.results <- err
		}
	}()
	return w
}

// Write writes p, one line, whole; it returns an error if the client did
// not take it within the timeout, or the writer is broken or closed.
func (w *LineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	// The goroutine may still hold the line when this returns (a stall).
	line := bytes.Clone(p)
	timer := time.NewTimer(w.timeout)
	defer timer.Stop()
	select {
	case w.lines <- line:
	case <-timer.C:
		return 0, w.fail(errClientStalled) // the goroutine is stuck on an earlier line
	}
	select {
	case err := <-w.results:
		if err != nil {
			return 0, w.fail(fmt.Errorf("write to the client: %w", err))
		}
		return len(p), nil
	case <-timer.C:
		return 0, w.fail(errClientStalled)
	}
}

// Fail breaks the writer with err, and returns it. w.mu is held.
func (w *LineWriter) fail(err error) error {
	w.err = err
	close(w.Broken)
	return err
}

// Close ends the writing goroutine once the line it writes, if any, is
// written; it waits for that only if the writer is not broken (a broken
// writer's goroutine may be stuck on a client that never reads, until
// the output is closed). Later writes fail.
func (w *LineWriter) Close() {
	w.mu.Lock()
	stuck := w.err != nil
	if w.err == nil {
		w.err = errors.New("the connection is closed")
	}
	w.mu.Unlock()
	close(w.lines)
	if !stuck {
		<-w.done
	}
}

// rpcError is a JSON-RPC error response the server writes itself, for a
// line that is no message it can answer otherwise.
type rpcError struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   rpcErrorDetail  `json:"error"`
}

// rpcErrorDetail is a JSON-RPC error object.
type rpcErrorDetail struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

// The JSON-RPC 2.0 error codes the server answers bad lines with.
const (
	rpcParseError     = -32700
	rpcInvalidRequest = -32600
	rpcMethodNotFound = -32601
)

// ReadLines reads the client's lines from in and hands every one that is
// a JSON-RPC message on to sdk, each with its newline, in order; it
// answers every other line on out itself, with a JSON-RPC error whose id
// is null (the line's id cannot be trusted), and goes on. A line over
// max bytes is answered and skipped without being held in memory. When
// in ends (or fails), or sdk is closed, it closes sdk and returns. It
// calls onRequest for each request (a message with a method and an id)
// it hands on, before it does.
func ReadLines(in io.Reader, sdk *io.PipeWriter, out io.Writer, max int64, onRequest func(), onBad func(reason string)) {
	defer sdk.Close()
	br := bufio.NewReaderSize(in, 64<<10)
	var line []byte
	tooLong := false
	for {
		chunk, err := br.ReadSlice('\n')
		switch {
		case tooLong:
		case int64(len(line)+len(chunk)) > max+1: // +1: the newline
			tooLong, line = true, nil
		default:
			line = append(line, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue // the rest of the line is on its way
		}
		if len(line) > 0 || tooLong {
			if tooLong {
				onBad("line too long")
				writeRPCError(out, rpcInvalidRequest, "Invalid request", fmt.Sprintf("a message over %d bytes was skipped", max))
			} else if !forwardLine(sdk, out, line, onRequest, onBad) {
				return
			}
		}
		line, tooLong = line[:0], false
		if err != nil {
			return // io.EOF: the client closed its end
		}
	}
}

// forwardLine hands line on to sdk if it is a JSON-RPC message, and
// answers it on out otherwise. It reports false if sdk is closed.
func forwardLine(sdk io.Writer, out io.Writer, line []byte, onRequest func(), onBad func(string)) bool {
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) == 0 {
		return true
	}
	// Read as every API's body is (openai.DecodeStrict): one JSON value in
	// valid UTF-8, no key twice (a method given twice must not run the
	// last one), nothing after it.
	var top any
	if err := openai.DecodeStrict(trimmed, &top); err != nil {
		onBad("parse error")
		writeRPCError(out, rpcParseError, "Parse error", "the line is not one JSON-RPC message: "+err.Error()+"; send one JSON-RPC message per line")
		return true
	}
	var msg struct {
		JSONRPC *string          `json:"jsonrpc"`
		Method  *string          `json:"method"`
		ID      *json.RawMessage `json:"id"`
	}
	if trimmed[0] != '{' || json.Unmarshal(trimmed, &msg) != nil || (msg.Method == nil && msg.ID == nil) {
		onBad("invalid request")
		writeRPCError(out, rpcInvalidRequest, "Invalid request",
			`the line is not a JSON-RPC message: want an object with a "method" (a request or a notification) or an "id" (a response)`)
		return true
	}
	if msg.ID != nil && !turn.ValidRPCID(*msg.ID) {
		onBad("invalid id")
		writeRPCError(out, rpcInvalidRequest, "Invalid request", "id: want a string, a number or null")
		return true
	}
	// The id, where one came, is answered back: the client can tell
	// which of its calls was refused.
	id := json.RawMessage("null")
	if msg.ID != nil {
		id = *msg.ID
	}
	if msg.JSONRPC == nil || *msg.JSONRPC != "2.0" {
		onBad("not JSON-RPC 2.0")
		writeRPCErrorID(out, id, rpcInvalidRequest, "Invalid request", `want "jsonrpc": "2.0"`)
		return true
	}
	if msg.Method != nil && *msg.Method == "" {
		// Read on as a response (no method), it would get no answer.
		onBad("empty method")
		if msg.ID != nil {
			writeRPCErrorID(out, id, rpcMethodNotFound, "Method not found", "the method is empty")
		}
		return true
	}
	if msg.Method != nil && msg.ID != nil {
		onRequest()
	}
	msgLine := append(trimmed[:len(trimmed):len(trimmed)], '\n')
	_, err := sdk.Write(msgLine)
	return err == nil
}

// writeRPCError writes a JSON-RPC error response with a null id.
func writeRPCError(out io.Writer, code int, message, data string) {
	writeRPCErrorID(out, json.RawMessage("null"), code, message, data)
}

// writeRPCErrorID writes a JSON-RPC error response to the call with id.
func writeRPCErrorID(out io.Writer, id json.RawMessage, code int, message, data string) {
	b, _ := json.Marshal(rpcError{JSONRPC: "2.0", ID: id, Error: rpcErrorDetail{Code: code, Message: message, Data: data}})
	_, _ = out.Write(append(b, '\n'))
}
