package model_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
)

// at places a turn on the run's timeline: sent at invoke, its first call
// arriving at call, its outcome learned at ret.
func at(t model.Turn, invoke, call, ret int64) model.Turn {
	t.Invoke, t.Return = invoke, ret
	calls := make([]model.Call, len(t.Calls))
	for i, c := range t.Calls {
		c.At = call + int64(i)
		calls[i] = c
	}
	t.Calls = calls
	return t
}

// conflict is a usable turn refused with 409.
func conflict(conv model.ConversationRef, user model.Token) model.Turn {
	return model.Turn{Conv: conv, User: user, Usable: true, Outcome: model.Fail, Status: 409}
}

func TestApplyStepSerializedBurst(t *testing.T) {
	// Three turns sent at once on a new id; the server ran them one by one
	// (calls at 4, 6, 8), each on the history the one before left, and
	// not in the order they were sent: the model follows the server.
	m := model.New()
	v := m.ApplyStep([]model.Turn{
		at(ok(convA, u(1), call(u(1), u(1))), 1, 4, 5),
		at(ok(convA, u(2), call(u(2), u(1), a(1), u(3), a(3), u(2))), 2, 8, 9),
		at(ok(convA, u(3), call(u(3), u(1), a(1), u(3))), 3, 6, 7),
	})
	require.Nil(t, v)
	assert.Equal(t, h(u(1), a(1), u(3), a(3), u(2), a(2)), m.Committed(convA))
	assert.Equal(t, 1, m.Checked()[model.T4])
}

func TestApplyStepFork(t *testing.T) {
	// fork-new-session: both first turns ran on the empty history.
	m := model.New()
	b := at(ok(convA, u(2), call(u(2), u(2))), 2, 4, 6)
	v := m.ApplyStep([]model.Turn{at(ok(convA, u(1), call(u(1), u(1))), 1, 3, 5), b})
	requireViolation(t, v, model.T4, b)
	assert.Contains(t, v.Reason, "fork")
	assert.Equal(t, h(u(1), a(1), u(2)), v.Expected)
}

func TestApplyStepForkOnAnExistingConversation(t *testing.T) {
	// no-conversation-lock: two continuations ran on the same committed
	// base, and the later commit won.
	m := model.New()
	require.Nil(t, m.Apply(at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
	b := at(ok(convA, u(3), call(u(3), u(1), a(1), u(3))), 5, 7, 9)
	v := m.ApplyStep([]model.Turn{at(ok(convA, u(2), call(u(2), u(1), a(1), u(2))), 4, 6, 8), b})
	requireViolation(t, v, model.T4, b)
}

func TestLostTurnIsT2NotT4(t *testing.T) {
	// The same missing turn, but it had completed before this one was
	// sent: a committed turn was lost, not a fork.
	m := model.New()
	require.Nil(t, m.Apply(at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
	lost := at(ok(convA, u(2), call(u(2), u(2))), 4, 5, 6)
	requireViolation(t, m.Apply(lost), model.T2, lost)
}

func TestConflictUnderReject(t *testing.T) {
	held := at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 6)
	t.Run("while another turn runs", func(t *testing.T) {
		m := model.NewWith(model.Policies{Concurrency: model.Reject})
		require.Nil(t, m.ApplyStep([]model.Turn{held, at(conflict(convA, u(2)), 3, 0, 4)}))
		assert.Equal(t, h(u(1), a(1)), m.Committed(convA))
		// The refused turn changed nothing: the next turn sees no trace.
		require.Nil(t, m.Apply(at(ok(convA, u(3), call(u(3), u(1), a(1), u(3))), 7, 8, 9)))
	})
	t.Run("spurious: nothing was running", func(t *testing.T) {
		m := model.NewWith(model.Policies{Concurrency: model.Reject})
		require.Nil(t, m.Apply(held))
		spurious := at(conflict(convA, u(2)), 7, 0, 8)
		v := m.Apply(spurious)
		requireViolation(t, v, model.T4, spurious)
		assert.Contains(t, v.Reason, "spurious 409")
	})
	t.Run("after a turn whose outcome is unknown", func(t *testing.T) {
		// The aborted turn may still be running on the server.
		m := model.NewWith(model.Policies{Concurrency: model.Reject})
		require.Nil(t, m.Apply(at(unknown(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
		require.Nil(t, m.Apply(at(conflict(convA, u(2)), 4, 0, 5)))
	})
	t.Run("several after a turn whose outcome is unknown", func(t *testing.T) {
		m := model.NewWith(model.Policies{Concurrency: model.Reject})
		require.Nil(t, m.Apply(at(unknown(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
		require.Nil(t, m.Apply(at(conflict(convA, u(2)), 4, 0, 5)))
		require.Nil(t, m.Apply(at(conflict(convA, u(3)), 6, 0, 7)))
		// A turn that went through shows the conversation free again.
		require.Nil(t, m.Apply(at(ok(convA, u(4), call(u(4), u(4))), 8, 9, 10)))
		spurious := at(conflict(convA, u(5)), 11, 0, 12)
		requireViolation(t, m.Apply(spurious), model.T4, spurious)
	})
	t.Run("another conversation's turn does not count", func(t *testing.T) {
		m := model.NewWith(model.Policies{Concurrency: model.Reject})
		other := at(ok(convB, u(1), call(u(1), u(1))), 1, 2, 6)
		refused := at(conflict(convA, u(2)), 3, 0, 4)
		requireViolation(t, m.ApplyStep([]model.Turn{other, refused}), model.T4, refused)
	})
	t.Run("a refused turn that leaks into the history", func(t *testing.T) {
		m := model.NewWith(model.Policies{Concurrency: model.Reject})
		require.Nil(t, m.ApplyStep([]model.Turn{held, at(conflict(convA, u(2)), 3, 0, 4)}))
		next := at(ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))), 7, 8, 9)
		requireViolation(t, m.Apply(next), model.T4, next)
	})
}

func TestConflictUnderSerialize(t *testing.T) {
	m := model.New()
	held := at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 6)
	refused := at(conflict(convA, u(2)), 3, 0, 4)
	v := m.ApplyStep([]model.Turn{held, refused})
	requireViolation(t, v, model.T4, refused)
	assert.Contains(t, v.Reason, "serialize")
}

func TestLineIsAValue(t *testing.T) {
	// Step never changes the line it is called on: porcupine explores
	// several orders from one state.
	var l model.Line
	l1, v := l.Step(ok(convA, u(1), call(u(1), u(1))))
	require.Nil(t, v)
	l2, v := l1.Step(unknown(convA, u(2), call(u(2), u(1), a(1), u(2))))
	require.Nil(t, v)
	_, v = l1.Step(fail(convA, u(3), call(u(3), u(1), a(1), u(3))))
	require.Nil(t, v)
	assert.Equal(t, "(empty)", l.String())
	assert.Equal(t, "tc-u1 tc-a1", l1.String())
	assert.Equal(t, "tc-u1 tc-a1 tc-u2? tc-a2?", l2.String())
	assert.False(t, l1.Equal(l2))
	assert.NotEqual(t, l1.Hash(), l2.Hash())

	// A failed step leaves the line as it was and says why.
	same, v := l1.Step(ok(convA, u(4), call(u(4), u(4))))
	require.NotNil(t, v)
	assert.True(t, same.Equal(l1))
	assert.Equal(t, l1.Hash(), same.Hash())
}

func TestContainsTokenAgreesWithTokens(t *testing.T) {
	texts := []string{"", "tc-a1", "tc-a12", "xtc-a1", "tc-a1x", "tc-a1_", "(tc-a1).", "tc-a10 tc-a1", "tc-a1tc-a1", "-tc-a1-", "tc-a1\n"}
	for _, text := range texts {
		want := false
		for _, tok := range model.Tokens(text) {
			want = want || tok == a(1)
		}
		turn := ok(convA, u(1), call(u(1), u(1)))
		turn.Reply = text
		got := model.New().Apply(turn) == nil
		assert.Equal(t, want, got, "reply %q", text)
	}
}

// TestBranches: two turns chained from one base at once (the Responses
// API) each see the base and their own turn, and go on as branches of
// their own; a branch that shows another's turn ran on one line with it,
// a fork (T4), and a branch that shows another conversation's turn leaks
// (T5).
func TestBranches(t *testing.T) {
	base := model.ConversationRef{Key: "k", ID: "base"}
	left := model.ConversationRef{Key: "k", ID: "left"}
	right := model.ConversationRef{Key: "k", ID: "right"}
	setup := func() *model.Model {
		m := model.New()
		require.Nil(t, m.Apply(at(ok(base, u(1), call(u(1), u(1))), 1, 2, 3)))
		require.Nil(t, m.Apply(at(ok(convB, u(9), call(u(9), u(9))), 4, 5, 6)))
		m.Fork(base, left)
		m.Fork(base, right)
		return m
	}
	m := setup()
	require.Nil(t, m.ApplyStep([]model.Turn{
		at(ok(base, u(2), call(u(2), u(1), a(1), u(2))), 7, 8, 11),
		at(ok(left, u(3), call(u(3), u(1), a(1), u(3))), 7, 9, 12),
		at(ok(right, u(4), call(u(4), u(1), a(1), u(4))), 7, 10, 13),
	}))
	assert.Equal(t, 1, m.Checked()[model.T4], "branches that ran at once exercise T4")
	assert.Equal(t, h(u(1), a(1), u(3), a(3)), m.Committed(left))
	require.Nil(t, m.Apply(at(ok(left, u(5), call(u(5), u(1), a(1), u(3), a(3), u(5))), 14, 15, 16)),
		"a branch goes on on its own")

	for name, tc := range map[string]struct {
		history []model.Token
		breaks  model.Invariant
	}{
		"a sibling's turn":          {h(u(1), a(1), u(3), a(3), u(4)), model.T4},
		"the base's later turn":     {h(u(1), a(1), u(2), a(2), u(4)), model.T4},
		"another conversation's":    {h(u(1), a(1), u(9), a(9), u(4)), model.T5},
		"the base's turn, lost":     {h(u(4)), model.T2},
		"the inherited turn, whole": {h(u(1), a(1), u(4)), ""},
	} {
		m := setup()
		require.Nil(t, m.ApplyStep([]model.Turn{
			at(ok(base, u(2), call(u(2), u(1), a(1), u(2))), 7, 8, 11),
			at(ok(left, u(3), call(u(3), u(1), a(1), u(3))), 7, 9, 12),
		}))
		turn := at(ok(right, u(4), call(u(4), tc.history...)), 14, 15, 16)
		v := m.Apply(turn)
		if tc.breaks == "" {
			assert.Nil(t, v, name)
			continue
		}
		requireViolation(t, v, tc.breaks, turn)
	}
}

// A burst a supersede agent took out of the order sent (docker-agent's
// ACP handlers take prompts as they are scheduled): prompts 2 and 4 ran
// (calls at 5 and 6), prompt 3 was taken after 4 and cancelled before it
// reached the model, and each cancelled prompt's message was kept
// (keep-consistent) in the order taken. A turn that reached no model is
// placed where the step's latest history shows it: after the turn before
// it there, not by when it was sent.
func TestApplyStepTakesTheOrderShown(t *testing.T) {
	setup := at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)
	burst := func(last model.Call) []model.Turn {
		i2 := at(interrupted(convA, u(2), 0, call(u(2), u(1), a(1), u(2))), 10, 15, 20)
		i3 := at(interrupted(convA, u(3), 0), 11, 0, 20)
		i4 := at(interrupted(convA, u(4), 0, call(u(4), u(1), a(1), u(2), u(4))), 12, 16, 20)
		ok5 := at(ok(convA, u(5), last), 13, 18, 21)
		return []model.Turn{i2, i3, i4, ok5}
	}
	t.Run("kept in the order taken", func(t *testing.T) {
		m := model.NewWith(keep)
		require.Nil(t, m.Apply(setup))
		require.Nil(t, m.ApplyStep(burst(call(u(5), u(1), a(1), u(2), u(4), u(3), u(5)))))
		assert.Equal(t, h(u(1), a(1), u(2), u(4), u(3), u(5), a(5)), m.Committed(convA))
	})
	t.Run("a prompt taken, then superseded, whose call came after the next one's", func(t *testing.T) {
		// docker-agent's serve acp: prompt 3 was stored and superseded
		// by prompt 4, and its model call reached the model after 4's.
		m := model.NewWith(keep)
		require.Nil(t, m.Apply(setup))
		i2 := at(interrupted(convA, u(2), 0, call(u(2), u(1), a(1), u(2))), 10, 14, 20)
		i3 := at(interrupted(convA, u(3), 0, call(u(3), u(1), a(1), u(2), u(3))), 11, 17, 20)
		ok4 := at(ok(convA, u(4), call(u(4), u(1), a(1), u(2), u(3), u(4))), 12, 16, 21)
		require.Nil(t, m.ApplyStep([]model.Turn{i2, i3, ok4}))
		assert.Equal(t, h(u(1), a(1), u(2), u(3), u(4), a(4)), m.Committed(convA))
	})
	t.Run("a superseded prompt's call stamped after the next one's, rolled back", func(t *testing.T) {
		// The reference agent under rollback, on a busy machine: prompt 2
		// ran first, on the history before 3, and was superseded by it;
		// its model request reached the model after 3's did.
		m := model.New()
		require.Nil(t, m.Apply(setup))
		i2 := at(interrupted(convA, u(2), 0, call(u(2), u(1), a(1), u(2))), 10, 18, 20)
		ok3 := at(ok(convA, u(3), call(u(3), u(1), a(1), u(3))), 11, 15, 21)
		require.Nil(t, m.ApplyStep([]model.Turn{i2, ok3}))
		assert.Equal(t, h(u(1), a(1), u(3), a(3)), m.Committed(convA))
	})
	t.Run("an interrupted turn stays after the turns its request shows", func(t *testing.T) {
		// Serialized: 4 failed, 5 ran, then 6, which saw 5 and was
		// interrupted. A turn that failed, or one 6 shows, is no turn 6
		// ran before.
		m := model.New()
		f4 := at(fail(convA, u(4), call(u(4), u(4))), 1, 2, 3)
		ok5 := at(ok(convA, u(5), call(u(5), u(5))), 1, 4, 5)
		i6 := at(interrupted(convA, u(6), 0, call(u(6), u(5), a(5), u(6))), 1, 6, 8)
		require.Nil(t, m.ApplyStep([]model.Turn{f4, ok5, i6}))
	})
	t.Run("prompts that ran, kept out of the order they ran in", func(t *testing.T) {
		m := model.NewWith(keep)
		require.Nil(t, m.Apply(setup))
		v := m.ApplyStep(burst(call(u(5), u(1), a(1), u(4), u(2), u(3), u(5))))
		require.NotNil(t, v, "a history that moves prompt 2 after prompt 4, which saw it first, passes")
	})
}

// A fork is T4 wherever it shows: turns of one conversation that ran at
// once on one history (docker-agent's serve a2a: each task adds its
// message to the context's session, then runs, with nothing between two
// tasks) show each other's halves in the model's histories. What
// concurrent turns explain is named T4, never the leftover or loss the
// same tokens would be on a line run one turn at a time.
func TestForkNamedT4WhereverItShows(t *testing.T) {
	t.Run("a turn sees another's message, which reached the model after it", func(t *testing.T) {
		// The burst: a's call came after b's, and b saw a's
		// message without its reply.
		m := model.New()
		a1 := at(ok(convA, u(1), call(u(1), u(1))), 1, 6, 9)
		b := at(ok(convA, u(2), call(u(2), u(1), u(2))), 2, 4, 8)
		v := m.ApplyStep([]model.Turn{a1, b})
		require.NotNil(t, v)
		assert.Equal(t, model.T4, v.Invariant, "%v", v)
		assert.Contains(t, v.Reason, "fork")
	})
	t.Run("a turn seen in part while it ran, or after", func(t *testing.T) {
		// Where its call was still at the model when the next turn's
		// came (answered at 7), the two ran at once: a fork. Where it was
		// answered first (at 5), the send times alone show none: a
		// server that runs one turn at a time may have ended it, or kept
		// it in part, and only then run the next, each its own
		// invariant's.
		detached := at(unknown(convA, u(2), call(u(2), u(1), a(1), u(2))), 4, 5, 6)
		detached.Detached = true
		abandoned := at(unknown(convA, u(2), call(u(2), u(1), a(1), u(2))), 4, 5, 40)
		abandoned.TimedOut, abandoned.Abandoned = true, true
		for _, c := range []struct {
			name  string
			seen  model.Turn
			after model.Invariant
		}{
			// Ended in part after its client left (under the complete
			// policy).
			{"detached", detached, model.T10},
			// A stream cut before its first chunk, kept in part
			// (commit-on-stream-error): its client never learned its end.
			{"unknown", at(unknown(convA, u(2), call(u(2), u(1), a(1), u(2))), 4, 5, 9), model.T6},
			// Kept as its user message alone, which rollback does not
			// allow: its client's giving up shows nothing of when the
			// server ended it.
			{"abandoned", abandoned, model.T10},
			// Under its lock, a server that keeps a failed turn shows it
			// to the next before the client hears of the failure.
			{"failed", at(fail(convA, u(2), call(u(2), u(1), a(1), u(2))), 4, 5, 9), model.T1},
		} {
			for _, when := range []answeredAt{{"while at the model", 7, model.T4}, {"after its call was answered", 5, c.after}} {
				t.Run(c.name+"/"+when.why, func(t *testing.T) {
					when.check(t, c.seen, at(ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))), 5, 7, 10))
				})
			}
		}
	})
	t.Run("the halves interleaved in a later history", func(t *testing.T) {
		m := model.New()
		a1 := at(ok(convA, u(1), call(u(1), u(1))), 1, 3, 8)
		b := at(ok(convA, u(2), call(u(2), u(1), u(2))), 2, 4, 9)
		v := m.ApplyStep([]model.Turn{a1, b})
		require.NotNil(t, v)
		assert.Equal(t, model.T4, v.Invariant, "%v", v)
	})
	t.Run("an interrupted turn, seen while it ran, under rollback", func(t *testing.T) {
		m := model.New()
		require.Nil(t, m.Apply(at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
		// Its client left only after the next turn's call came.
		cut := at(interrupted(convA, u(2), 9, call(u(2), u(1), a(1), u(2))), 4, 5, 8)
		cut.Dropped, cut.Held = 8, 8
		next := at(ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))), 5, 7, 10)
		v := m.ApplyStep([]model.Turn{cut, next})
		require.NotNil(t, v)
		assert.Equal(t, model.T4, v.Invariant, "%v", v)
	})
	t.Run("a turn that left out one still at the model", func(t *testing.T) {
		// docker-agent's serve a2a: a task ran while another's call was
		// held, its client still there: a fork at its cause, whatever
		// later histories show of the other.
		m := model.NewWith(keep)
		require.Nil(t, m.Apply(at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
		held := at(interrupted(convA, u(2), 12, call(u(2), u(1), a(1), u(2))), 4, 5, 11)
		held.Dropped, held.Held = 10, 10
		beside := at(fail(convA, u(3), call(u(3), u(1), a(1), u(3))), 4, 7, 9)
		v := m.ApplyStep([]model.Turn{held, beside})
		require.NotNil(t, v)
		assert.Equal(t, model.T4, v.Invariant, "%v", v)
		assert.Contains(t, v.Reason, "still at the model")

		// Where another turn may take over from it (supersede), no fork.
		m = model.NewWith(keep)
		require.Nil(t, m.Apply(at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
		superseded := held
		superseded.Held = 0
		require.Nil(t, m.ApplyStep([]model.Turn{superseded, beside}))

		// After its client left, the same history shows it rolled back.
		m = model.NewWith(keep)
		require.Nil(t, m.Apply(at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
		after := at(fail(convA, u(3), call(u(3), u(1), a(1), u(3))), 4, 11, 13)
		require.Nil(t, m.ApplyStep([]model.Turn{held, after}))
	})
	t.Run("an interrupted turn not yet at the model itself", func(t *testing.T) {
		// The reference server with titles: a turn queued behind another
		// of its conversation makes its title call at once, and the
		// harness holds that call (its first arrival) for the client to
		// leave. The turn itself waited its turn: with no call of its own
		// at the model, a call of the other that left it out is no fork.
		// Where a call of its own came, and left out the other's commit,
		// it is.
		title := model.Call{History: []model.Token{u(1), u(2)}, Turn: u(2), At: 5}
		for _, c := range []struct {
			name  string
			calls []model.Call
			at    int64 // when its own call came
			want  model.Invariant
		}{
			{"with no call of its own", nil, 8, ""},
			{"its own call after the other's, showing it", []model.Call{call(u(2), u(1), a(1), u(3), a(3), u(2))}, 8, ""},
			{"its own call before its client left, not showing the other's", []model.Call{call(u(2), u(1), a(1), u(2))}, 8, model.T4},
			{"its own call after its client left, not showing the other's", []model.Call{call(u(2), u(1), a(1), u(2))}, 11, model.T4},
		} {
			m := model.New()
			require.Nil(t, m.Apply(at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
			queued := at(interrupted(convA, u(2), 12, c.calls...), 4, c.at, 13)
			queued.Dropped, queued.Held, queued.Aux = 10, 10, []model.Call{title}
			first := at(ok(convA, u(3), call(u(3), u(1), a(1), u(3))), 4, 6, 7)
			v := m.ApplyStep([]model.Turn{queued, first})
			if c.want == "" {
				assert.Nil(t, v, c.name)
				continue
			}
			if assert.NotNil(t, v, c.name) {
				assert.Equal(t, c.want, v.Invariant, "%s: %v", c.name, v)
			}
		}
	})
	t.Run("a detached turn left out while at the model, committed after all", func(t *testing.T) {
		// docker-agent's serve a2a: a task ran while another, whose client
		// had left it to run on, was at the model; a later history shows
		// the two interleaved.
		later := func(gone, beside model.Turn) *model.Violation {
			m := model.New()
			require.Nil(t, m.Apply(at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
			require.Nil(t, m.ApplyStep([]model.Turn{gone, beside}))
			return m.Apply(at(ok(convA, u(4), call(u(4), u(1), a(1), u(3), u(2), a(3), a(2), u(4))), 10, 11, 12))
		}
		gone := at(unknown(convA, u(2), call(u(2), u(1), a(1), u(2))), 4, 5, 8)
		gone.Detached, gone.Calls[0].Unanswered = true, 6
		beside := at(ok(convA, u(3), call(u(3), u(1), a(1), u(3))), 4, 6, 7)
		beside.Calls[0].Unanswered = 6
		v := later(gone, beside)
		require.NotNil(t, v)
		assert.Equal(t, model.T4, v.Invariant, "%v", v)
		assert.Contains(t, v.Reason, "still at the model")

		// Its call answered before the other came: shown not committed,
		// it may not come back.
		gone.Calls[0].Unanswered = 5
		v = later(gone, beside)
		require.NotNil(t, v)
		assert.Equal(t, model.T6, v.Invariant, "%v", v)
	})
	// What no concurrent turn explains keeps its own name: a turn kept
	// after it ended.
	t.Run("a failed turn's message, beside", func(t *testing.T) {
		m := model.New()
		require.Nil(t, m.Apply(at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
		failed := at(fail(convA, u(2), call(u(2), u(1), a(1), u(2))), 4, 5, 6)
		next := at(ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))), 5, 7, 9)
		v := m.ApplyStep([]model.Turn{failed, next})
		require.NotNil(t, v)
		assert.Equal(t, model.T1, v.Invariant, "%v", v)
	})
	t.Run("an interrupted turn's reply, beside", func(t *testing.T) {
		m := model.NewWith(keep)
		require.Nil(t, m.Apply(at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
		cut := at(interrupted(convA, u(2), 6, call(u(2), u(1), a(1), u(2))), 4, 5, 6)
		next := at(ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3))), 5, 7, 9)
		v := m.ApplyStep([]model.Turn{cut, next})
		require.NotNil(t, v)
		assert.Equal(t, model.T10, v.Invariant, "%v", v)
	})
	t.Run("an interrupted turn's reply, committed while it ran on", func(t *testing.T) {
		// An agent that answers a cancel canceled and runs the task on:
		// the next turn, while it still ran, saw it whole.
		m := model.New()
		cut := at(interrupted(convA, u(2), 6, call(u(2), u(2))), 1, 2, 12)
		next := at(ok(convA, u(3), call(u(3), u(2), a(2), u(3))), 3, 8, 10)
		v := m.ApplyStep([]model.Turn{cut, next})
		require.NotNil(t, v)
		assert.Equal(t, model.T10, v.Invariant, "%v", v)
	})
	t.Run("a committed turn of an earlier step lost", func(t *testing.T) {
		m := model.New()
		require.Nil(t, m.Apply(at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
		b := at(ok(convA, u(2), call(u(2), u(2))), 4, 5, 8)
		c := at(ok(convA, u(3), call(u(3), u(2), u(3))), 4, 6, 9)
		v := m.ApplyStep([]model.Turn{b, c})
		require.NotNil(t, v)
		assert.Equal(t, model.T2, v.Invariant, "%v", v)
	})
}

// answeredAt is a case of a turn seen by one beside it, judged by when the
// model began to answer its call: unanswered is the arrival the model had
// seen by then, and want the verdict.
type answeredAt struct {
	why        string
	unanswered int64
	want       model.Invariant
}

// check applies, after an ok turn u1, one step of seen (u2, its one call
// answered as c says) and beside (a turn whose call shows u2), and
// asserts the verdict.
func (c answeredAt) check(t *testing.T, seen, beside model.Turn) {
	t.Helper()
	m := model.New()
	require.Nil(t, m.Apply(at(ok(convA, u(1), call(u(1), u(1))), 1, 2, 3)))
	seen.Calls[0].Unanswered = c.unanswered
	v := m.ApplyStep([]model.Turn{seen, beside})
	require.NotNil(t, v, c.why)
	assert.Equal(t, c.want, v.Invariant, "%s: %v", c.why, v)
}
