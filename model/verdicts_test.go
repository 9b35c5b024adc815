package model_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
)

// span sets when t was sent and answered on the run's timeline, and when
// its calls reached the model.
func span(t model.Turn, invoke, ret int64) model.Turn {
	t.Invoke, t.Return = invoke, ret
	for i := range t.Calls {
		t.Calls[i].At = invoke + 1
	}
	return t
}

// refused is a usable turn on conv refused with status before any model
// call.
func refused(conv model.ConversationRef, user model.Token, status int) model.Turn {
	return model.Turn{Conv: conv, User: user, Usable: true, Outcome: model.Fail, Status: status}
}

func TestRefusedInsteadOfWaiting(t *testing.T) {
	running := span(ok(convA, u(1), call(u(1), u(1))), 1, 10)
	t.Run("serialize: a 500 while the turn ahead runs", func(t *testing.T) {
		m := model.New()
		r := span(refused(convA, u(2), 500), 2, 3)
		v := m.ApplyStep([]model.Turn{running, r})
		requireViolation(t, v, model.T4, r)
		assert.Contains(t, v.Reason, "refused instead of waiting")
	})
	t.Run("serialize: a 200 whose stream fails before any model call (openclaw #84575's streamed refusal)", func(t *testing.T) {
		m := model.New()
		r := span(refused(convA, u(2), 200), 2, 3)
		v := m.ApplyStep([]model.Turn{running, r})
		requireViolation(t, v, model.T4, r)
		assert.Contains(t, v.Reason, "got 200 and a failure in its stream before any model call")
	})
	t.Run("serialize: the refusal came after the model timeout (a bounded wait)", func(t *testing.T) {
		m := model.New()
		r := span(refused(convA, u(2), 503), 2, 3)
		r.WaitedOut = true
		assert.Nil(t, m.ApplyStep([]model.Turn{running, r}))
	})
	t.Run("serialize: a front's 502 (it lost its replica), not the server's", func(t *testing.T) {
		m := model.New()
		r := span(refused(convA, u(2), 502), 2, 3)
		r.Gateway = true
		assert.Nil(t, m.ApplyStep([]model.Turn{running, r}))
	})
	t.Run("serialize: nothing else ran", func(t *testing.T) {
		m := model.New()
		assert.Nil(t, m.ApplyStep([]model.Turn{span(refused(convA, u(2), 500), 2, 3)}))
		assert.Zero(t, m.Checked()[model.T4], "a lone refusal exercises nothing of T4")
	})
	t.Run("serialize: the other turn is on another conversation", func(t *testing.T) {
		m := model.New()
		other := span(ok(convB, u(1), call(u(1), u(1))), 1, 10)
		assert.Nil(t, m.ApplyStep([]model.Turn{other, span(refused(convA, u(2), 500), 2, 3)}))
	})
	t.Run("serialize: the refused turn reached the model (a model error)", func(t *testing.T) {
		m := model.New()
		r := span(fail(convA, u(2), call(u(2), u(1), a(1), u(2))), 11, 12)
		r.Invoke = 2
		assert.Nil(t, m.ApplyStep([]model.Turn{running, r}))
	})
	t.Run("reject: a 500 is a failed turn, not T4's", func(t *testing.T) {
		m := model.NewWith(model.Policies{Concurrency: model.Reject})
		assert.Nil(t, m.ApplyStep([]model.Turn{running, span(refused(convA, u(2), 500), 2, 3)}))
	})
}

func TestConcurrentTurnsExerciseT4OnlyWhenTheyRan(t *testing.T) {
	t.Run("answered without the model", func(t *testing.T) {
		m := model.New()
		// Two turns at once, both ok, neither reaching the model: T2 breaks
		// first, but T4 was never exercised.
		_ = m.ApplyStep([]model.Turn{span(ok(convA, u(1)), 1, 4), span(ok(convA, u(2)), 2, 3)})
		assert.Zero(t, m.Checked()[model.T4])
	})
	t.Run("both reached the model", func(t *testing.T) {
		m := model.New()
		require.Nil(t, m.ApplyStep([]model.Turn{
			span(ok(convA, u(1), call(u(1), u(1))), 1, 4),
			span(ok(convA, u(2), call(u(2), u(1), a(1), u(2))), 2, 6)}))
		assert.Equal(t, 1, m.Checked()[model.T4])
	})
}

func TestInvalidRequestExercisesT3OnlyWithHistory(t *testing.T) {
	m := model.New()
	require.Nil(t, m.Apply(invalid(convA, "", model.Fail, 400)))
	assert.Zero(t, m.Checked()[model.T3], "nothing to replay on a conversation without a committed turn")
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	require.Nil(t, m.Apply(invalid(convA, "", model.Fail, 400)))
	assert.Equal(t, 1, m.Checked()[model.T3])
	// A front's 502, for a replica it lost, says nothing of the server's
	// answer; the server's own 500 does.
	gateway := invalid(convA, "", model.Fail, 502)
	gateway.Gateway = true
	require.Nil(t, m.Apply(gateway))
	v := m.Apply(invalid(convA, "", model.Fail, 500))
	require.NotNil(t, v)
	assert.Equal(t, model.T3, v.Invariant)
}

func TestOpenResponseMayLeaveTheConversationBusy(t *testing.T) {
	m := model.NewWith(model.Policies{Concurrency: model.Reject})
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	errored := fail(convA, u(2), call(u(2), u(1), a(1), u(2)))
	errored.Open = true
	require.Nil(t, m.Apply(errored))
	assert.Nil(t, m.Apply(refused(convA, u(3), 409)), "the server may still be ending the response the client stopped reading")

	m = model.NewWith(model.Policies{Concurrency: model.Reject})
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	errored.Open = false
	require.Nil(t, m.Apply(errored))
	r := refused(convA, u(3), 409)
	requireViolation(t, m.Apply(r), model.T4, r)
}

// detached is a turn whose client disconnected from a server that runs
// it to its end (the complete policy).
func detached(conv model.ConversationRef, user model.Token, calls ...model.Call) model.Turn {
	t := unknown(conv, user, calls...)
	t.Detached = true
	return t
}

func TestDetachedTurn(t *testing.T) {
	complete := model.Policies{Complete: true}
	scene := []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: detached(convA, u(2), call(u(2), u(1), a(1), u(2)))},
	}
	t.Run("committed whole", func(t *testing.T) {
		runWith(t, complete, withSteps(scene, step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3)))}))
	})
	t.Run("not at all", func(t *testing.T) {
		runWith(t, complete, withSteps(scene, step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(3)))}))
	})
	t.Run("its user message alone is half-done: T10", func(t *testing.T) {
		runWith(t, complete, withSteps(scene, step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))), want: model.T10}))
	})
	t.Run("half-done under a turn that ran beside it", func(t *testing.T) {
		// Its client left it after the next turn was sent. Where its call
		// was still at the model when the next one's came, the two ran at
		// once, and the next saw it half done: a fork. Where its call was
		// answered first, a server that runs one turn at a time may have
		// ended it in part (an interruption kept in part, T10) and only
		// then run the next: the send times alone show no fork.
		for _, c := range []answeredAt{
			{"its call still at the model", 7, model.T4},
			{"its call answered first", 5, model.T10},
		} {
			d := detached(convA, u(2), timed(call(u(2), u(1), a(1), u(2)), 5))
			d.Invoke, d.Return, d.Calls[0].Unanswered = 4, 100, c.unanswered
			next := ok(convA, u(3), timed(call(u(3), u(1), a(1), u(2), u(3)), 7))
			next.Invoke, next.Return = 6, 9
			t.Run(c.why, func(t *testing.T) {
				runWith(t, complete, []step{
					{turn: ok(convA, u(1), call(u(1), u(1)))},
					{turn: d},
					{turn: next, want: c.want},
				})
			})
		}
	})
	t.Run("twice is T6", func(t *testing.T) {
		runWith(t, complete, withSteps(scene,
			step{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(2), a(2), u(3))), want: model.T6}))
	})
	t.Run("its calls after the disconnect are allowed", func(t *testing.T) {
		d := detached(convA, u(2), timed(call(u(2), u(1), a(1), u(2)), 5), timed(call(u(2), u(1), a(1), u(2)), 9))
		d.Released = 7
		runWith(t, complete, []step{{turn: ok(convA, u(1), call(u(1), u(1)))}, {turn: d}})
	})
}

func TestKeptThenLostIsNotACommittedTurnLost(t *testing.T) {
	// An unknown turn shown committed, then missing: T6, not T2, and not a
	// fork (T4) though it completed after the next turn was sent.
	late := unknown(convA, u(2), call(u(2), u(1), a(1), u(2)))
	late.Return = 100
	runWith(t, model.Policies{}, []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: late},
		{turn: ok(convA, u(3), call(u(3), u(1), a(1), u(2), a(2), u(3)))},
		{turn: ok(convA, u(4), call(u(4), u(1), a(1), u(3), a(3), u(4))), want: model.T6},
	})
}

func TestViolationKinds(t *testing.T) {
	failedThenSeen := []step{
		{turn: ok(convA, u(1), call(u(1), u(1)))},
		{turn: fail(convA, u(2), call(u(2), u(1), a(1), u(2)))},
	}
	m := model.New()
	for _, s := range failedThenSeen {
		require.Nil(t, m.Apply(s.turn))
	}
	v := m.Apply(ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))))
	require.NotNil(t, v)
	assert.Equal(t, model.T1, v.Invariant)
	assert.Equal(t, model.LeftoverFailed, v.Kind)

	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	require.Nil(t, m.Apply(interrupted(convA, u(2), 0, call(u(2), u(1), a(1), u(2)))))
	v = m.Apply(ok(convA, u(3), call(u(3), u(1), a(1), u(2), u(3))))
	require.NotNil(t, v)
	assert.Equal(t, model.T10, v.Invariant)
	assert.Equal(t, model.LeftoverInterrupted, v.Kind, "an interrupted turn's leftover is another trigger than a failed turn's: evidence of one is none of the other")

	m = model.New()
	require.Nil(t, m.Apply(ok(convA, u(1), call(u(1), u(1)))))
	m.Restart(false, false)
	v = m.Apply(ok(convA, u(2), call(u(2), u(2))))
	require.NotNil(t, v)
	assert.Equal(t, model.T7, v.Invariant)
	assert.Equal(t, model.Lost, v.Kind, "a loss seen after a restart may have come before it: the same kind as T2's")
}
