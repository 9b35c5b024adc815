package execute

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/scenarios/validate"
	"github.com/turncheck/turncheck/sut"
)

// newExecutor starts a session on target and returns its executor; the
// session stops when the test ends.
func newExecutor(t testing.TB, target targets.Target) *executor {
	t.Helper()
	s := newSession(t, target)
	return s.Exec
}

// newSession starts a session of a lab of its own on target; both stop
// when the test ends.
func newSession(t testing.TB, target targets.Target, skip ...model.Invariant) *Session {
	t.Helper()
	l, err := Open(target, skip)
	require.NoError(t, err)
	s, err := l.Session(nil)
	if err != nil {
		_ = l.Close()
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		require.NoError(t, s.Close())
		require.NoError(t, l.Close())
	})
	return s
}

func firstCall(t *testing.T, op history.Op) []model.Token {
	t.Helper()
	require.NotEmpty(t, op.Turn.Calls, "no model call for %s", op.Send.Token)
	return op.Turn.Calls[0].History
}

// TestBurstOnASerializingServer: requests queue in the order they were
// sent, each sees the turns before it, and the history says so.
func TestBurstOnASerializingServer(t *testing.T) {
	e := newExecutor(t, reference.Target{})
	conv := model.ConversationRef{Key: "key-a", ID: "c"}
	ops := e.execute(plan.Burst(conv, 1, 3, 2, 1, 0))
	require.Len(t, ops, 3)
	u := model.UserToken
	for _, op := range ops {
		require.Equal(t, model.OK, op.Response.Outcome, op.Response.Detail)
	}
	assert.Equal(t, []model.Token{u(1)}, firstCall(t, ops[0]))
	assert.Equal(t, []model.Token{u(1), u(1).Reply(), u(2)}, firstCall(t, ops[1]))
	assert.Equal(t, []model.Token{u(1), u(1).Reply(), u(2), u(2).Reply(), u(3)}, firstCall(t, ops[2]))
	for i, op := range ops {
		assert.Less(t, op.Turn.Invoke, op.Turn.Calls[0].At, "op %d", i)
		assert.Less(t, op.Turn.Calls[0].At, op.Turn.Return, "op %d", i)
		if i > 0 {
			assert.Less(t, ops[i-1].Turn.Invoke, op.Turn.Invoke, "sent in order")
		}
	}
	turns := []model.Turn{ops[0].Turn, ops[1].Turn, ops[2].Turn}
	require.Nil(t, model.New().ApplyStep(turns))
}

// TestReleaseOrderDecides: where the server lets turns run at once, the
// drawn release order decides which commit wins, run after run.
func TestReleaseOrderDecides(t *testing.T) {
	conv := model.ConversationRef{Key: "key-a", ID: "c"}
	u := model.UserToken
	for _, release := range [][]int{{0, 1}, {1, 0}} {
		t.Run(fmt.Sprint(release), func(t *testing.T) {
			for range 5 {
				e := newExecutor(t, reference.Target{Mutant: sut.NoConversationLock})
				e.execute(plan.Single("new", plan.TurnSend(conv, u(1), false)))
				ops := e.execute(plan.Burst(conv, 2, 2, release...))
				// Both ran on the committed base.
				base := []model.Token{u(1), u(1).Reply()}
				assert.Equal(t, append(base[:2:2], u(2)), firstCall(t, ops[0]))
				assert.Equal(t, append(base[:2:2], u(3)), firstCall(t, ops[1]))
				last := u(2 + release[1])
				next := e.execute(plan.Single("next", plan.TurnSend(conv, u(9), false)))
				assert.Equal(t, append(base[:2:2], last, last.Reply(), u(9)), firstCall(t, next[0]), "the later release wins")
			}
		})
	}
}

// TestRejectRefusesTheRest: under reject, the requests sent while the
// first is held get 409 and reach no model.
func TestRejectRefusesTheRest(t *testing.T) {
	e := newExecutor(t, reference.Target{Concurrency: sut.Reject})
	ops := e.execute(plan.Burst(model.ConversationRef{Key: "key-a", ID: "c"}, 1, 4, 3, 2, 1, 0))
	assert.Equal(t, model.OK, ops[0].Response.Outcome)
	for _, op := range ops[1:] {
		assert.Equal(t, 409, op.Response.Status)
		assert.Empty(t, op.Turn.Calls)
	}
}

// TestAbortInABurst: an aborted request lets the queue go on, and its
// outcome is unknown.
func TestAbortInABurst(t *testing.T) {
	e := newExecutor(t, reference.Target{})
	conv := model.ConversationRef{Key: "key-a", ID: "c"}
	p := plan.Burst(conv, 1, 3, 0, 1, 2)
	p.Sends[0].Abort = true
	p.Sends[1].Fault = faults.Fault{Kind: faults.Status, Status: 502}
	ops := e.execute(p)
	assert.Equal(t, model.Unknown, ops[0].Response.Outcome)
	assert.Equal(t, model.Fail, ops[1].Response.Outcome)
	assert.Equal(t, model.OK, ops[2].Response.Outcome)
	turns := []model.Turn{ops[0].Turn, ops[1].Turn, ops[2].Turn}
	require.Nil(t, model.New().ApplyStep(turns))
}

// BenchmarkBursts measures bursts of 2 to 6 plain turns on one
// conversation against the in-process reference server, executed and
// checked (chain and linearizability): requests/s, to set beside
// BenchmarkBaseline's turns/s and BenchmarkSteps' steps/s.
func BenchmarkBursts(b *testing.B) {
	e := newExecutor(b, reference.Target{})
	ref := model.New()
	var history []history.Op
	tok, requests, conv := 0, 0, 0
	start := time.Now()
	for b.Loop() {
		n := 2 + requests%5
		if len(history) > 30 {
			// A fresh conversation now and then, as state-machine runs are
			// about 30 steps long, so histories stay as long as theirs.
			conv++
			history = history[:0]
			ref = model.New()
		}
		release := make([]int, n)
		for i := range release {
			release[i] = n - 1 - i
		}
		ops := e.execute(plan.Burst(model.ConversationRef{Key: "key-a", ID: fmt.Sprintf("c%d", conv)}, tok+1, n, release...))
		tok += n
		requests += n
		history = append(history, ops...)
		turns := make([]model.Turn, len(ops))
		for i, op := range ops {
			turns[i] = op.Turn
		}
		if v := ref.ApplyStep(turns); v != nil {
			b.Fatal(v)
		}
		if v := validate.CheckLinearizable(history, turns, false); v != nil {
			b.Fatal(v)
		}
	}
	b.ReportMetric(float64(requests)/time.Since(start).Seconds(), "requests/s")
}
