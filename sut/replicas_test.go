package sut_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/pgtest"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Replicas: reference servers on one PostgreSQL database (Config.Store),
// each with a cache and a lock of its own, behave as one server. Each
// test has a store of its own (a schema), whose locks are its own, so
// the tests run in parallel.

// startReplicas starts n servers with cfg on a new PostgreSQL database, in
// front of the model at modelURL, and returns them with their gauges.
func startReplicas(t *testing.T, n int, modelURL string, cfg sut.Config) ([]*server, []*sut.Gauge) {
	t.Helper()
	cfg.Store, cfg.ModelURL, cfg.DataDir = pgtest.Start(t), modelURL, "unused"
	srvs, gauges := make([]*server, n), make([]*sut.Gauge, n)
	for i := range srvs {
		c := cfg
		c.Gauge = &sut.Gauge{}
		srvs[i], gauges[i] = startServer(t, nil, c), c.Gauge
	}
	return srvs, gauges
}

// replicaEnvs are n replicas in front of one fake model, each as an env.
func replicaEnvs(t *testing.T, n int, cfg sut.Config) []*env {
	t.Helper()
	m, c := startModel(t), newClient(t)
	var out []*env
	srvs, _ := startReplicas(t, n, m.URL(), cfg)
	for _, s := range srvs {
		out = append(out, &env{model: m, srv: s, client: c})
	}
	return out
}

// raceReplicas are n replicas in front of one gate model, each as a
// raceEnv with its own gauge.
func raceReplicas(t *testing.T, n int, cfg sut.Config) []*raceEnv {
	t.Helper()
	m, c := startGateModel(t), newClient(t)
	var out []*raceEnv
	srvs, gauges := startReplicas(t, n, m.URL(), cfg)
	for i, s := range srvs {
		out = append(out, &raceEnv{model: m, srv: s, gauge: gauges[i], client: c})
	}
	return out
}

// TestReplicasShareConversations (T2): the turns of one conversation,
// sent to each replica in turn, each see the whole history, under a key
// (the replicas share the store's scope secret), through chat, the
// sessions API and the Responses API.
func TestReplicasShareConversations(t *testing.T) {
	t.Parallel()
	rs := replicaEnvs(t, 3, sut.Config{Keys: []string{"k"}})
	want := toks()
	for i := range 6 {
		tok := toks(fmt.Sprintf("u%d", i+1))[0]
		want = append(want, tok)
		require.Equal(t, want, rs[i%3].ok(t, "k", "c1", tok), "turn %d, on replica %d", i+1, i%3)
		want = append(want, toks(fmt.Sprintf("a%d", i+1))[0])
	}

	session := rs[0].newSession(t, "k")
	assert.Equal(t, toks("u7"), rs[1].okSession(t, "k", session, "root", "tc-u7"))
	assert.Equal(t, toks("u7", "a7", "u8"), rs[2].okSession(t, "k", session, "root", "tc-u8"))

	first, _ := rs[2].okResponse(t, respReq{key: "k", tok: "tc-u9"})
	_, hist := rs[0].okResponse(t, respReq{key: "k", tok: "tc-u10", previous: first.ID})
	assert.Equal(t, toks("u9", "a9", "u10"), hist)
}

// TestReplicaCacheIsNeverStale (T2): a replica that has a conversation in
// its cache sees the turns another replica committed since.
func TestReplicaCacheIsNeverStale(t *testing.T) {
	t.Parallel()
	rs := raceReplicas(t, 2, sut.Config{})
	a, b := rs[0], rs[1]
	assert.Equal(t, hist("u1"), a.ok(t, "c1", "tc-u1", false))
	assert.Equal(t, hist("u1", "a1", "u2"), b.ok(t, "c1", "tc-u2", false), "b caches c1 here")
	assert.Equal(t, hist("u1", "a1", "u2", "a2", "u3"), a.ok(t, "c1", "tc-u3", true))
	assert.Equal(t, hist("u1", "a1", "u2", "a2", "u3", "a3", "u4"), b.ok(t, "c1", "tc-u4", false),
		"b must not serve its cached c1, which lacks a's turn")
}

// TestReplicasSerializeAConversation (T4): under Serialize a turn sent to
// one replica while another replica runs a turn on the same conversation
// waits for it, and sees it, for at most RequestTimeout (then 503); under
// Reject it gets 409 and changes nothing.
func TestReplicasSerializeAConversation(t *testing.T) {
	t.Parallel()
	t.Run("serialize", func(t *testing.T) {
		rs := raceReplicas(t, 2, sut.Config{})
		a, b := rs[0], rs[1]
		assert.Equal(t, hist("u1"), a.ok(t, "c1", "tc-u1", false))
		held := a.model.hold("tc-u2")
		r2 := a.send(t, "c1", "tc-u2", true)
		arrive(t, held, "tc-u2")
		r3 := b.send(t, "c1", "tc-u3", false)
		awaitWaiting(t, b.gauge, 1)
		held.open()
		requireOK(t, r2.wait(t), true)
		requireOK(t, r3.wait(t), false)
		assert.Equal(t, hist("u1", "a1", "u2", "a2", "u3"), b.model.callsOf("tc-u3")[0].history,
			"the waiting turn sees the one it waited for")
		assert.Equal(t, hist("u1", "a1", "u2", "a2", "u3", "a3", "u4"), a.ok(t, "c1", "tc-u4", false))
	})
	t.Run("serialize, bounded", func(t *testing.T) {
		const wait = 100 * time.Millisecond
		rs := raceReplicas(t, 2, sut.Config{RequestTimeout: wait, Deadlines: &sut.ManualDeadlines{}})
		a, b := rs[0], rs[1]
		held := a.model.hold("tc-u1")
		r1 := a.send(t, "c1", "tc-u1", false)
		arrive(t, held, "tc-u1")
		start := time.Now()
		r := b.send(t, "c1", "tc-u2", false).wait(t)
		requireErrorBody(t, r, http.StatusServiceUnavailable, "conversation_busy")
		assert.GreaterOrEqual(t, time.Since(start), wait, "the request must have waited its turn first")
		assert.Empty(t, b.model.callsOf("tc-u2"), "a request that gave up reaches no model")
		held.open()
		requireOK(t, r1.wait(t), false)
		assert.Equal(t, hist("u1", "a1", "u3"), b.ok(t, "c1", "tc-u3", false), "the turn that gave up changed nothing")
	})
	t.Run("reject", func(t *testing.T) {
		rs := raceReplicas(t, 2, sut.Config{Concurrency: sut.Reject})
		a, b := rs[0], rs[1]
		held := a.model.hold("tc-u1")
		r1 := a.send(t, "c1", "tc-u1", false)
		arrive(t, held, "tc-u1")
		requireErrorBody(t, b.send(t, "c1", "tc-u2", false).wait(t), http.StatusConflict, "conflict")
		assert.Empty(t, b.model.callsOf("tc-u2"), "a rejected turn reaches no model")
		held.open()
		requireOK(t, r1.wait(t), false)
		assert.Equal(t, hist("u1", "a1", "u3"), b.ok(t, "c1", "tc-u3", false), "the rejected turn changed nothing")
	})
}

// TestReplicaCrashLosesNoAcknowledgedTurn (T7): a replica that dies in the
// middle of a turn loses none that it acknowledged, commits nothing of
// the one it was running, and lets go of the conversation: another
// replica's turn, waiting for it, goes on with the history as it was.
func TestReplicaCrashLosesNoAcknowledgedTurn(t *testing.T) {
	t.Parallel()
	rs := raceReplicas(t, 2, sut.Config{})
	a, b := rs[0], rs[1]
	assert.Equal(t, hist("u1"), a.ok(t, "c1", "tc-u1", false))
	assert.Equal(t, hist("u1", "a1", "u2"), a.ok(t, "c1", "tc-u2", true))
	held := a.model.hold("tc-u3")
	r3 := a.send(t, "c1", "tc-u3", false)
	arrive(t, held, "tc-u3")
	r4 := b.send(t, "c1", "tc-u4", false)
	awaitWaiting(t, b.gauge, 1)

	require.NoError(t, a.srv.Crash())
	<-r3.done
	assert.Error(t, r3.err, "a client of a crashed replica hears no reply")
	requireOK(t, r4.wait(t), false)
	assert.Equal(t, hist("u1", "a1", "u2", "a2", "u4"), b.model.callsOf("tc-u4")[0].history)
	assert.Equal(t, hist("u1", "a1", "u2", "a2", "u4", "a4", "u5"), b.ok(t, "c1", "tc-u5", false))
}

// replicaMutantCases are the mutants of the store and the cache, on
// PostgreSQL: each reports whether its bug showed.
var replicaMutantCases = []replicaMutantCase{
	{
		// T7: a turn acknowledged but still queued dies with its replica.
		mutant: sut.AckBeforeDurable,
		run: func(t *testing.T, m sut.Mutant) bool {
			defer sut.SetFlushInterval(time.Hour)()
			rs := replicaEnvs(t, 2, sut.Config{Mutant: m})
			require.Equal(t, toks("u1"), rs[0].ok(t, "", "c1", "tc-u1"))
			require.NoError(t, rs[0].srv.Crash())
			return assert.ObjectsAreEqual(toks("u2"), rs[1].ok(t, "", "c1", "tc-u2"))
		},
	},
	{
		// T2: an evicted conversation is deleted from the store.
		mutant: sut.LostOnEvict,
		run: func(t *testing.T, m sut.Mutant) bool {
			e := replicaEnvs(t, 1, sut.Config{Mutant: m, ConversationsMax: 1})[0]
			require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
			require.Equal(t, toks("u2"), e.ok(t, "", "c2", "tc-u2"))
			return assert.ObjectsAreEqual(toks("u3"), e.ok(t, "", "c1", "tc-u3"))
		},
	},
}

// TestReplicaMutantsBite: the mutants of the store and the cache keep
// their bugs on PostgreSQL, and the clean server has none of them. Not in
// parallel: it sets the flush interval of every server started meanwhile.
func TestReplicaMutantsBite(t *testing.T) { bite(t, replicaMutantCases) }

// replicaMutantCase is a mutant of replicas and how to show its bug: run
// reports whether it showed on a server with mutant m.
type replicaMutantCase struct {
	mutant sut.Mutant
	run    func(t *testing.T, m sut.Mutant) bool
}

// bite runs each case: its mutant's bug must show, and the clean
// server's must not.
func bite(t *testing.T, cases []replicaMutantCase) {
	t.Parallel() // each case on replicas, and a schema, of its own
	for _, rc := range cases {
		t.Run(string(rc.mutant), func(t *testing.T) {
			t.Parallel()
			assert.True(t, rc.run(t, rc.mutant), "the mutant's bug must show")
			assert.False(t, rc.run(t, sut.Clean), "the clean server must not have the bug")
		})
	}
}

// TestReplicasKeepAnyText: a message holding what PostgreSQL's text type
// refuses (the NUL character) is committed and seen by the next turn, as
// on SQLite.
func TestReplicasKeepAnyText(t *testing.T) {
	t.Parallel()
	rs := replicaEnvs(t, 2, sut.Config{})
	r := rs[0].post(t, chatBody(t, false, user("tc-u1 a\u0000b")), headers("", "c1"))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, toks("u1", "a1", "u2"), rs[1].ok(t, "", "c1", "tc-u2"))
}
