//go:build unix

package execute

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/fronttest"
	"github.com/turncheck/turncheck/internal/pgtest"
	"github.com/turncheck/turncheck/internal/testbin"
	"github.com/turncheck/turncheck/model"
	_ "github.com/turncheck/turncheck/scenarios/fleet"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// twoReplicasOverPostgres is the reference server, with mutant m, as two
// replicas over a schema of the test binary's PostgreSQL (pgtest); t
// skips without one.
func twoReplicasOverPostgres(t *testing.T, m sut.Mutant) targets.Target {
	t.Helper()
	return targets.Subprocess{
		Command: []string{testbin.Turncheck(t), "serve", "--listen", "{addr}", "--model-url", "{model_url}",
			"--store", "{store_url}", "--key", "key-a", "--request-timeout", "2s", "--mutant", string(m)},
		ReadyLine: `listening on (http://\S+)`,
		Replicas:  2, Store: pgtest.Start(t), FreshPerCheck: true, StopGrace: 5 * time.Second,
		Reaches: targets.Profile{Keys: []string{"key-a"}, ModelTimeout: 2 * time.Second},
	}
}

// TestNetworkFaultsHappen: on the reference server as two replicas over
// one PostgreSQL, each network fault breaks the link it names while the
// turn is in flight, and the turn's outcome shows it: a replica that
// loses its store fails the turn (nothing committed), a client whose
// link breaks never learns the outcome, latency changes nothing; after
// each fault heals, the conversation goes on from a consistent state on
// the other replica, as the reference model judges every step.
func TestNetworkFaultsHappen(t *testing.T) {
	t.Parallel() // it mostly waits on its servers
	s := newSession(t, twoReplicasOverPostgres(t, sut.Clean))
	_, ok := s.Server.(targets.LinkBreaker)
	require.True(t, ok, "replicas over PostgreSQL run their links through the harness")
	conv := model.ConversationRef{Key: "key-a", ID: "net"}
	tok := 0
	turn := func(replica int, net *targets.NetFault) history.Op {
		t.Helper()
		tok++
		send := plan.TurnSend(conv, model.UserToken(tok), tok%2 == 0)
		send.Replica, send.Net = replica, net
		p := plan.Single("continue", send)
		require.NoError(t, p.Check())
		start := time.Now()
		ops, v := s.Step(p)
		t.Logf("%s: %s, %s", p, ops[0].Response.Outcome, time.Since(start))
		require.Nil(t, v, "step %d: %s", tok, p)
		require.Len(t, ops, 1)
		return ops[0]
	}
	require.Equal(t, model.OK, turn(0, nil).Response.Outcome)
	// Turns at once on replica 1 leave it a pool of store connections,
	// idle when a fault kills them.
	burst := plan.Plan{Action: plan.BurstAction(4), Release: []int{0, 1, 2, 3}}
	for i := range 4 {
		send := plan.TurnSend(model.ConversationRef{Key: "key-a", ID: fmt.Sprintf("side-%d", i)}, model.UserToken(100+i), false)
		send.Replica = 1
		burst.Sends = append(burst.Sends, send)
	}
	ops, v := s.Step(burst)
	require.Nil(t, v)
	for _, op := range ops {
		require.Equal(t, model.OK, op.Response.Outcome, op.Response.Detail)
	}
	for _, c := range []struct {
		f    targets.NetFault
		want model.Outcome
	}{
		{targets.NetFault{Link: targets.StoreLink, Kind: targets.Latency, Millis: 20}, model.OK},
		{targets.NetFault{Link: targets.ClientLink, Kind: targets.Latency, Millis: 20}, model.OK},
		{targets.NetFault{Link: targets.StoreLink, Kind: targets.Reset}, model.Fail},
		{targets.NetFault{Link: targets.StoreLink, Kind: targets.Cut, Millis: 100}, model.Fail},
		{targets.NetFault{Link: targets.StoreLink, Kind: targets.Partition}, model.Fail},
		{targets.NetFault{Link: targets.ClientLink, Kind: targets.Reset}, model.Unknown},
		{targets.NetFault{Link: targets.ClientLink, Kind: targets.Cut, Millis: 100}, model.Unknown},
		{targets.NetFault{Link: targets.ClientLink, Kind: targets.Partition}, model.Unknown},
	} {
		f := c.f
		op := turn(1, &f)
		assert.Equal(t, history.NetBroken, op.Net, "%s", f)
		assert.Equal(t, c.want, op.Response.Outcome, "%s: %s", f, op.Response.Detail)
		// Healed: the next turn, on the other replica, then on the one
		// whose link broke, commits on what the model says is there.
		for _, r := range []int{0, 1} {
			next := turn(r, nil)
			assert.Equal(t, model.OK, next.Response.Outcome, "after %s, on replica %d: %s", f, r, next.Response.Detail)
		}
	}
}

// TestStoreLinkRevealsStoreErrorAcked: a replica that acknowledges a turn
// whose commit its store never got (store-error-acked) looks right until
// its link to the store breaks mid-turn: the turn ends ok, and the next
// one, on the other replica, runs without it (T2). Without the fault it
// is the clean server.
func TestStoreLinkRevealsStoreErrorAcked(t *testing.T) {
	t.Parallel() // it mostly waits on its servers
	s := newSession(t, twoReplicasOverPostgres(t, sut.StoreErrorAcked))
	conv := model.ConversationRef{Key: "key-a", ID: "net"}
	step := func(tok, replica int, net *targets.NetFault) (history.Op, *model.Violation) {
		send := plan.TurnSend(conv, model.UserToken(tok), false)
		send.Replica, send.Net = replica, net
		ops, v := s.Step(plan.Single("continue", send))
		require.Len(t, ops, 1)
		return ops[0], v
	}
	for tok := 1; tok <= 3; tok++ {
		op, v := step(tok, tok%2, nil)
		require.Nil(t, v, "no fault, no bug")
		require.Equal(t, model.OK, op.Response.Outcome, op.Response.Detail)
	}
	op, v := step(4, 1, &targets.NetFault{Link: targets.StoreLink, Kind: targets.Partition})
	require.Nil(t, v)
	assert.Equal(t, history.NetBroken, op.Net)
	assert.Equal(t, model.OK, op.Response.Outcome, "acknowledged, though the store never got it")
	_, v = step(5, 0, nil)
	require.NotNil(t, v, "the acknowledged turn is gone")
	assert.Equal(t, model.T2, v.Invariant, v.Error())
}

// TestFrontAnswersForALostReplica: behind a front, the model calls show
// which replica serves each turn, and a network fault breaks that one's
// link. The front answers 502 for a replica whose link the harness broke,
// which may have committed the turn: its outcome is unknown, not failed,
// and the conversation goes on as the model judges. A replica that loses
// its store answers the failure itself, through the front: failed.
func TestFrontAnswersForALostReplica(t *testing.T) {
	t.Parallel() // it mostly waits on its servers
	front := fronttest.Start(t, 2)
	target := twoReplicasOverPostgres(t, sut.Clean).(targets.Subprocess)
	target.Front = &targets.Front{URL: front.URL, Upstreams: front.Upstreams}
	s := newSession(t, target)
	require.True(t, targets.Fronted(s.Server))
	conv := model.ConversationRef{Key: "key-a", ID: "front"}
	tok := 0
	turn := func(net *targets.NetFault) history.Op {
		t.Helper()
		tok++
		send := plan.TurnSend(conv, model.UserToken(tok), false)
		send.Net = net
		ops, v := s.Step(plan.Single("continue", send))
		require.Nil(t, v, "step %d", tok)
		require.Len(t, ops, 1)
		require.NotNil(t, ops[0].Served, "the model calls show the replica")
		return ops[0]
	}
	served := map[int]bool{}
	for range 2 {
		op := turn(nil)
		require.Equal(t, model.OK, op.Response.Outcome, op.Response.Detail)
		served[*op.Served] = true
	}
	assert.Len(t, served, 2, "round robin: both replicas served")

	op := turn(&targets.NetFault{Link: targets.ClientLink, Kind: targets.Partition})
	assert.Equal(t, history.NetBroken, op.Net)
	assert.Equal(t, http.StatusBadGateway, op.Response.Status, "the front lost its replica")
	assert.Equal(t, model.Unknown, op.Response.Outcome, op.Response.Detail)
	assert.True(t, op.Turn.Gateway)

	op = turn(&targets.NetFault{Link: targets.StoreLink, Kind: targets.Partition})
	assert.Equal(t, history.NetBroken, op.Net)
	assert.Equal(t, model.Fail, op.Response.Outcome, "the replica's own failure, passed on: %s", op.Response.Detail)
	for range 2 {
		op := turn(nil)
		assert.Equal(t, model.OK, op.Response.Outcome, op.Response.Detail)
	}
}
