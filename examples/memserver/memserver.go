// Package memserver is a session server in one file of Go's standard
// library, the Go twin of examples/pyserver: it keeps each conversation's
// history in memory under the X-Conversation-Id header, calls the model for
// every turn, and commits a turn only when the model answered and the
// client is still there. It is what a Go server's own test of itself looks
// like (memserver_test.go, the README's snippet), and a correct handler the
// harness's cost in process is measured on.
package memserver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// message is one message of a conversation, as chat completions name it.
type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// conversation is one conversation's history; its lock makes its turns
// take their turn.
type conversation struct {
	sync.Mutex
	history []message
}

// Server is an http.Handler serving POST /v1/chat/completions.
type Server struct {
	modelURL string
	client   *http.Client
	mu       sync.Mutex
	convs    map[string]*conversation
}

// New returns a server that calls the model at modelURL (ending in /v1).
func New(modelURL string) *Server {
	return &Server{modelURL: modelURL, client: &http.Client{Timeout: time.Second}, convs: map[string]*conversation{}}
}

// Close lets go of the server's idle connections to the model.
func (s *Server) Close() { s.client.CloseIdleConnections() }

func (s *Server) conversation(id string) *conversation {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.convs[id]
	if c == nil {
		c = &conversation{}
		s.convs[id] = c
	}
	return c
}

// ServeHTTP runs one turn.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		fail(w, http.StatusNotFound, "not found", "not_found")
		return
	}
	var req struct {
		Model    string    `json:"model"`
		Messages []message `json:"messages"`
		Stream   bool      `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		fail(w, http.StatusBadRequest, "malformed request", "invalid_request_error")
		return
	}
	if len(req.Messages) == 0 || req.Messages[len(req.Messages)-1].Role != "user" ||
		strings.TrimSpace(req.Messages[len(req.Messages)-1].Content) == "" {
		fail(w, http.StatusBadRequest, "no new user message", "invalid_request_error")
		return
	}
	id := r.Header.Get("X-Conversation-Id")
	c := s.conversation(id)
	c.Lock() // one turn at a time per conversation
	turn := append(append([]message{}, c.history...), message{Role: "user", Content: req.Messages[len(req.Messages)-1].Content})
	reply, err := s.ask(r, req.Model, turn)
	// A client gone before the answer takes its turn with it: nothing of
	// an interrupted turn is kept.
	if err == nil && r.Context().Err() == nil && id != "" {
		c.history = append(turn, message{Role: "assistant", Content: reply})
	}
	c.Unlock()
	if err != nil {
		fail(w, http.StatusBadGateway, "the model failed: "+err.Error(), "upstream_error")
		return
	}
	if !req.Stream {
		answer(w, map[string]any{"object": "chat.completion", "choices": []any{map[string]any{
			"index": 0, "message": message{Role: "assistant", Content: reply}, "finish_reason": "stop"}}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, chunk := range []map[string]any{
		{"index": 0, "delta": message{Role: "assistant", Content: reply}, "finish_reason": nil},
		{"index": 0, "delta": map[string]any{}, "finish_reason": "stop"},
	} {
		data, _ := json.Marshal(map[string]any{"object": "chat.completion.chunk", "choices": []any{chunk}})
		fmt.Fprintf(w, "data: %s\n\n", data)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// ask calls the model with the turn's messages and returns its reply.
func (s *Server) ask(r *http.Request, model string, turn []message) (string, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "messages": turn})
	call, err := http.NewRequestWithContext(r.Context(), http.MethodPost, s.modelURL+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	call.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(call)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Message message `json:"message"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK || len(out.Choices) == 0 {
		return "", fmt.Errorf("status %d", resp.StatusCode)
	}
	return out.Choices[0].Message.Content, nil
}

func fail(w http.ResponseWriter, status int, msg, kind string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"message": msg, "type": kind}})
}

func answer(w http.ResponseWriter, body any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}
