package stdio

import (
	"bytes"
	"encoding/json"
	"sync"
	"time"
)

// AnswerCount is the SDK's output: it counts the requests the server
// read and has not answered yet (owe, at each request handed to the SDK;
// each answer the SDK writes pays one back), so that the server answers
// every request before it closes its output.
type AnswerCount struct {
	w    *LineWriter
	mu   sync.Mutex
	owed int
}

// Owe counts one request more to answer.
func (c *AnswerCount) Owe() {
	c.mu.Lock()
	c.owed++
	c.mu.Unlock()
}

// Write writes one line of the SDK's, and counts an answer (a message
// with an id and no method) as paid once written.
func (c *AnswerCount) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if bytes.HasPrefix(p, notificationPrefix) {
		// A notification or a call (the SDK writes its method right after
		// the version): no answer, and most lines are these, one for each
		// chunk of a reply.
		return n, err
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if json.Unmarshal(p, &msg) == nil && msg.ID != nil && msg.Method == "" {
		c.mu.Lock()
		c.owed--
		c.mu.Unlock()
	}
	return n, err
}

// notificationPrefix begins every line of the SDK's that has a method.
var notificationPrefix = []byte(`{"jsonrpc":"2.0","method"`)

// Settle waits until every request read is answered, the output is
// Broken, or wait has passed: an answer is written the moment its
// handler returns, so this takes no time unless the client stopped
// reading.
func (c *AnswerCount) Settle(wait time.Duration) {
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		owed := c.owed
		c.mu.Unlock()
		select {
		case <-c.w.Broken:
			return
		default:
		}
		if owed <= 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// NewAnswerCount returns the count of the answers owed on w.
func NewAnswerCount(w *LineWriter) *AnswerCount { return &AnswerCount{w: w} }
