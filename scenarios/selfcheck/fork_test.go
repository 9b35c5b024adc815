package selfcheck_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/sut"
)

// TestForkIsT4Alone: a server whose turns of one conversation run at once
// on one history (no lock), and that is otherwise correct, breaks T4 and
// nothing else, over several seeds and bursts of 2 to 6: what the fork
// shows, on the conversation it forked, is T4's, never another
// invariant's FAIL. The interleaving server forks as docker-agent's serve
// a2a does: each turn adds its message to the conversation, then runs on
// the conversation as it stands, and adds its reply at the end, so turns
// at once see each other's halves; the mutants that overwrite show whole
// turns lost.
func TestForkIsT4Alone(t *testing.T) {
	t.Parallel()
	// Its model timeout, declared, is long enough that no call the
	// harness holds in a burst while the server comes to rest times out
	// on a loaded machine (at a second, beside six CPU hogs, 2 of 3
	// seeds failed a turn so: a turn beside it saw its message, and as
	// the model never began to answer the failed turn's call, nothing
	// showed that turn still ran then: a failed turn's message kept, T1).
	interleaving := scenarios.Handler(scenarios.Profile{Model: "fork", ModelTimeout: interleavingTimeout},
		func(modelURL, _ string) (http.Handler, error) { return newInterleaving(modelURL), nil })
	for _, c := range []struct {
		name   string
		target scenarios.Target
	}{
		{"interleaving", interleaving},
		{"no-conversation-lock", reference.WithMutant(sut.NoConversationLock)},
	} {
		for seed := uint64(1); seed <= 3; seed++ {
			// Each run mostly waits, on held model calls the server gives
			// up on at its own timeout. Ten checks a run, each with its
			// forks, and the checks after the first FAIL where another
			// name would show.
			t.Run(fmt.Sprintf("%s seed %d", c.name, seed), func(t *testing.T) {
				t.Parallel()
				res, err := scenarios.Conform(c.target, scenarios.Options{Checks: 10, Seed: seed})
				require.NoError(t, err)
				var failed []model.Invariant
				for _, v := range res.Verdicts {
					if v.Status == report.Fail {
						failed = append(failed, v.Invariant)
						if v.Invariant != model.T4 && v.Failure != nil {
							t.Logf("%s, seed %d:\n%s", c.name, seed, v.Failure.Report)
						}
					}
				}
				assert.Equal(t, []model.Invariant{model.T4}, failed, "%s, seed %d", c.name, seed)
			})
		}
	}
}

// interleaving is a chat server whose turns run without a lock: a turn
// adds its user message to the conversation, runs the model on the
// conversation as it stands, and adds its reply at the end; a turn that
// fails, or whose client left, takes its message out again. It is
// correct in all but that.
type interleaving struct {
	modelURL string
	client   *http.Client
	mu       sync.Mutex
	convs    map[string][]string // messages' texts, alternating by role as added
	roles    map[string][]string
}

// interleavingTimeout is the interleaving server's model timeout.
const interleavingTimeout = 3 * time.Second

func newInterleaving(modelURL string) *interleaving {
	return &interleaving{modelURL: modelURL, client: &http.Client{Timeout: interleavingTimeout},
		convs: map[string][]string{}, roles: map[string][]string{}}
}

func (s *interleaving) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model    string `json:"model"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
		Stream bool `json:"stream"`
	}
	if r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&req) != nil {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	if len(req.Messages) == 0 || req.Messages[len(req.Messages)-1].Role != "user" ||
		strings.TrimSpace(req.Messages[len(req.Messages)-1].Content) == "" {
		http.Error(w, `{"error":{"message":"no new user message"}}`, http.StatusBadRequest)
		return
	}
	id, user := r.Header.Get("X-Conversation-Id"), req.Messages[len(req.Messages)-1].Content
	s.mu.Lock()
	s.convs[id], s.roles[id] = append(s.convs[id], user), append(s.roles[id], "user")
	var turn []map[string]string
	for i, text := range s.convs[id] {
		turn = append(turn, map[string]string{"role": s.roles[id][i], "content": text})
	}
	s.mu.Unlock()
	reply, err := s.ask(r, req.Model, turn)
	s.mu.Lock()
	if err == nil && r.Context().Err() == nil {
		s.convs[id], s.roles[id] = append(s.convs[id], reply), append(s.roles[id], "assistant")
	} else if i := slices.Index(s.convs[id], user); i >= 0 {
		s.convs[id], s.roles[id] = slices.Delete(s.convs[id], i, i+1), slices.Delete(s.roles[id], i, i+1)
	}
	s.mu.Unlock()
	if err != nil {
		http.Error(w, `{"error":{"message":"the model failed"}}`, http.StatusBadGateway)
		return
	}
	msg := map[string]string{"role": "assistant", "content": reply}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "chat.completion",
			"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": "stop"}}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, chunk := range []map[string]any{{"index": 0, "delta": msg}, {"index": 0, "delta": map[string]any{}, "finish_reason": "stop"}} {
		data, _ := json.Marshal(map[string]any{"object": "chat.completion.chunk", "choices": []any{chunk}})
		fmt.Fprintf(w, "data: %s\n\n", data)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (s *interleaving) ask(r *http.Request, modelName string, turn []map[string]string) (string, error) {
	body, _ := json.Marshal(map[string]any{"model": modelName, "messages": turn})
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
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
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
