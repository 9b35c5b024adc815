package execute

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// parallelTools is a stateless server of one model call and one round of
// tools, which it runs at once, its second lookup started a little after
// its first, as a busy machine starts a second goroutine; it sees its
// client go 200 ms late, and then stops and starts nothing more.
func parallelTools(modelURL, _ string) (http.Handler, error) {
	tools := []openai.Tool{
		{Type: openai.TypeFunction, Function: openai.Function{Name: sut.ToolEcho}},
		{Type: openai.TypeFunction, Function: openai.Function{Name: sut.ToolLookup}},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		late, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
		defer cancel()
		stop := context.AfterFunc(r.Context(), func() { time.Sleep(200 * time.Millisecond); cancel() })
		defer stop()
		var req openai.ChatRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body, _ := json.Marshal(openai.ChatRequest{Model: "m", Messages: req.Messages[len(req.Messages)-1:], Tools: tools})
		call, err := http.NewRequestWithContext(late, http.MethodPost, modelURL+"/chat/completions", bytes.NewReader(body))
		if err != nil {
			return
		}
		resp, err := http.DefaultClient.Do(call)
		if err != nil {
			return // its client went away
		}
		var c openai.Completion
		err = json.NewDecoder(resp.Body).Decode(&c)
		resp.Body.Close()
		if err != nil || len(c.Choices) == 0 || c.Choices[0].Message == nil {
			http.Error(w, "no answer", http.StatusBadGateway)
			return
		}
		var wg sync.WaitGroup
		for i, tc := range c.Choices[0].Message.ToolCalls {
			if tc.Function.Name != sut.ToolLookup {
				continue
			}
			var args struct{ Key string }
			_ = json.Unmarshal([]byte(tc.Function.Arguments), &args)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i > 0 {
					// Late enough to come after the drop on a loaded
					// machine (at 50 ms, once at load 25, it came
					// before), and before the server sees the drop.
					time.Sleep(150 * time.Millisecond)
				}
				if late.Err() != nil {
					return // it saw its client go: nothing more starts
				}
				get, err := http.NewRequestWithContext(late, http.MethodGet,
					modelURL+"/tools/lookup?key="+url.QueryEscape(args.Key), nil)
				if err != nil {
					return
				}
				if resp, err := http.DefaultClient.Do(get); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
		http.Error(w, "the turn ends here", http.StatusServiceUnavailable)
	}), nil
}

// TestParallelLookupOnItsWayIsNoFinding: a server that runs a round's
// lookups at once, whose second lookup arrives after its client dropped
// the turn while its first is still held, was not carrying the turn on:
// it started the lookup before it could see the disconnect, and then
// stopped. It is not judged T10.
func TestParallelLookupOnItsWayIsNoFinding(t *testing.T) {
	target := targets.Handler(targets.Profile{Model: "m", ModelTimeout: time.Second, Tools: true}, parallelTools)
	s := newSession(t, target)
	for i := range 3 {
		send := plan.TurnSend(model.ConversationRef{}, model.UserToken(i+1), false)
		send.Rounds = []faults.Round{{sut.ToolLookup, sut.ToolLookup}}
		send.Abort, send.AbortAt = true, &faults.Point{Round: 1, Tool: 1}
		ops, v := s.Step(plan.Single("drop", send))
		require.Nil(t, v, "%+v", ops)
		require.Len(t, ops, 1)
		assert.True(t, ops[0].Turn.Interrupted)
		assert.Zero(t, ops[0].Turn.CarriedOn, "a lookup on its way carried nothing on")
		require.Len(t, ops[0].Turn.Runs, 2, "both lookups reached the model")
		assert.Greater(t, ops[0].Turn.Runs[1].At, ops[0].Turn.Dropped, "the second lookup arrived after the client left")
	}
}
