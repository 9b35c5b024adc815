package sut_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/sut"
)

// TestStallChangesNothingButTime: a stalled server answers and commits
// every turn, streamed or not, as one that is not. Each turn pauses at
// least three times (its model call, its commit, its writes), uniformly in
// 0..Stall: that the eighteen pauses of six turns add up to less than
// Stall has a chance of 1/18!, and a slower machine only adds to them.
func TestStallChangesNothingButTime(t *testing.T) {
	t.Parallel()
	const stall = 20 * time.Millisecond
	e := newEnv(t, sut.Config{Stall: stall})
	began := time.Now()
	var want []model.Token
	for i := range 6 {
		tok := model.Token(fmt.Sprintf("tc-u%d", i+1))
		want = append(want, tok)
		n := e.model.CallCount()
		r := e.turn(t, "", "c1", tok, i%2 == 1)
		require.Equal(t, http.StatusOK, r.status, "turn %s: %s", tok, r.body)
		if i%2 == 1 {
			s := parseStream(t, r)
			assert.True(t, s.done && s.stopped() && s.errors() == 0, "turn %s: the stream ends ok: %s", tok, r.body)
			assert.Equal(t, strings.Join(faults.ReplyChunks(tok), ""), model.WithoutCallMarks(s.text()))
		} else {
			requireCompletion(t, r, tok)
		}
		assert.Equal(t, want, oneCall(t, e.model, n, tok), "turn %s: the model sees every turn before it", tok)
		want = append(want, model.Token(strings.Replace(string(tok), "tc-u", "tc-a", 1)))
	}
	assert.GreaterOrEqual(t, time.Since(began), stall, "the turns were not stalled")
}

// TestStallSeesItsClientGoLate: a stalled turn sees its client go away
// late, as a busy machine does, up to Stall after it left; it then stops,
// and commits nothing of the turn.
func TestStallSeesItsClientGoLate(t *testing.T) {
	t.Parallel()
	g := &sut.Gauge{}
	e := newEnv(t, sut.Config{Stall: 200 * time.Millisecond, Gauge: g})
	arrived := e.model.Script("tc-u1", faults.Fault{Kind: faults.Hold})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL()+"/v1/chat/completions",
		strings.NewReader(chatBody(t, false, user("tc-u1 hello"))))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(sut.DefaultConversationHeader, "c1")
	req.Header.Set(sut.RequestTagHeader, "r1")
	done := make(chan error, 1)
	go func() {
		resp, err := e.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	await(t, arrived, "the turn's model call")
	assert.False(t, g.DoneWith("r1"), "done with a turn still at its model call")
	cancel()
	assert.Error(t, <-done)
	awaitIdle(t, g)
	assert.True(t, g.DoneWith("r1"), "the turn saw its client go")
	assert.Equal(t, toks("u2"), e.ok(t, "", "c1", "tc-u2"), "the turn left nothing")
}
