package model_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
)

// stamped is c stamped as arriving at at.
func stamped(c model.Call, when int64) model.Call { c.At = when; return c }

// TestTitleCallsAreAuxiliary: a title call carries the turn's user message
// but not its history. Split off, it raises no T2; left in, it would.
func TestTitleCallsAreAuxiliary(t *testing.T) {
	const u1, u2 = model.Token("tc-u1"), model.Token("tc-u2")
	first := ok(convA, u1, stamped(call(u1, u1), 1), stamped(call(u1, u1), 2))
	second := ok(convA, u2, stamped(call(u2, u2), 3), stamped(call(u2, u1, u1.Reply(), u2), 4))
	second.Reply = "tc-a2 acknowledges your message " + model.CallMark(4) + "."

	m := model.New()
	require.Nil(t, m.Apply(first))
	whole := second
	v := m.Apply(whole)
	require.NotNil(t, v, "the title call, judged as the turn's, reads as history lost")
	assert.Equal(t, model.T2, v.Invariant)

	m = model.New()
	first.SplitAuxiliary(nil)
	require.Nil(t, m.Apply(first), "on a new conversation, both calls show the same")
	second.SplitAuxiliary(nil)
	require.Len(t, second.Aux, 1)
	assert.Equal(t, int64(3), second.Aux[0].At, "the call whose reply did not reach the client")
	assert.Nil(t, m.Apply(second))
}

// TestAuxiliarySplitKeepsTheTurnsLoss: a server that lost the turn's
// history shows it in the call whose reply reached the client; a title
// call beside it does not hide that.
func TestAuxiliarySplitKeepsTheTurnsLoss(t *testing.T) {
	const u1, u2 = model.Token("tc-u1"), model.Token("tc-u2")
	m := model.New()
	require.Nil(t, m.Apply(ok(convA, u1, call(u1, u1))))
	for _, answered := range []int64{3, 4, 0} {
		lost := ok(convA, u2, stamped(call(u2, u2), 3), stamped(call(u2, u2), 4))
		lost.Reply = "tc-a2"
		if answered != 0 {
			lost.Reply += " " + model.CallMark(answered)
		}
		lost.SplitAuxiliary(nil)
		assert.Empty(t, lost.Aux, "calls that show the same are the turn's own")
		v := model.New()
		require.Nil(t, v.Apply(ok(convA, u1, call(u1, u1))))
		got := v.Apply(lost)
		require.NotNil(t, got, "answered by %d", answered)
		assert.Equal(t, model.T2, got.Invariant)
	}
	// Without a mark (a failed turn), the call that showed the most is the
	// turn's, and one that showed less beside it is auxiliary.
	failed := fail(convA, u2, stamped(call(u2, u2), 5), stamped(call(u2, u1, u1.Reply(), u2), 6))
	failed.SplitAuxiliary(nil)
	require.Len(t, failed.Aux, 1)
	assert.Equal(t, int64(5), failed.Aux[0].At)
	// A tool loop's calls and a retry show prefixes of the answer's: own.
	loop := ok(convA, u2, stamped(call(u2, u1, u1.Reply(), u2), 7), stamped(call(u2, u1, u1.Reply(), u2), 8),
		stamped(call(u2, u1, u1.Reply(), u2, "tc-a77"), 9))
	loop.Reply = "tc-a2 " + model.CallMark(9)
	loop.SplitAuxiliary(nil)
	assert.Empty(t, loop.Aux)
	assert.Len(t, loop.Calls, 3)
}

// TestAuxiliaryCallsAreCheckedForIsolation: an auxiliary call that carries
// another conversation's tokens is T5 all the same.
func TestAuxiliaryCallsAreCheckedForIsolation(t *testing.T) {
	const u1, u2, u3 = model.Token("tc-u1"), model.Token("tc-u2"), model.Token("tc-u3")
	m := model.New()
	require.Nil(t, m.Apply(ok(convA, u1, call(u1, u1))))
	require.Nil(t, m.Apply(ok(convB, u2, call(u2, u2))))
	leak := ok(convA, u3, stamped(call(u3, u2, u3), 3), stamped(call(u3, u1, u1.Reply(), u3), 4))
	leak.Reply = "tc-a3 " + model.CallMark(4)
	leak.SplitAuxiliary(nil)
	require.Len(t, leak.Aux, 1)
	v := m.Apply(leak)
	require.NotNil(t, v)
	assert.Equal(t, model.T5, v.Invariant)
}

// TestForgottenConversationStartsOver: under forgets, a conversation that
// enough others were used after may be gone whole and start over; one
// that could not have been evicted, or that is half gone, is T2.
func TestForgottenConversationStartsOver(t *testing.T) {
	const u1, u2, u3, u4 = model.Token("tc-u1"), model.Token("tc-u2"), model.Token("tc-u3"), model.Token("tc-u4")
	m := model.NewWith(model.Policies{Forgets: 1})
	require.Nil(t, m.Apply(ok(convA, u1, call(u1, u1))))
	v := m.Apply(ok(convA, u2, call(u2, u2)))
	require.NotNil(t, v, "no other conversation was used since: nothing was evicted")
	assert.Equal(t, model.T2, v.Invariant)

	m = model.NewWith(model.Policies{Forgets: 1})
	require.Nil(t, m.Apply(ok(convA, u1, call(u1, u1))))
	require.Nil(t, m.Apply(ok(convB, u2, call(u2, u2))))
	require.Nil(t, m.Apply(ok(convA, u3, call(u3, u3))), "evicted by convB's use, and starting over")
	assert.Equal(t, 1, m.Evictions())
	require.Nil(t, m.Apply(ok(convA, u4, call(u4, u3, u3.Reply(), u4))), "the new line goes on")

	m = model.NewWith(model.Policies{Forgets: 2})
	require.Nil(t, m.Apply(ok(convA, u1, call(u1, u1))))
	require.Nil(t, m.Apply(ok(convB, u2, call(u2, u2))))
	v = m.Apply(ok(convA, u3, call(u3, u3)))
	require.NotNil(t, v, "one other conversation is not a cache of two filled")
	assert.Equal(t, model.T2, v.Invariant)
}

// TestFailedWith200IsNoUnstoredResponse: a turn that failed with an error
// event under status 200 leaves a leftover of a failed turn, never one of
// a response not stored.
func TestFailedWith200IsNoUnstoredResponse(t *testing.T) {
	const u1, u2 = model.Token("tc-u1"), model.Token("tc-u2")
	m := model.New()
	failed := fail(convA, u1, call(u1, u1))
	failed.Status = 200
	require.Nil(t, m.Apply(failed))
	v := m.Apply(ok(convA, u2, call(u2, u1, u2)))
	require.NotNil(t, v)
	assert.Equal(t, model.T1, v.Invariant)
	assert.NotContains(t, v.Reason, "store: false")
}

// TestAuxiliaryInstructionsAreLearned: where a turn's answer names its
// call, the instruction of a call beside it is learned; a later turn whose
// client left after only such a call has no call of its own to judge.
func TestAuxiliaryInstructionsAreLearned(t *testing.T) {
	const u1, u2, u3 = model.Token("tc-u1"), model.Token("tc-u2"), model.Token("tc-u3")
	const agent, title = 11, 22
	withPrompt := func(c model.Call, p uint32) model.Call { c.Prompt = p; return c }
	m := model.New()
	first := ok(convA, u1, stamped(withPrompt(call(u1, u1), agent), 1), stamped(withPrompt(call(u1, u1), title), 2))
	first.Reply = "tc-a1 " + model.CallMark(1)
	learned := first.SplitAuxiliary(nil)
	assert.Equal(t, []uint32{title}, learned)
	require.Nil(t, m.Apply(first))

	// Its client left (a crash) after only the title call arrived.
	cut := unknown(convA, u2, stamped(withPrompt(call(u2, u2), title), 3))
	known := func(p uint32) bool { return p == title }
	unjudged := cut
	unjudged.SplitAuxiliary(nil)
	require.Len(t, unjudged.Calls, 1, "without what was learned, the title call is taken for the turn's own")
	cut.SplitAuxiliary(known)
	assert.Empty(t, cut.Calls)
	require.Len(t, cut.Aux, 1)
	require.Nil(t, m.Apply(cut), "the title call shows nothing of the conversation's state")
	require.Nil(t, m.Apply(ok(convA, u3, withPrompt(call(u3, u1, u1.Reply(), u3), agent))))
}

// TestTitleBeforeAnyLearnedIsSetApartByItsShape: a turn whose client left
// while the model held its title call, before any title was learned, its
// own call never sent (the reference server with titles, on a loaded
// machine, after a crash: "tc-a1 ... missing", T7). The title call shows
// the user messages alone and offers no tools: it is set apart. The
// turn's own call, showing the replies, is not; nor is a call of that
// shape made after the client left, nor one of a turn whose client did
// not leave.
func TestTitleBeforeAnyLearnedIsSetApartByItsShape(t *testing.T) {
	const u1, u3 = model.Token("tc-u1"), model.Token("tc-u3")
	first := ok(convA, u1, stamped(call(u1, u1), 1))
	first.Reply = "tc-a1 " + model.CallMark(1)
	left := func(c model.Call) model.Turn {
		tt := interrupted(convA, u3, 14, c)
		tt.Dropped = 12
		return tt
	}

	title := left(stamped(call(u3, u1, u3), 11))
	judged := title
	unsplit := model.New()
	require.Nil(t, unsplit.Apply(first))
	require.NotNil(t, unsplit.Apply(judged), "taken for the turn's own, the title call loses the reply")
	title.SplitAuxiliary(nil)
	assert.Empty(t, title.Calls)
	require.Len(t, title.Aux, 1)
	m := model.New()
	require.Nil(t, m.Apply(first))
	require.Nil(t, m.Apply(title))

	for _, c := range []struct {
		why  string
		turn model.Turn
	}{
		{"the turn's own call", left(stamped(call(u3, u1, u1.Reply(), u3), 11))},
		{"one offering tools", left(stamped(model.Call{History: []model.Token{u1, u3}, Turn: u3, Offers: true}, 11))},
		{"one made after its client left", left(stamped(call(u3, u1, u3), 13))},
		{"one of a turn that failed", fail(convA, u3, stamped(call(u3, u1, u3), 11))},
	} {
		tt := c.turn
		tt.SplitAuxiliary(nil)
		assert.Len(t, tt.Calls, 1, c.why)
	}
}
