package model_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
)

// replayed is t with what a session/load replayed before it.
func replayed(t model.Turn, replay ...model.Token) model.Turn {
	t.Replay, t.Replayed = append([]model.Token{}, replay...), true
	return t
}

// TestReplayJudged: a session/load's replay (a second window into the
// server's state, beside the model's) must be the committed history: a
// committed turn missing is T7's, a failed turn's message T1's, another
// conversation's token T5's; the committed history replayed whole passes
// and counts as a T7 evaluation.
func TestReplayJudged(t *testing.T) {
	setup := func() *model.Model {
		m := model.New()
		require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
		require.Nil(t, m.Apply(failedBefore(convA, u(2), 500)))
		require.Nil(t, m.Apply(ok(convB, u(3), call(u(3), u(3)))))
		m.Restart(false, false)
		return m
	}
	plain := setup()
	require.Nil(t, plain.Apply(ok(convA, u(4), call(u(4), u(1), a(1), u(4)))))
	m := setup()
	require.Nil(t, m.Apply(replayed(ok(convA, u(4), call(u(4), u(1), a(1), u(4))), u(1), a(1))))
	assert.Equal(t, plain.Checked()[model.T7]+1, m.Checked()[model.T7], "the replay counts beside the resume")

	v := setup().Apply(replayed(ok(convA, u(4), call(u(4), u(1), a(1), u(4))), u(1)))
	require.NotNil(t, v)
	assert.Equal(t, model.T7, v.Invariant)
	assert.Equal(t, model.Lost, v.Kind)

	v = setup().Apply(replayed(ok(convA, u(4), call(u(4), u(1), a(1), u(4))), u(1), a(1), u(2)))
	require.NotNil(t, v)
	assert.Equal(t, model.T1, v.Invariant)

	v = setup().Apply(replayed(ok(convA, u(4), call(u(4), u(1), a(1), u(4))), u(1), a(1), u(3)))
	require.NotNil(t, v)
	assert.Equal(t, model.T5, v.Invariant)
}

// TestPreemptedIsT4: a turn the server gave up for a later request of its
// conversation is T4's, before what the later turn saw of it.
func TestPreemptedIsT4(t *testing.T) {
	m := model.New()
	first := failedBefore(convA, u(1), 500)
	first.Preempted = true
	v := m.ApplyStep([]model.Turn{first, ok(convA, u(2), call(u(2), u(1), u(2)))})
	require.NotNil(t, v)
	assert.Equal(t, model.T4, v.Invariant)
	assert.Contains(t, v.Reason, "gave tc-u1 up")
}

// TestReplayJudgedAsOfTheStep: a session/load's replay is shown before
// any turn of its step is sent, so it is judged against the history the
// step began with: where the agent ran a later prompt of the burst first
// (a serializing agent need not keep the order they were sent in), the
// replay lacks that prompt's turn, and that is no loss.
func TestReplayJudgedAsOfTheStep(t *testing.T) {
	setup := func() *model.Model {
		m := model.New()
		require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
		m.Restart(false, false)
		return m
	}
	first := replayed(ok(convA, u(2), model.Call{History: h(u(1), a(1), u(3), a(3), u(2)), Turn: u(2), At: 20}), u(1), a(1))
	first.Invoke, first.Return = 1, 30
	second := ok(convA, u(3), model.Call{History: h(u(1), a(1), u(3)), Turn: u(3), At: 10})
	second.Invoke, second.Return = 2, 25
	assert.Nil(t, setup().ApplyStep([]model.Turn{first, second}))

	// A replay that lacks a turn committed before the step is still T7's.
	lacking := replayed(first, u(1))
	v := setup().ApplyStep([]model.Turn{lacking, second})
	require.NotNil(t, v)
	assert.Equal(t, model.T7, v.Invariant)
	assert.Equal(t, model.Lost, v.Kind)
}

// TestReplayOfAnotherCheckIsALeak: a session/load replay that shows a
// conversation of an earlier check on the same agent has leaked it (T5),
// never lost or kept a turn of this one's (T7, T1).
func TestReplayOfAnotherCheckIsALeak(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(false, false)
	r := replayed(ok(convA, u(2), call(u(2), u(1), a(1), u(2))), u(1), a(1))
	r.ReplayForeign = h(u(1), a(1))
	v := m.Apply(r)
	require.NotNil(t, v)
	assert.Equal(t, model.T5, v.Invariant)
	assert.Contains(t, v.Reason, "earlier check")
}
