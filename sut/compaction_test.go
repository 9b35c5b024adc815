package sut_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Compaction (compaction.go, T11) and what the store keeps of tool rounds.

// TestCompactionHidesEarlierToolRounds: once a turn would show the model
// more than CompactAfter messages, the tool rounds of earlier turns are
// hidden from it, for good; the turn's own rounds are not.
func TestCompactionHidesEarlierToolRounds(t *testing.T) {
	e := newToolEnv(t, sut.Config{CompactAfter: 5})
	e.model.script("tc-u1", ask(echo("c1", "a")))
	e.ok(t, "conv", "tc-u1", false)
	// Five messages shown: not past the bound.
	assert.Equal(t, lines("user tc-u1", "calls c1", "tool c1: a", "assistant tc-a1", "user tc-u2"),
		shape(e.history(t, "conv", "tc-u2")))
	// Seven: the earlier round is hidden; this turn's own round is not,
	// though the turn is still past the bound when it calls again.
	e.model.script("tc-u3", ask(echo("c2", "b")))
	reqs := e.ok(t, "conv", "tc-u3", false)
	require.Len(t, reqs, 2)
	earlier := lines("user tc-u1", "assistant tc-a1", "user tc-u2", "assistant tc-a2")
	assert.Equal(t, lines(earlier, "user tc-u3"), shape(reqs[0].messages))
	assert.Equal(t, lines(earlier, "user tc-u3", "calls c2", "tool c2: b"), shape(reqs[1].messages))
	// The next turn hides that round too.
	next := e.history(t, "conv", "tc-u4")
	assert.Equal(t, lines(earlier, "user tc-u3", "assistant tc-a3", "user tc-u4"), shape(next))
	assert.Empty(t, unpaired(next))
}

// compactThenFail commits a turn with a tool round, then runs a turn whose
// own first round takes it past CompactAfter (so that it hides the earlier
// round) and whose next model call fails. It returns the history of the
// plain turn after it, which is not past the bound itself.
func compactThenFail(t *testing.T, m sut.Mutant) []string {
	e := newToolEnv(t, sut.Config{CompactAfter: 6, Mutant: m})
	e.model.script("tc-u1", ask(echo("c1", "a")))
	e.ok(t, "conv", "tc-u1", false)
	e.model.script("tc-u2", ask(echo("c2", "b"), echo("c3", "c")), toolStep{fail: true})
	requireErrorBody(t, e.send(t, "conv", "tc-u2", false).wait(t), http.StatusBadGateway, "upstream_error")
	reqs := e.model.requestsOf("tc-u2")
	require.Len(t, reqs, 2)
	require.NotContains(t, shape(reqs[1].messages), "calls c1", "the failed turn must have hidden the earlier round")
	return shape(e.history(t, "conv", "tc-u3"))
}

// TestFailedTurnLeavesNoCompactionMarks: the marks a failed turn set on
// its working copy never show in the committed conversation; under
// shallow-clone they do.
func TestFailedTurnLeavesNoCompactionMarks(t *testing.T) {
	whole := lines("user tc-u1", "calls c1", "tool c1: a", "assistant tc-a1", "user tc-u3")
	t.Run("clean", func(t *testing.T) {
		assert.Equal(t, whole, compactThenFail(t, sut.Clean))
	})
	t.Run(string(sut.ShallowClone), func(t *testing.T) {
		got := compactThenFail(t, sut.ShallowClone)
		assert.NotEqual(t, whole, got, "the mutant's bug must show")
		assert.Equal(t, lines("user tc-u1", "assistant tc-a1", "user tc-u3"), got)
	})
}

// TestToolRoundsSurviveEvictionAndRestart: a tool round comes back whole
// from the store (its calls with their ids, names and arguments, its
// results with their ids), after an eviction and after a restart, also
// when it was written behind (ack-before-durable) and not yet flushed.
func TestToolRoundsSurviveEvictionAndRestart(t *testing.T) {
	defer sut.SetFlushInterval(time.Hour)()
	for _, m := range []sut.Mutant{sut.Clean, sut.AckBeforeDurable} {
		t.Run(fmt.Sprintf("mutant=%q", m), func(t *testing.T) {
			cfg := sut.Config{ConversationsMax: 1, Mutant: m}
			e := newToolEnv(t, cfg)
			e.model.script("tc-u1", ask(echo("c1", "a"), lookup("c2", "k")))
			reqs := e.ok(t, "c1", "tc-u1", true)
			require.Len(t, reqs, 2)
			round := reqs[1].messages[1:] // the user message, then the round
			e.history(t, "c2", "tc-u2")   // evicts c1
			want := append(append([]openai.Message{}, round...), openai.Message{Role: openai.RoleAssistant, Content: "tc-a1"})

			got := e.history(t, "c1", "tc-u3")
			assert.Equal(t, want, got[1:len(got)-1], "after an eviction")
			e.start(cfg)
			got = e.history(t, "c1", "tc-u4")
			assert.Equal(t, want, got[1:len(want)+1], "after a restart")
		})
	}
}

// TestCompactionMarksSurviveRestart: the marks an ok turn set are
// committed with it: a server restarted with a bound the conversation is
// not past still hides what was hidden.
func TestCompactionMarksSurviveRestart(t *testing.T) {
	defer sut.SetFlushInterval(time.Hour)()
	for _, m := range []sut.Mutant{sut.Clean, sut.AckBeforeDurable} {
		t.Run(fmt.Sprintf("mutant=%q", m), func(t *testing.T) {
			e := newToolEnv(t, sut.Config{CompactAfter: 5, Mutant: m})
			e.model.script("tc-u1", ask(echo("c1", "a")))
			e.ok(t, "conv", "tc-u1", false)
			e.history(t, "conv", "tc-u2")
			hidden := lines("user tc-u1", "assistant tc-a1", "user tc-u2", "assistant tc-a2", "user tc-u3")
			require.Equal(t, hidden, shape(e.history(t, "conv", "tc-u3")))

			e.start(sut.Config{CompactAfter: 100, Mutant: m})
			assert.Equal(t, lines(hidden, "assistant tc-a3", "user tc-u4"), shape(e.history(t, "conv", "tc-u4")))
		})
	}
}

// TestKeptPrefixCarriesItsMarks: an interrupted turn that keeps its
// completed rounds commits the marks its compaction set with them.
func TestKeptPrefixCarriesItsMarks(t *testing.T) {
	e := newToolEnv(t, sut.Config{CompactAfter: 6, Interruption: sut.KeepConsistent})
	e.model.script("tc-u1", ask(echo("c1", "a")))
	e.ok(t, "conv", "tc-u1", false)
	h := newHeld()
	e.model.script("tc-u2", ask(echo("c2", "b"), echo("c3", "c")), toolStep{hold: h})
	e.interrupt(t, "conv", "tc-u2", false, h)

	e.start(sut.Config{CompactAfter: 100, Interruption: sut.KeepConsistent})
	next := e.history(t, "conv", "tc-u3")
	assert.Equal(t, lines("user tc-u1", "assistant tc-a1", "user tc-u2", "calls c2,c3", "tool c2: b", "tool c3: c", "user tc-u3"), shape(next))
	assert.Empty(t, unpaired(next))
}
