package execute

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/examples/memserver"
	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// titledFromThird is examples/memserver behind a front that, from a
// conversation's third request on, first asks the model for a title (an
// instruction of its own, the new user message alone), with the
// request's context, and runs the turn only if its client is still
// there: a client that leaves while the model holds the title call
// leaves the turn with no call of its own.
func titledFromThird(modelURL, _ string) (http.Handler, error) {
	inner := memserver.New(modelURL)
	var mu sync.Mutex
	seen := map[string]int{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		id := r.Header.Get(targets.DefaultConversationHeader)
		mu.Lock()
		seen[id]++
		n := seen[id]
		mu.Unlock()
		if n >= 3 {
			var req openai.ChatRequest
			if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) == 0 {
				http.Error(w, "bad request", http.StatusBadRequest)
				return
			}
			title, _ := json.Marshal(openai.ChatRequest{Model: req.Model, Messages: []openai.Message{
				{Role: openai.RoleSystem, Content: openai.Content("Write a short title for this conversation.")},
				req.Messages[len(req.Messages)-1]}})
			call, err := http.NewRequestWithContext(r.Context(), http.MethodPost, modelURL+"/chat/completions", bytes.NewReader(title))
			if err != nil {
				return
			}
			call.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(call); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if r.Context().Err() != nil {
				return // its client left: the turn ends here
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		inner.ServeHTTP(w, r)
	}), nil
}

// TestTitleBeforeAnyLearnedIsNoTurnOfItsOwn: a correct server's turn
// whose client left while the model held its title call, before any title
// call was learned, made no call of its own: the title call, showing the
// user message alone and offering no tools, is set apart, and does not
// read as the turn's history losing its replies (T2).
func TestTitleBeforeAnyLearnedIsNoTurnOfItsOwn(t *testing.T) {
	s := newSession(t, targets.Handler(targets.Profile{Model: "m", ModelTimeout: time.Second}, titledFromThird))
	conv := model.ConversationRef{ID: "c"}
	for i := range 2 {
		ops, v := s.Step(plan.Single("turn", plan.TurnSend(conv, model.UserToken(i+1), false)))
		require.Nil(t, v, "%+v", ops)
		require.Equal(t, model.OK, ops[0].Response.Outcome, ops[0].Response.Detail)
	}
	send := plan.TurnSend(conv, model.UserToken(3), false)
	send.Abort = true // at the turn's first model call: its title call
	ops, v := s.Step(plan.Single("drop", send))
	require.Nil(t, v, "%+v", ops)
	require.Len(t, ops, 1)
	assert.True(t, ops[0].Turn.Interrupted)
	assert.Empty(t, ops[0].Turn.Calls, "no call of the turn's own")
	assert.Len(t, ops[0].Turn.Aux, 1, "the title call, set apart")
}
