//go:build unix

package misbehaving_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/testbin"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
)

// TestCrashUnderLoadLosesNothing: clients send turns on conversations of
// their own to the reference server, run as a subprocess, until it is
// killed with SIGKILL in the middle of the load; restarted on the same
// data, every turn it acknowledged is in the history of its conversation's
// next model call, in order.
func TestCrashUnderLoadLosesNothing(t *testing.T) {
	t.Parallel()
	bin := testbin.Turncheck(t)
	fake, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	defer func() { require.NoError(t, fake.Close()) }()
	dir := t.TempDir()
	p, err := faults.StartProcess(faults.ProcessConfig{ModelURL: fake.URL(), DataDir: dir,
		Command: []string{bin, "serve", "--listen", "{addr}", "--model-url", "{model_url}", "--data-dir", "{data_dir}"}})
	require.NoError(t, err)
	defer func() { _ = p.Stop() }()

	clients, killAfter := 8, 400
	if testing.Short() {
		killAfter = 100
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	var (
		next  atomic.Int64
		acked atomic.Int64
		mu    sync.Mutex
		ok    = make([][]model.Token, clients) // acknowledged, per conversation, in order
		wg    sync.WaitGroup
	)
	send := func(c int, tok model.Token) bool {
		body, _ := json.Marshal(openai.ChatRequest{Model: "turncheck",
			Messages: []openai.Message{{Role: openai.RoleUser, Content: openai.Content(plan.UserText(tok))}}})
		req, _ := http.NewRequest(http.MethodPost, p.URL()+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Conversation-Id", fmt.Sprintf("load-%d", c))
		resp, err := hc.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var out openai.Completion
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&out) == nil && len(out.Choices) > 0
	}
	killed := make(chan struct{})
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-killed:
					return
				default:
				}
				tok := model.UserToken(int(next.Add(1)))
				if !send(c, tok) {
					continue // refused, or cut by the kill: unknown, not counted
				}
				mu.Lock()
				ok[c] = append(ok[c], tok)
				mu.Unlock()
				if acked.Add(1) == int64(killAfter) {
					assert.NoError(t, p.Kill())
					close(killed)
				}
			}
		}()
	}
	wg.Wait()
	require.NoError(t, p.Restart())

	checked := 0
	for c := range clients {
		tok := model.UserToken(int(next.Add(1)))
		before := fake.CallCount()
		require.True(t, send(c, tok), "conversation %d after the restart", c)
		calls := fake.CallsAfter(0)[before:]
		require.NotEmpty(t, calls)
		history := calls[len(calls)-1].History
		var users []model.Token
		for _, h := range history {
			if h.IsUser() {
				users = append(users, h)
			}
		}
		// Every acknowledged turn is there, in order; a turn cut by the kill
		// may be there too (its outcome was unknown).
		i := 0
		for _, u := range users {
			if i < len(ok[c]) && u == ok[c][i] {
				i++
			}
		}
		assert.Equal(t, len(ok[c]), i, "conversation %d lost an acknowledged turn: acknowledged %v, history %v", c, ok[c], users)
		assert.True(t, slices.Contains(users, tok))
		checked += len(ok[c])
	}
	t.Logf("%d acknowledged turns on %d conversations checked after kill -9: none lost", checked, clients)
}
