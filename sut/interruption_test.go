package sut_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Interruption: a client that disconnects mid-turn (interruption.go, T9,
// T10).

func TestParseInterruption(t *testing.T) {
	for in, want := range map[string]sut.Interruption{"": sut.Rollback, "rollback": sut.Rollback, "keep-consistent": sut.KeepConsistent} {
		got, err := sut.ParseInterruption(in)
		require.NoError(t, err, "%q", in)
		assert.Equal(t, want, got, "%q", in)
	}
	for _, in := range []string{"Rollback", "keep", "commit", " rollback"} {
		_, err := sut.ParseInterruption(in)
		require.Error(t, err, "%q", in)
		assert.Contains(t, err.Error(), "rollback", "the error names the valid values")
		assert.Contains(t, err.Error(), "keep-consistent", "the error names the valid values")
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
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1/v1/chat/completions",
		strings.NewReader(chatBody(t, false, user(tok))))
	req.Header.Set(sut.DefaultConversationHeader, conv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ServeHTTP(httptest.NewRecorder(), req)
	}()
	return done
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
