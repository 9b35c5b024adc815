package execute

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/crashtest"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// dropped is a streamed turn whose client drops it at its first model
// call: crashtest's server dies of it.
func dropped(conv model.ConversationRef, tok model.Token) plan.Plan {
	s := plan.TurnSend(conv, tok, true)
	s.Abort = true
	return plan.Single("new conversation", s)
}

// undeclared is crashtest's target, declaring no durability across a
// crash.
type undeclared struct{ crashtest.Target }

func (u undeclared) Profile() targets.Profile {
	p := u.Target.Profile()
	p.Durability.Crash = false
	return p
}

// TestCrashIsTheStepsFinding: a server that dies in a step is that step's
// crash finding, quoting its last output; its session closes without an
// error for a server that was already down.
func TestCrashIsTheStepsFinding(t *testing.T) {
	s := newSession(t, crashtest.Target{})
	a := model.ConversationRef{Key: "key-a", ID: "a"}
	_, v := s.Step(dropped(a, model.UserToken(1)))
	require.NotNil(t, v)
	assert.Equal(t, model.Crash, v.Invariant)
	assert.Contains(t, v.Reason, "by the end of step 1")
	assert.Contains(t, v.Reason, "panic: send on closed channel")
	assert.Nil(t, s.Dead)
}

// TestGoesOnAfterACrash: once its crash is skipped (a finding already), a
// server that dies is started again and the check goes on: a server that
// declares it survives a crash is judged through it as through a kill -9
// the harness drew (T7 on the conversation that had a committed turn);
// for one that does not, what it held is unknowable, and its
// conversations are set aside, never judged.
func TestGoesOnAfterACrash(t *testing.T) {
	u := model.UserToken
	for _, tc := range []struct {
		name   string
		target targets.Target
	}{{"durable", crashtest.Target{}}, {"not durable across a crash", undeclared{}}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSession(t, tc.target, model.Crash)
			a, b := model.ConversationRef{Key: "key-a", ID: "a"}, model.ConversationRef{Key: "key-a", ID: "b"}
			ops, v := s.Step(plan.Single("new conversation", plan.TurnSend(a, u(1), false)))
			require.Nil(t, v)
			require.Equal(t, model.OK, ops[0].Response.Outcome, ops[0].Response.Detail)

			_, v = s.Step(dropped(b, u(2)))
			require.Nil(t, v, "a skipped crash is no finding")
			require.NoError(t, s.Dead)
			assert.Equal(t, 1, s.Skipped[model.Crash])

			ops, v = s.Step(plan.Single("continue", plan.TurnSend(a, u(3), false)))
			require.Nil(t, v)
			require.NoError(t, s.Dead)
			require.Equal(t, model.OK, ops[0].Response.Outcome, "the server was started again: %s", ops[0].Response.Detail)
			assert.Equal(t, []model.Token{u(1), u(1).Reply(), u(3)}, firstCall(t, ops[0]), "it kept the committed turn")
			if tc.name == "durable" {
				assert.False(t, s.Aside[a])
				assert.Positive(t, s.Ref.Checked()[model.T7], "the resume after the crash is judged")
			} else {
				assert.True(t, s.Aside[a], "a conversation the crash made unknowable is set aside")
				assert.Zero(t, s.Ref.Checked()[model.T7])
			}
		})
	}
}

// diesLater is the reference server, which says it exited once died is
// set: a process that dies after it answered.
type diesLater struct{ reference.Target }

func (d diesLater) Start(modelURL string) (targets.Server, error) {
	srv, err := d.Target.Start(modelURL)
	if err != nil {
		return nil, err
	}
	return &diesLaterServer{Instance: srv.(*sut.Instance)}, nil
}

type diesLaterServer struct {
	*sut.Instance
	died atomic.Bool
}

func (s *diesLaterServer) Exited() error {
	if s.died.Load() {
		return errors.New("exited with status 2; its last output:\npanic: runtime error: invalid memory address or nil pointer dereference")
	}
	return nil
}

// TestEndSeesADeathAfterTheLastStep: a server that dies once it answered
// the check's last step is the crash finding of the check's steps; one
// that stays up is none.
func TestEndSeesADeathAfterTheLastStep(t *testing.T) {
	s := newSession(t, diesLater{})
	a := model.ConversationRef{Key: "key-a", ID: "a"}
	_, v := s.Step(plan.Single("new conversation", plan.TurnSend(a, model.UserToken(1), true)))
	require.Nil(t, v)
	require.Nil(t, s.End(), "a server that stays up is no crash")
	s.Server.(*diesLaterServer).died.Store(true)
	v = s.End()
	require.NotNil(t, v)
	assert.Equal(t, model.Crash, v.Invariant)
	assert.Contains(t, v.Reason, "after the last step (1) was answered")
	assert.Contains(t, v.Reason, "nil pointer dereference")
}

// sharedDiesLater is diesLater, one server for every session, which a
// restart brings back.
type sharedDiesLater struct{ diesLater }

func (sharedDiesLater) ReuseServer() bool { return true }

func (d sharedDiesLater) Start(modelURL string) (targets.Server, error) {
	srv, err := d.diesLater.Start(modelURL)
	if err != nil {
		return nil, err
	}
	return &restartsAlive{srv.(*diesLaterServer)}, nil
}

type restartsAlive struct{ *diesLaterServer }

func (r *restartsAlive) Restart(crash bool, agents []string) error {
	r.died.Store(false)
	return r.Instance.Restart(crash, agents)
}

// TestExitBetweenChecksIsSaid: a shared server found exited when the
// next check starts, after the last step of the one before was looked
// at, is started again for it, and said (no step shows its cause), never
// an error that ends the run; and so is one found exited when the run
// ends.
func TestExitBetweenChecksIsSaid(t *testing.T) {
	l, err := Open(sharedDiesLater{}, nil)
	require.NoError(t, err)
	a := model.ConversationRef{Key: "key-a", ID: "a"}
	s, err := l.Session(nil)
	require.NoError(t, err)
	_, v := s.Step(plan.Single("new conversation", plan.TurnSend(a, model.UserToken(1), false)))
	require.Nil(t, v)
	require.NoError(t, s.Close())
	srv := s.Server.(*restartsAlive)
	srv.died.Store(true)

	s, err = l.Session(nil)
	require.NoError(t, err, "a server found exited between two checks ended the run")
	require.Len(t, l.ExitedBetween, 1)
	assert.Contains(t, l.ExitedBetween[0], "nil pointer dereference")
	assert.False(t, srv.died.Load(), "it was started again")
	ops, v := s.Step(plan.Single("new conversation", plan.TurnSend(a, model.UserToken(2), false)))
	require.Nil(t, v)
	require.Equal(t, model.OK, ops[0].Response.Outcome, ops[0].Response.Detail)
	require.NoError(t, s.Close())

	srv.died.Store(true)
	require.NoError(t, l.Close(), "a server found exited as the run ends is said, not an error")
	assert.Len(t, l.ExitedBetween, 2)
}

// takesOver is the reference server, declaring a takeover bound
// (targets.Profile.TakeoverAfter).
type takesOver struct {
	reference.Target
	after time.Duration
}

func (o takesOver) Profile() targets.Profile {
	p := o.Target.Profile()
	p.TakeoverAfter = o.after
	return p
}

// TestAKillMarksItsTurnsConversationsInTakeover: a request sent on a
// conversation whose turn was in flight when the server was killed, within
// the profile's takeover bound, is marked so (model.Turn.InTakeover, which
// only ever excuses); one on a conversation with no turn under the kill
// is not, nor is any where the profile declares no bound.
func TestAKillMarksItsTurnsConversationsInTakeover(t *testing.T) {
	u := model.UserToken
	for _, after := range []time.Duration{time.Hour, 0} {
		t.Run(after.String(), func(t *testing.T) {
			s := newSession(t, takesOver{after: after})
			a, b := model.ConversationRef{Key: "key-a", ID: "a"}, model.ConversationRef{Key: "key-a", ID: "b"}
			for i, c := range []model.ConversationRef{a, b} {
				_, v := s.Step(plan.Single("new conversation", plan.TurnSend(c, u(i+1), false)))
				require.Nil(t, v)
			}
			kill := plan.Restart{Crash: true}
			_, v := s.Step(plan.Plan{Action: "crash mid-turn", Restart: &kill, Release: []int{0},
				Sends: []plan.Send{plan.TurnSend(a, u(3), false)}})
			require.Nil(t, v)
			ops, v := s.Step(plan.Single("continue", plan.TurnSend(a, u(4), false)))
			require.Nil(t, v)
			assert.Equal(t, after > 0, ops[0].Turn.InTakeover, "the killed turn's conversation")
			ops, v = s.Step(plan.Single("continue", plan.TurnSend(b, u(5), false)))
			require.Nil(t, v)
			assert.False(t, ops[0].Turn.InTakeover, "a conversation with no turn under the kill")
		})
	}
}
