package faults_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
)

// TestStallKeepsEveryAnswer: a stalled model answers and records every
// call and lookup as one that is not, only later. The pauses add up to at
// least the bound over a dozen calls (they are uniform in 0..Stall: that
// twelve of them add up to less has a chance of 1/12!), which a slower
// machine only makes longer.
func TestStallKeepsEveryAnswer(t *testing.T) {
	const stall = 20 * time.Millisecond
	f := start(t, faults.ModelConfig{Stall: stall})
	began := time.Now()
	var want []model.Token
	for i := range 12 {
		tok := model.Token(fmt.Sprintf("tc-u%d", i+1))
		if i%4 == 3 {
			resp, got := f.send(http.MethodGet, "/tools/lookup?key="+url.QueryEscape(model.ToolCallID(tok, 1, 1)), nil)
			assert.Equal(t, http.StatusOK, resp.StatusCode, "lookup %d: %s", i, got)
			continue
		}
		want = append(want, tok)
		resp, got := f.post(i%2 == 0, user(string(tok)))
		require.Equal(t, http.StatusOK, resp.StatusCode, "call %d: %s", i, got)
		assert.Contains(t, string(got), strings.Replace(string(tok), "tc-u", "tc-a", 1), "call %d", i)
	}
	assert.GreaterOrEqual(t, time.Since(began), stall, "the calls were not stalled")
	var turns []model.Token
	for _, c := range f.m.CallsAfter(0) {
		turns = append(turns, c.Turn)
	}
	assert.Equal(t, want, turns, "every call recorded, in order")
	assert.Equal(t, 3, f.m.RunCount(), "every lookup recorded")
}

// TestStallModelsEndsWithTheModel: StallModels slows a model whose config
// sets no stall, as one a harness starts out of a test's reach; a call
// stalled for up to an hour ends when the model closes, as a held one
// does; and once restored, the next model answers.
func TestStallModelsEndsWithTheModel(t *testing.T) {
	restore := faults.StallModels(time.Hour)
	m, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	f := &fixture{t: t, m: m, client: &http.Client{Transport: &http.Transport{}}}
	defer f.client.CloseIdleConnections()
	done := f.goDo(context.Background(), body(t, false, user("tc-u1")))
	// The call is stalled (a pause under 50 ms has a chance of 1 in
	// 72,000); on a machine too slow to have started it by then, Close
	// still has to end it.
	requireHeld(t, done, "the stalled call")
	assert.Zero(t, m.CallCount(), "a stalled call is recorded when it arrives, after its pause")
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case err := <-closed:
		assert.NoError(t, err)
	case <-time.After(guard):
		require.FailNow(t, "Close waited for a stalled call")
	}
	r := waitResult(t, done)
	assert.False(t, r.err == nil && r.status == http.StatusOK, "a call the model closed under is not answered: %+v", r)

	restore()
	g := start(t, faults.ModelConfig{})
	resp, got := g.post(false, user("tc-u2"))
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, unmark(string(got)), reply("tc-u2"))
}
