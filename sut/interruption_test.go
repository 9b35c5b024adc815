package sut_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Interruption: a client that disconnects mid-turn (interruption.go, T9,
// T10).

func TestParseInterruption(t *testing.T) {
	for in, want := range map[string]sut.Interruption{"": sut.Rollback, "rollback": sut.Rollback, "keep-consistent": sut.KeepConsistent, "complete": sut.Complete} {
		got, err := sut.ParseInterruption(in)
		require.NoError(t, err, "%q", in)
		assert.Equal(t, want, got, "%q", in)
	}
	for _, in := range []string{"Rollback", "keep", "commit", " rollback", "Complete", "completed"} {
		_, err := sut.ParseInterruption(in)
		require.Error(t, err, "%q", in)
		for _, valid := range []sut.Interruption{sut.Rollback, sut.KeepConsistent, sut.Complete} {
			assert.Contains(t, err.Error(), string(valid), "the error names the valid values")
		}
	}
}

// TestInterruptionDuringAModelCall: a client that disconnects while a
// model call of its turn is held stops the turn: the call is cancelled and
// no model call follows. Under rollback nothing is committed; under
// keep-consistent the user message and the rounds that completed are, and
// nothing when none did.
func TestInterruptionDuringAModelCall(t *testing.T) {
	for _, tc := range []struct {
		policy sut.Interruption
		round  int // the round whose model call is held, from 0
		stream bool
		kept   []string
	}{
		{sut.Rollback, 1, false, nil},
		{sut.Rollback, 1, true, nil},
		{"", 1, false, nil},
		{sut.KeepConsistent, 1, false, lines("user tc-u2", "calls c1,c2", "tool c1: a", "tool c2: value-of-k")},
		{sut.KeepConsistent, 1, true, lines("user tc-u2", "calls c1,c2", "tool c1: a", "tool c2: value-of-k")},
		{sut.KeepConsistent, 0, false, nil},
		{sut.KeepConsistent, 2, true, lines("user tc-u2", "calls c1,c2", "tool c1: a", "tool c2: value-of-k", "calls c3", "tool c3: b")},
	} {
		name := string(tc.policy)
		if name == "" {
			name = "default"
		}
		t.Run(fmt.Sprintf("%s/round %d/stream=%t", name, tc.round+1, tc.stream), func(t *testing.T) {
			e := newToolEnv(t, sut.Config{Interruption: tc.policy})
			committed := shape(e.history(t, "conv", "tc-u1"))
			steps := []toolStep{ask(echo("c1", "a"), lookup("c2", "k")), ask(echo("c3", "b")), {}}
			h := newHeld()
			steps[tc.round].hold = h
			e.model.script("tc-u2", steps...)
			e.interrupt(t, "conv", "tc-u2", tc.stream, h)
			assert.Len(t, e.model.requestsOf("tc-u2"), tc.round+1, "no model call after the disconnect")

			next := e.history(t, "conv", "tc-u3")
			assert.Equal(t, lines(committed, "assistant tc-a1", tc.kept, "user tc-u3"), shape(next))
			assert.Empty(t, unpaired(next))
		})
	}
}

// serveInProcess runs a turn through the server's handler with a context
// the test ends: the server sees the disconnect the moment the test
// cancels, with no connection in between to decide when. It returns a
// channel closed when the handler has returned.
func serveInProcess(t testing.TB, s *sut.Server, ctx context.Context, conv, tok string) <-chan struct{} {
	t.Helper()
	_, done := serveRecorded(t, s, ctx, conv, tok, false)
	return done
}

// serveRecorded is serveInProcess, streamed or not, with the recorder
// of the response: read it only once the channel is closed.
func serveRecorded(t testing.TB, s *sut.Server, ctx context.Context, conv, tok string, stream bool) (*httptest.ResponseRecorder, <-chan struct{}) {
	t.Helper()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1/v1/chat/completions",
		strings.NewReader(chatBody(t, stream, user(tok))))
	req.Header.Set(sut.DefaultConversationHeader, conv)
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ServeHTTP(rec, req)
	}()
	return rec, done
}

// interruptDuringLookup runs a turn whose one round is two lookups,
// disconnects its client while the first is held, and reports whether the
// second started after the disconnect. Whatever the answer, the turn must
// roll back and no model call may follow.
func interruptDuringLookup(t *testing.T, m sut.Mutant) bool {
	model := startToolModel(t)
	s, err := sut.New(sut.Config{ModelURL: model.URL(), DataDir: t.TempDir(), Mutant: m})
	require.NoError(t, err)
	defer func() { assert.NoError(t, s.Close()) }()
	<-serveInProcess(t, s, context.Background(), "conv", "tc-u1")

	model.script("tc-u2", ask(lookup("c1", "held"), lookup("c2", "next")))
	h := model.holdLookup("held")
	ctx, cancel := context.WithCancel(context.Background())
	done := serveInProcess(t, s, ctx, "conv", "tc-u2")
	await(t, h.arrived, "the held lookup")
	cancel()
	// The server has seen the disconnect: its request context is ours.
	// Only now may the held lookup answer; a server that still wants its
	// result gets it, and a server that goes on runs the next tool.
	h.open()
	await(t, done, "the turn to end")
	// Every lookup the turn started ended before its handler returned.
	started := slices.Contains(model.lookupKeys(), "next")
	assert.Len(t, model.requestsOf("tc-u2"), 1, "no model call after the disconnect")
	<-serveInProcess(t, s, context.Background(), "conv", "tc-u3")
	reqs := model.requestsOf("tc-u3")
	require.Len(t, reqs, 1)
	assert.Equal(t, lines("user tc-u1", "assistant tc-a1", "user tc-u3"), shape(reqs[0].messages), "the turn rolled back")
	return started
}

// TestNoToolStartsAfterTheDisconnect: the lookup running when the client
// disconnects is cancelled, and the next tool of the round never starts;
// under tool-runs-after-cancel it does.
func TestNoToolStartsAfterTheDisconnect(t *testing.T) {
	t.Run("clean", func(t *testing.T) {
		assert.False(t, interruptDuringLookup(t, sut.Clean), "a tool started after the disconnect")
	})
	t.Run(string(sut.ToolRunsAfterCancel), func(t *testing.T) {
		assert.True(t, interruptDuringLookup(t, sut.ToolRunsAfterCancel), "the mutant's bug must show")
	})
}

// interruptRoundCutShort disconnects the client while the second tool of
// a round runs, its first result in, and returns the next turn's history.
func interruptRoundCutShort(t *testing.T, cfg sut.Config) []openai.Message {
	e := newToolEnv(t, cfg)
	e.history(t, "conv", "tc-u1")
	e.model.script("tc-u2", ask(echo("c1", "a"), echo("c2", "b")), ask(echo("c3", "c"), lookup("c4", "held")))
	e.interrupt(t, "conv", "tc-u2", true, e.model.holdLookup("held"))
	return e.history(t, "conv", "tc-u3")
}

// TestInterruptedRoundLeavesNoOrphan: a round cut short by a disconnect
// is never committed, under either policy; keep-consistent keeps the
// rounds before it. Under orphan-tool-call-on-interrupt the working copy
// is committed as it stands, a call without its result included, whatever
// the policy.
func TestInterruptedRoundLeavesNoOrphan(t *testing.T) {
	round1 := lines("calls c1,c2", "tool c1: a", "tool c2: b")
	for _, policy := range []sut.Interruption{sut.Rollback, sut.KeepConsistent} {
		t.Run(string(policy), func(t *testing.T) {
			t.Run("clean", func(t *testing.T) {
				next := interruptRoundCutShort(t, sut.Config{Interruption: policy})
				want := lines("user tc-u1", "assistant tc-a1", "user tc-u3")
				if policy == sut.KeepConsistent {
					want = lines("user tc-u1", "assistant tc-a1", "user tc-u2", round1, "user tc-u3")
				}
				assert.Equal(t, want, shape(next))
				assert.Empty(t, unpaired(next))
			})
			t.Run(string(sut.OrphanToolCallOnInterrupt), func(t *testing.T) {
				next := interruptRoundCutShort(t, sut.Config{Interruption: policy, Mutant: sut.OrphanToolCallOnInterrupt})
				assert.Equal(t, lines("user tc-u1", "assistant tc-a1", "user tc-u2", round1, "calls c3,c4", "tool c3: c", "user tc-u3"), shape(next))
				assert.Equal(t, "call c4 without its result", unpaired(next), "the mutant's bug must show")
			})
		})
	}
}

// toolMutants are the mutants the tool tests show, each beside the clean
// server: TestNoToolStartsAfterTheDisconnect, TestInterruptedRoundLeavesNoOrphan
// and TestFailedTurnLeavesNoCompactionMarks.
var toolMutants = []sut.Mutant{sut.ToolRunsAfterCancel, sut.OrphanToolCallOnInterrupt, sut.ShallowClone}

// TestCrashIsNoInterruption: a crash drops the connections of the turns
// in flight, but a killed process commits nothing: not even the completed
// rounds that keep-consistent keeps of a turn whose client disconnected.
func TestCrashIsNoInterruption(t *testing.T) {
	cfg := sut.Config{Interruption: sut.KeepConsistent}
	e := newToolEnv(t, cfg)
	e.history(t, "conv", "tc-u1")
	h := newHeld()
	e.model.script("tc-u2", ask(echo("c1", "a")), toolStep{hold: h})
	f := e.send(t, "conv", "tc-u2", false)
	await(t, h.arrived, "the held call of tc-u2")
	require.NoError(t, e.srv.Crash())
	<-f.done
	require.Error(t, f.err, "a client of a crashed server hears no reply")

	e.start(cfg)
	assert.Equal(t, lines("user tc-u1", "assistant tc-a1", "user tc-u3"), shape(e.history(t, "conv", "tc-u3")))
}

// ---------------------------------------------------------------------------
// The complete policy: a turn whose client disconnects runs on to its end,
// and commits whole or not at all, as if the client had stayed.

// completeEnv is a server under Complete in front of a tool model, served
// in-process, so that the server sees a client go the moment the test
// says; its conversation "conv" has one committed turn, tc-u1.
type completeEnv struct {
	model *toolModel
	srv   *sut.Server
	gauge *sut.Gauge
}

func newCompleteEnv(t *testing.T, policy sut.Concurrency) *completeEnv {
	t.Helper()
	c := &completeEnv{model: startToolModel(t), gauge: &sut.Gauge{}}
	var err error
	c.srv, err = sut.New(sut.Config{ModelURL: c.model.URL(), DataDir: t.TempDir(),
		Interruption: sut.Complete, Concurrency: policy, Gauge: c.gauge})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.srv.Close()) })
	<-serveInProcess(t, c.srv, context.Background(), "conv", "tc-u1")
	return c
}

// leave sends the turn tok on conv, waits for h (a held model call or
// lookup of it) to arrive and disconnects the client. The server has seen
// the disconnect when leave returns, and still works on the turn: h holds
// it. It returns a channel closed when the handler has returned.
func (c *completeEnv) leave(t *testing.T, tok string, stream bool, h *held) <-chan struct{} {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	_, done := serveRecorded(t, c.srv, ctx, "conv", tok, stream)
	await(t, h.arrived, "the held call of "+tok)
	cancel()
	working, waiting, _ := c.gauge.Read()
	assert.Equal(t, [2]int{1, 0}, [2]int{working, waiting}, "the turn the client left still counts as working")
	return done
}

// history is what the first model request of the plain turn tok on conv
// carried: the conversation as committed, then tok.
func (c *completeEnv) history(t *testing.T, tok string) []openai.Message {
	t.Helper()
	<-serveInProcess(t, c.srv, context.Background(), "conv", tok)
	reqs := c.model.requestsOf(tok)
	require.Len(t, reqs, 1, "a turn without tools makes one model call")
	return reqs[0].messages
}

// finish releases h, waits for the turn to end, and checks that the server
// never gave up h and is idle after.
func (c *completeEnv) finish(t *testing.T, h *held, done <-chan struct{}) {
	t.Helper()
	h.open()
	await(t, done, "the turn to complete")
	select {
	case <-h.gone:
		assert.Fail(t, "the server gave up a call of a turn it should complete")
	default:
	}
	awaitIdle(t, c.gauge)
}

// TestCompleteRunsAnInterruptedTurnToItsEnd: under complete, a client that
// disconnects while a model call of its turn is held does not stop the
// turn: once the call goes on, the later rounds run, and the turn, its
// reply included, is committed whole.
func TestCompleteRunsAnInterruptedTurnToItsEnd(t *testing.T) {
	whole := lines("user tc-u2", "calls c1,c2", "tool c1: a", "tool c2: value-of-k", "calls c3", "tool c3: b", "assistant tc-a2")
	for _, tc := range []struct {
		round  int // the round whose model call is held, from 0
		stream bool
	}{{0, false}, {1, false}, {1, true}, {2, false}, {2, true}} {
		t.Run(fmt.Sprintf("round %d/stream=%t", tc.round+1, tc.stream), func(t *testing.T) {
			c := newCompleteEnv(t, sut.Serialize)
			steps := []toolStep{ask(echo("c1", "a"), lookup("c2", "k")), ask(echo("c3", "b")), {}}
			h := newHeld()
			steps[tc.round].hold = h
			c.model.script("tc-u2", steps...)
			c.finish(t, h, c.leave(t, "tc-u2", tc.stream, h))
			assert.Len(t, c.model.requestsOf("tc-u2"), 3, "every round ran, after the disconnect too")

			next := c.history(t, "tc-u3")
			assert.Equal(t, lines("user tc-u1", "assistant tc-a1", whole, "user tc-u3"), shape(next))
			assert.Empty(t, unpaired(next))
		})
	}
}

// TestCompleteGoesOnAfterATool: under complete, a client that disconnects
// while a lookup of its turn runs does not stop the round: the next tool
// and the next model call run, and the turn is committed whole.
func TestCompleteGoesOnAfterATool(t *testing.T) {
	c := newCompleteEnv(t, sut.Serialize)
	c.model.script("tc-u2", ask(lookup("c1", "held"), lookup("c2", "next")))
	h := c.model.holdLookup("held")
	c.finish(t, h, c.leave(t, "tc-u2", true, h))
	assert.Equal(t, []string{"held", "next"}, c.model.lookupKeys(), "the round's next tool ran")
	assert.Len(t, c.model.requestsOf("tc-u2"), 2, "the model was called again after the round")

	next := c.history(t, "tc-u3")
	assert.Equal(t, lines("user tc-u1", "assistant tc-a1",
		"user tc-u2", "calls c1,c2", "tool c1: value-of-held", "tool c2: value-of-next", "assistant tc-a2",
		"user tc-u3"), shape(next))
}

// TestCompleteCommitsNothingOfAFailedTurn: under complete, a turn whose
// client left and whose model then fails commits nothing, not even the
// rounds that completed: as if the client had stayed.
func TestCompleteCommitsNothingOfAFailedTurn(t *testing.T) {
	c := newCompleteEnv(t, sut.Serialize)
	h := newHeld()
	c.model.script("tc-u2", ask(echo("c1", "a")), toolStep{hold: h, fail: true})
	c.finish(t, h, c.leave(t, "tc-u2", false, h))
	assert.Len(t, c.model.requestsOf("tc-u2"), 2)
	assert.Equal(t, lines("user tc-u1", "assistant tc-a1", "user tc-u3"), shape(c.history(t, "tc-u3")))
}

// TestCompleteHoldsTheConversation: under complete, a turn whose client
// left holds its conversation until it has ended: the next turn waits
// for it under serialize, and then sees it; under reject it gets 409.
func TestCompleteHoldsTheConversation(t *testing.T) {
	t.Run(string(sut.Serialize), func(t *testing.T) {
		c := newCompleteEnv(t, sut.Serialize)
		h := newHeld()
		c.model.script("tc-u2", toolStep{hold: h})
		done := c.leave(t, "tc-u2", false, h)
		rec, next := serveRecorded(t, c.srv, context.Background(), "conv", "tc-u3", false)
		awaitWaiting(t, c.gauge, 1)
		assert.Empty(t, c.model.requestsOf("tc-u3"), "the next turn waits")
		c.finish(t, h, done)
		await(t, next, "the next turn")
		assert.Equal(t, http.StatusOK, rec.Code, "%s", rec.Body)
		reqs := c.model.requestsOf("tc-u3")
		require.Len(t, reqs, 1)
		assert.Equal(t, lines("user tc-u1", "assistant tc-a1", "user tc-u2", "assistant tc-a2", "user tc-u3"), shape(reqs[0].messages))
	})
	t.Run(string(sut.Reject), func(t *testing.T) {
		c := newCompleteEnv(t, sut.Reject)
		h := newHeld()
		c.model.script("tc-u2", toolStep{hold: h})
		done := c.leave(t, "tc-u2", true, h)
		rec, next := serveRecorded(t, c.srv, context.Background(), "conv", "tc-u3", false)
		await(t, next, "the rejected turn")
		assert.Equal(t, http.StatusConflict, rec.Code, "%s", rec.Body)
		assert.Empty(t, c.model.requestsOf("tc-u3"))
		c.finish(t, h, done)
		assert.Equal(t, lines("user tc-u1", "assistant tc-a1", "user tc-u2", "assistant tc-a2", "user tc-u4"), shape(c.history(t, "tc-u4")))
	})
}

// TestCompleteAndTheServersStop: a turn whose client left, under complete,
// is a turn in flight: a graceful stop waits for it, and it is committed;
// a stop past its deadline drops it, and a crash kills it: neither commits
// anything of it.
func TestCompleteAndTheServersStop(t *testing.T) {
	cfg := sut.Config{Interruption: sut.Complete}
	for _, stop := range []string{"graceful", "past the deadline", "crash"} {
		t.Run(stop, func(t *testing.T) {
			e := newToolEnv(t, cfg)
			e.history(t, "conv", "tc-u1")
			h := newHeld()
			e.model.script("tc-u2", ask(echo("c1", "a")), toolStep{hold: h})
			f := e.send(t, "conv", "tc-u2", true)
			await(t, h.arrived, "the held call of tc-u2")
			f.cancel()
			<-f.done
			kept := lines("user tc-u1", "assistant tc-a1", "user tc-u3")
			switch stop {
			case "graceful":
				stopped := make(chan error, 1)
				go func() { stopped <- e.srv.Shutdown(context.Background()) }()
				awaitNotListening(t, e.srv.URL())
				// The stop has begun, and the turn is still held.
				h.open()
				require.NoError(t, <-stopped)
				kept = lines("user tc-u1", "assistant tc-a1", "user tc-u2", "calls c1", "tool c1: a", "assistant tc-a2", "user tc-u3")
			case "past the deadline":
				ctx, cancel := context.WithTimeout(context.Background(), 0)
				defer cancel()
				require.ErrorIs(t, e.srv.Shutdown(ctx), context.DeadlineExceeded)
				await(t, h.gone, "the server to give up the held call")
			case "crash":
				require.NoError(t, e.srv.Crash())
				await(t, h.gone, "the server to give up the held call")
			}
			e.start(cfg)
			next := e.history(t, "conv", "tc-u3")
			assert.Equal(t, kept, shape(next))
		})
	}
}

// awaitNotListening waits until the server at base refuses connections.
func awaitNotListening(t testing.TB, base string) {
	t.Helper()
	addr := strings.TrimPrefix(base, "http://")
	failsafe := time.Now().Add(requestDeadline)
	for time.Now().Before(failsafe) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return
		}
		_ = c.Close()
		time.Sleep(time.Millisecond)
	}
	require.FailNow(t, "the server still listens")
}
