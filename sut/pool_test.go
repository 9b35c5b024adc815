package sut_test

import (
	"database/sql"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/pgtest"
	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// The server's connections to PostgreSQL (Config.MaxStoreConns): a turn
// does everything it does in the store on the one connection its lock is
// held on, the connections turns hold are bounded, and a turn that can
// get none is refused before any model call, never failed after it.

// poolReplica starts one replica over a new schema, connecting as a role
// of its own that PostgreSQL lets open at most roleConns connections at
// once (CONNECTION LIMIT), in front of a gate model. The superuser's
// connection to the schema's database is returned too, and the role's
// name.
func poolReplica(t *testing.T, role string, roleConns int, cfg sut.Config) (*raceEnv, *sql.DB, string) {
	t.Helper()
	url := pgtest.Start(t)
	admin, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	schema := url[strings.LastIndex(url, "=")+1:]
	// A role is the cluster's, which every test of the binary shares:
	// one of the schema's own, so that no run meets another's.
	role += "_" + schema
	for _, stmt := range []string{
		"CREATE ROLE " + role + " LOGIN CONNECTION LIMIT " + itoa(roleConns),
		"GRANT ALL ON SCHEMA " + schema + " TO " + role,
	} {
		_, err := admin.Exec(stmt)
		require.NoError(t, err, stmt)
	}
	m := startGateModel(t)
	cfg.Store, cfg.ModelURL, cfg.DataDir = strings.Replace(url, "postgres@", role+"@", 1), m.URL(), "unused"
	cfg.Gauge = &sut.Gauge{}
	return &raceEnv{model: m, srv: startServer(t, nil, cfg), gauge: cfg.Gauge, client: newClient(t)}, admin, role
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestATurnNeedsOneStoreConnection: with PostgreSQL letting the server
// open a single connection, turns are served all the same, one after
// another: each locks, loads and commits on the one it holds. A second
// turn at once, on another conversation, gets its own place in the
// server's budget (MaxStoreConns 3), but PostgreSQL takes no second
// connection: it is refused 503 with Retry-After before any model call,
// once its wait for one (RequestTimeout) is over, and changes nothing;
// so is a session's creation then.
func TestATurnNeedsOneStoreConnection(t *testing.T) {
	t.Parallel()
	var log syncbuf.Buffer
	a, _, _ := poolReplica(t, "one_conn", 1, sut.Config{MaxStoreConns: 3, RequestTimeout: 2 * time.Second, Deadlines: &sut.ManualDeadlines{},
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	assert.Equal(t, hist("u1"), a.ok(t, "c1", "tc-u1", false))
	assert.Equal(t, hist("u1", "a1", "u2"), a.ok(t, "c1", "tc-u2", true))
	assert.Contains(t, log.String(), "fewer connections than --max-store-conns", "said at start")
	assert.Contains(t, log.String(), "max_store_conns=3 postgresql_room=1")

	held := a.model.hold("tc-u3")
	r3 := a.send(t, "c1", "tc-u3", false)
	arrive(t, held, "tc-u3")
	r := a.send(t, "c2", "tc-u4", false).wait(t)
	requireErrorBody(t, r, http.StatusServiceUnavailable, "overloaded")
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	assert.Contains(t, string(r.body), "PostgreSQL took no new connection", "who refused")
	assert.Contains(t, log.String(), `msg="refused for load" by=postgresql`)
	assert.Empty(t, a.model.callsOf("tc-u4"), "a turn refused for want of a connection reaches no model")
	created := postURL(t, a.client, a.srv.URL()+"/api/sessions", "{}", nil)
	requireErrorBody(t, created, http.StatusServiceUnavailable, "overloaded")
	assert.Equal(t, "1", created.header.Get("Retry-After"))
	held.open()
	requireOK(t, r3.wait(t), false)
	assert.Equal(t, hist("u5"), a.ok(t, "c2", "tc-u5", false), "the refused turn changed nothing")
	assert.Equal(t, hist("u1", "a1", "u2", "a2", "u3", "a3", "u6"), a.ok(t, "c1", "tc-u6", false))
}

// TestPostgresRefusalsLoggedThoughARetryGetsOne: PostgreSQL refusing a
// turn a connection is logged at the refusal, by=postgresql, though the
// turn waits on and gets one once the turn holding the only one ends:
// an operator sees the refusals behind a slow turn, not only the turns
// that were refused in the end.
func TestPostgresRefusalsLoggedThoughARetryGetsOne(t *testing.T) {
	t.Parallel()
	var log syncbuf.Buffer
	a, _, _ := poolReplica(t, "retried_conn", 1, sut.Config{MaxStoreConns: 3, RequestTimeout: 8 * time.Second, Deadlines: &sut.ManualDeadlines{},
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	held := a.model.hold("tc-u1")
	r1 := a.send(t, "c1", "tc-u1", false)
	arrive(t, held, "tc-u1")
	r2 := a.send(t, "c2", "tc-u2", false)
	// Logged while the turn still waits: no turn has been refused yet.
	require.Eventually(t, func() bool { return strings.Contains(log.String(), `msg="refused for load" by=postgresql`) },
		requestDeadline, 10*time.Millisecond, "PostgreSQL's refusal, logged as it came")
	held.open()
	requireOK(t, r1.wait(t), false)
	requireOK(t, r2.wait(t), false)
}

// TestStoreConnectionsAreBounded: with MaxStoreConns 3, two turns may
// hold a connection at once (the third is for what runs beside turns): a
// third turn, on a conversation of its own, waits for one for its
// RequestTimeout and is refused 503 with Retry-After before any model
// call, though PostgreSQL would take more; the two held are answered.
func TestStoreConnectionsAreBounded(t *testing.T) {
	t.Parallel()
	var log syncbuf.Buffer
	a, _, _ := poolReplica(t, "three_conns", 9, sut.Config{MaxStoreConns: 3, RequestTimeout: 2 * time.Second, Deadlines: &sut.ManualDeadlines{},
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	h1, h2 := a.model.hold("tc-u1"), a.model.hold("tc-u2")
	r1 := a.send(t, "c1", "tc-u1", false)
	arrive(t, h1, "tc-u1")
	r2 := a.send(t, "c2", "tc-u2", true)
	arrive(t, h2, "tc-u2")
	r := a.send(t, "c3", "tc-u3", false).wait(t)
	requireErrorBody(t, r, http.StatusServiceUnavailable, "overloaded")
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	assert.Contains(t, string(r.body), "store pool (--max-store-conns 3)", "who refused")
	assert.Contains(t, log.String(), `msg="refused for load" by=store_pool`)
	assert.NotContains(t, log.String(), "by=postgresql", "PostgreSQL would take more")
	assert.Contains(t, log.String(), "postgresql_room=9 max_store_conns=3 replicas_that_fit=3", "said at start")
	assert.Empty(t, a.model.callsOf("tc-u3"), "a turn refused for want of a connection reaches no model")
	h1.open()
	h2.open()
	requireOK(t, r1.wait(t), false)
	requireOK(t, r2.wait(t), true)
	assert.Equal(t, hist("u4"), a.ok(t, "c3", "tc-u4", false), "the refused turn changed nothing")
}

// TestCommitOutlivesItsConnection: a turn whose connection (and with it
// its lock) is cut by the database while the model answers commits all
// the same, on another connection, and is acknowledged: its place in the
// conversation is still free, so nothing is overwritten.
func TestCommitOutlivesItsConnection(t *testing.T) {
	t.Parallel()
	a, admin, role := poolReplica(t, "cut_conn", 9, sut.Config{})
	assert.Equal(t, hist("u1"), a.ok(t, "c1", "tc-u1", false))
	held := a.model.hold("tc-u2")
	r2 := a.send(t, "c1", "tc-u2", false)
	arrive(t, held, "tc-u2")
	// The turn's connection is the one holding an advisory lock.
	var cut int
	require.NoError(t, admin.QueryRow(`SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l
		JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND a.usename = $1`, role).Scan(&cut))
	require.Equal(t, 1, cut, "one connection holds the turn's lock")
	held.open()
	requireOK(t, r2.wait(t), false)
	assert.Equal(t, hist("u1", "a1", "u2", "a2", "u3"), a.ok(t, "c1", "tc-u3", false))
}
