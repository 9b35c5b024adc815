package execute

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/crashtest"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/protocol"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// shortIDs is the reference server naming each conversation by the last
// six characters of its id (crashtest.ShortenIDs), one server for every
// session of a lab: two sessions' conversations of one name are one.
type shortIDs struct{ targets.Target }

func (shortIDs) ReuseServer() bool { return true }

func newShortIDs() shortIDs {
	return shortIDs{targets.Handler(targets.Profile{Model: "turncheck", ModelTimeout: time.Second},
		func(modelURL, dataDir string) (http.Handler, error) {
			srv, err := sut.New(sut.Config{ModelURL: modelURL, DataDir: dataDir, RequestTimeout: time.Second})
			if err != nil {
				return nil, err
			}
			return struct {
				http.Handler
				io.Closer
			}{crashtest.ShortenIDs(srv), srv}, nil
		})}
}

// TestEarlierSessionReplaysFirst: a session that meets an earlier
// session's messages on the shared server (a leak between checks, T5)
// names that session's steps (Earlier), marked with its check. The
// session's own steps alone, replayed on the shared server, meet what
// the sessions before left there: that replay runs again on a fresh
// server, which shows nothing, and so does every later one. The earlier
// steps, replayed first, in a session of their own, on a fresh server,
// bring the leak back, numbered through with the session's own steps.
func TestEarlierSessionReplaysFirst(t *testing.T) {
	l, err := Open(newShortIDs(), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()
	ctx := context.Background()
	conv := model.ConversationRef{ID: "conv-1"}

	first, err := l.Session(ctx)
	require.NoError(t, err)
	first.Check = 3
	before := plan.Single("new conversation", plan.TurnSend(conv, model.UserToken(7), false))
	_, v := first.Step(before)
	require.Nil(t, v)
	require.NoError(t, first.Close())

	second, err := l.Session(ctx)
	require.NoError(t, err)
	second.Check = 5
	own := plan.Single("new conversation", plan.TurnSend(conv, model.UserToken(1), false))
	ops, v := second.Step(own)
	require.NotNil(t, v, "the earlier session's conversation leaked into this one's of the same name")
	assert.Equal(t, model.T5, v.Invariant, v.Error())
	assert.Equal(t, []string{protocol.EpochTag(first.lab.run + "-1-")}, ops[0].ForeignFrom())
	earlier := second.Earlier(ops)
	require.NoError(t, second.Close())
	require.Len(t, earlier, 1)
	assert.Equal(t, plan.Origin{Check: 3, Session: 1}, earlier[0].Earlier)
	assert.Equal(t, before.Sends[0].Token, earlier[0].Sends[0].Token)

	// On the shared server, the own step alone meets what the sessions
	// before left there: it is run again on a fresh server.
	_, v, err = l.Replay(ctx, []plan.Plan{own})
	require.NoError(t, err)
	assert.Nil(t, v, "a replay judged what earlier sessions left on the server")
	assert.True(t, l.leaks)

	h, v, err := l.Replay(ctx, append(earlier, own))
	require.NoError(t, err)
	require.NotNil(t, v, "the earlier check's step, replayed first, did not bring the leak back")
	assert.Equal(t, model.T5, v.Invariant, v.Error())
	require.Len(t, h, 2)
	assert.Equal(t, []int{1, 2}, []int{h[0].Step, h[1].Step}, "numbered through the sessions")
	assert.Equal(t, earlier[0].Earlier, h[0].Earlier)
	assert.Zero(t, h[1].Earlier)
	assert.Less(t, h[0].Turn.Return, h[1].Turn.Invoke, "on one timeline")
}

// TestSessionsOfAFailure: a failure's steps split into the sessions a
// replay runs them in, each earlier check's apart, in order.
func TestSessionsOfAFailure(t *testing.T) {
	conv := model.ConversationRef{ID: "conv-1"}
	step := func(tok int, o plan.Origin) plan.Plan {
		p := plan.Single("continue", plan.TurnSend(conv, model.UserToken(tok), false))
		p.Earlier = o
		return p
	}
	a, b := plan.Origin{Check: 1, Session: 1}, plan.Origin{Check: 2, Session: 4}
	plans := []plan.Plan{step(1, a), step(2, a), step(1, b), step(1, plan.Origin{}), step(2, plan.Origin{})}
	sessions := plan.Sessions(plans)
	require.Len(t, sessions, 3)
	assert.Equal(t, [][]plan.Plan{plans[:2], plans[2:3], plans[3:]}, sessions)
	assert.Empty(t, plan.Sessions(nil))
	assert.Equal(t, "check 2", b.String())
	assert.Equal(t, "the failing check", plan.Origin{}.String())
}
