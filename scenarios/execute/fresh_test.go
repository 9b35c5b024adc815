package execute

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// reusing is the reference server as a target whose one server serves a
// whole run, recording every server it starts.
type reusing struct {
	reference.Target
	started *startedServers
}

type startedServers struct {
	sync.Mutex
	all []*watchedServer
}

// watchedServer is a server that says whether it was stopped.
type watchedServer struct {
	targets.Server
	closed bool
}

func (w *watchedServer) Close() error {
	w.closed = true
	return w.Server.Close()
}

func (r reusing) ReuseServer() bool { return true }

func (r reusing) Start(modelURL string) (targets.Server, error) {
	s, err := r.Target.Start(modelURL)
	if err != nil {
		return nil, err
	}
	w := &watchedServer{Server: s}
	r.started.Lock()
	defer r.started.Unlock()
	r.started.all = append(r.started.all, w)
	return w, nil
}

// TestFreshReplayStartsAFreshServer: on a target whose sessions share one
// server, a fresh replay stops the shared server, replays on one started
// for it and stops that one too, and the later sessions share one started
// under the run's bound; a replay on the
// target's servers each starts its own anyway.
func TestFreshReplayStartsAFreshServer(t *testing.T) {
	started := &startedServers{}
	l, err := Open(reusing{started: started}, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Close()) }()
	require.True(t, l.FreshServers())
	conv := model.ConversationRef{Key: "key-a", ID: "c"}
	plans := []plan.Plan{plan.Single("new", plan.TurnSend(conv, model.UserToken(1), false))}
	ctx := context.Background()

	_, v, err := l.Replay(ctx, plans)
	require.NoError(t, err)
	require.Nil(t, v)
	_, _, err = l.Replay(ctx, plans)
	require.NoError(t, err)
	require.Len(t, started.all, 1, "the sessions shared one server")

	h, v, err := l.FreshReplay(ctx, plans)
	require.NoError(t, err)
	assert.Nil(t, v)
	require.Len(t, h, 1)
	assert.Equal(t, model.OK, h[0].Response.Outcome, h[0].Response.Detail)
	require.Len(t, started.all, 2, "the fresh replay started a server")
	assert.True(t, started.all[0].closed, "the shared server was stopped first")
	// Its restarts would hold to the replay's bound: it is stopped after.
	assert.True(t, started.all[1].closed, "the fresh one was stopped after its replay")

	_, _, err = l.Replay(ctx, plans)
	require.NoError(t, err)
	require.Len(t, started.all, 3, "a later session starts a server under the run's bound")
	assert.False(t, started.all[2].closed, "which the sessions after it share")

	assert.False(t, (&Lab{Target: targets.Remote{}}).FreshServers(), "a remote server is the only one")
	assert.False(t, (&Lab{Target: reference.Target{}}).FreshServers(), "every session has a server of its own")
}
