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
// holds a connection only while it takes its conversation's lease and
// loads, and while it commits, never while it is at its model; the
// connections turns hold are bounded; a turn that can get none is
// refused before any model call, never failed after it; a lease outlives
// the connections it was taken and used on; a process cut off from the
// database ends its own turns before another may take their leases.

// pgRole is the PostgreSQL side of a replica of poolReplica: the
// superuser's connection to its schema's database and URL of its schema,
// and the role the replica connects as.
type pgRole struct {
	admin *sql.DB
	url   string
	role  string
}

// poolReplica starts one replica over a new schema, connecting as a role
// of its own that PostgreSQL lets open at most roleConns connections at
// once (CONNECTION LIMIT), in front of a gate model.
func poolReplica(t *testing.T, role string, roleConns int, cfg sut.Config) (*raceEnv, pgRole) {
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
	return &raceEnv{model: m, srv: startServer(t, nil, cfg), gauge: cfg.Gauge, client: newClient(t)}, pgRole{admin, url, role}
}

func itoa(n int) string { return strconv.Itoa(n) }

// exec runs stmt as the superuser.
func (p pgRole) exec(t *testing.T, stmt string) {
	t.Helper()
	_, err := p.admin.Exec(stmt)
	require.NoError(t, err, stmt)
}

// cutPool ends every connection the role holds but its connection of
// life, and waits until their backends are gone (a backend ends a moment
// after it is told to): the replica's pool must open new ones.
func (p pgRole) cutPool(t *testing.T) {
	t.Helper()
	_, err := p.admin.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1
		AND application_name <> $2`, p.role, sut.ConnectionOfLife)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var left int
		err := p.admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND application_name <> $2`,
			p.role, sut.ConnectionOfLife).Scan(&left)
		return err == nil && left == 0
	}, 10*time.Second, 10*time.Millisecond, "the pool's backends end")
}

// cutLife ends the role's connections of life, and reports how many.
func (p pgRole) cutLife(t *testing.T) int {
	t.Helper()
	var cut int
	require.NoError(t, p.admin.QueryRow(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE usename = $1 AND application_name = $2`, p.role, sut.ConnectionOfLife).Scan(&cut))
	return cut
}

// TestTurnsAtTheModelHoldNoStoreConnection: with PostgreSQL letting the
// server open its connection of life and a single other, two turns on
// two conversations are at the model at once, and a session is created
// meanwhile: a turn holds a connection only to take its lease and load,
// and to commit. Then, with the role's room cut to the connection of
// life alone, a turn waits for one, and is refused 503 with Retry-After
// before any model call, once its wait (RequestTimeout) is over, and
// changes nothing; so is a session's creation.
func TestTurnsAtTheModelHoldNoStoreConnection(t *testing.T) {
	t.Parallel()
	var log syncbuf.Buffer
	a, pg := poolReplica(t, "one_conn", 2, sut.Config{MaxStoreConns: 3, RequestTimeout: 2 * time.Second, Deadlines: &sut.ManualDeadlines{},
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	assert.Equal(t, hist("u1"), a.ok(t, "c1", "tc-u1", false))
	assert.Contains(t, log.String(), "fewer connections than --max-store-conns and its connection of life", "said at start")
	assert.Contains(t, log.String(), "max_store_conns=3 postgresql_room=2")

	h2, h3 := a.model.hold("tc-u2"), a.model.hold("tc-u3")
	r2 := a.send(t, "c1", "tc-u2", true)
	arrive(t, h2, "tc-u2")
	r3 := a.send(t, "c2", "tc-u3", false)
	arrive(t, h3, "tc-u3")
	created := postURL(t, a.client, a.srv.URL()+"/api/sessions", "{}", nil)
	require.Equal(t, http.StatusCreated, created.status, "a session created meanwhile: %s", created.body)
	h2.open()
	h3.open()
	requireOK(t, r2.wait(t), true)
	requireOK(t, r3.wait(t), false)

	pg.exec(t, "ALTER ROLE "+pg.role+" CONNECTION LIMIT 1")
	pg.cutPool(t)
	r := a.send(t, "c3", "tc-u4", false).wait(t)
	requireErrorBody(t, r, http.StatusServiceUnavailable, "overloaded")
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	assert.Contains(t, string(r.body), "PostgreSQL took no new connection", "who refused")
	assert.Contains(t, log.String(), `msg="refused for load" by=postgresql`)
	assert.Empty(t, a.model.callsOf("tc-u4"), "a turn refused for want of a connection reaches no model")
	created = postURL(t, a.client, a.srv.URL()+"/api/sessions", "{}", nil)
	requireErrorBody(t, created, http.StatusServiceUnavailable, "overloaded")
	assert.Equal(t, "1", created.header.Get("Retry-After"))

	pg.exec(t, "ALTER ROLE "+pg.role+" CONNECTION LIMIT 2")
	assert.Equal(t, hist("u5"), a.ok(t, "c3", "tc-u5", false), "the refused turn changed nothing")
	assert.Equal(t, hist("u1", "a1", "u2", "a2", "u6"), a.ok(t, "c1", "tc-u6", false))
	assert.Equal(t, hist("u3", "a3", "u7"), a.ok(t, "c2", "tc-u7", false))
}

// TestPostgresRefusalsLoggedThoughARetryGetsOne: PostgreSQL refusing a
// turn a connection is logged at the refusal, by=postgresql, though the
// turn waits on and gets one once the database takes one again: an
// operator sees the refusals behind a slow turn, not only the turns that
// were refused in the end.
func TestPostgresRefusalsLoggedThoughARetryGetsOne(t *testing.T) {
	t.Parallel()
	var log syncbuf.Buffer
	a, pg := poolReplica(t, "retried_conn", 2, sut.Config{MaxStoreConns: 3, RequestTimeout: 8 * time.Second, Deadlines: &sut.ManualDeadlines{},
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	pg.exec(t, "ALTER ROLE "+pg.role+" CONNECTION LIMIT 1")
	pg.cutPool(t)
	r1 := a.send(t, "c1", "tc-u1", false)
	// Logged while the turn still waits: no turn has been refused yet.
	require.Eventually(t, func() bool { return strings.Contains(log.String(), `msg="refused for load" by=postgresql`) },
		requestDeadline, 10*time.Millisecond, "PostgreSQL's refusal, logged as it came")
	pg.exec(t, "ALTER ROLE "+pg.role+" CONNECTION LIMIT 2")
	requireOK(t, r1.wait(t), false)
}

// TestStoreConnectionsAreBounded: with MaxStoreConns 3, two turns may
// hold a connection at once (the third is for what runs beside turns).
// With the messages table locked by another, two turns hold theirs,
// waiting to load: a third turn, on a conversation of its own, waits for
// one for its RequestTimeout and is refused 503 with Retry-After before
// any model call, though PostgreSQL would take more; the two are answered
// once the table is free.
func TestStoreConnectionsAreBounded(t *testing.T) {
	t.Parallel()
	var log syncbuf.Buffer
	a, pg := poolReplica(t, "three_conns", 9, sut.Config{MaxStoreConns: 3, RequestTimeout: 2 * time.Second, Deadlines: &sut.ManualDeadlines{},
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	assert.Contains(t, log.String(), "postgresql_room=9 max_store_conns=3 replicas_that_fit=2", "said at start")
	tx, err := pg.admin.Begin()
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = tx.Exec(`LOCK TABLE messages IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	r1 := a.send(t, "c1", "tc-u1", false)
	r2 := a.send(t, "c2", "tc-u2", true)
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pg.admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND wait_event_type = 'Lock'`, pg.role).Scan(&n))
		return n == 2
	}, requestDeadline, 10*time.Millisecond, "two turns waiting to load")
	r := a.send(t, "c3", "tc-u3", false).wait(t)
	requireErrorBody(t, r, http.StatusServiceUnavailable, "overloaded")
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	assert.Contains(t, string(r.body), "store pool (--max-store-conns 3)", "who refused")
	assert.Contains(t, log.String(), `msg="refused for load" by=store_pool`)
	assert.NotContains(t, log.String(), "by=postgresql", "PostgreSQL would take more")
	assert.Empty(t, a.model.callsOf("tc-u3"), "a turn refused for want of a connection reaches no model")
	require.NoError(t, tx.Rollback())
	requireOK(t, r1.wait(t), false)
	requireOK(t, r2.wait(t), true)
	assert.Equal(t, hist("u4"), a.ok(t, "c3", "tc-u4", false), "the refused turn changed nothing")
}

// TestCommitOutlivesItsConnectionOfLife: a turn whose process loses its
// connection of life (cut by the database) while the model answers
// commits all the same, and is acknowledged: its process opened a new
// one, and its beats landed again, long before anybody could take its
// lease. The process serves on.
func TestCommitOutlivesItsConnectionOfLife(t *testing.T) {
	t.Parallel()
	a, pg := poolReplica(t, "cut_conn", 9, sut.Config{})
	assert.Equal(t, hist("u1"), a.ok(t, "c1", "tc-u1", false))
	held := a.model.hold("tc-u2")
	r2 := a.send(t, "c1", "tc-u2", false)
	arrive(t, held, "tc-u2")
	require.Equal(t, 1, pg.cutLife(t), "one connection of life")
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pg.admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND application_name = $2`,
			pg.role, sut.ConnectionOfLife).Scan(&n))
		return n == 1
	}, requestDeadline, 10*time.Millisecond, "a new connection of life")
	held.open()
	requireOK(t, r2.wait(t), false)
	assert.Equal(t, hist("u1", "a1", "u2", "a2", "u3"), a.ok(t, "c1", "tc-u3", false))
}

// TestAFencedTurnEndsBeforeItsLeaseIsTaken: replica A's turn is at the
// model when A is cut off from the database (its connections ended, and
// its role may open no new one), as a network fault would cut it off.
// The database frees what A held at once; replica B's turn on the same
// conversation must still wait: A's turn is still at its model. A ends
// that turn itself once its beats have not landed for a while (the
// model sees its call dropped), and answers 503 with Retry-After; only
// later does B's turn take the conversation and reach the model. Two
// turns of one conversation are never at the model at once. B's turn
// commits, and the conversation holds it alone.
func TestAFencedTurnEndsBeforeItsLeaseIsTaken(t *testing.T) {
	t.Parallel()
	a, pg := poolReplica(t, "fenced", 9, sut.Config{Deadlines: &sut.ManualDeadlines{}})
	b := &raceEnv{model: a.model, client: a.client,
		srv: startServer(t, nil, sut.Config{Store: pg.url, ModelURL: a.model.URL(), DataDir: "unused", Deadlines: &sut.ManualDeadlines{}})}

	hA, hB := a.model.hold("tc-u1"), a.model.hold("tc-u2")
	rA := a.send(t, "c1", "tc-u1", false)
	arrive(t, hA, "tc-u1")
	pg.exec(t, "ALTER ROLE "+pg.role+" CONNECTION LIMIT 0")
	pg.exec(t, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '"+pg.role+"'")
	rB := b.send(t, "c1", "tc-u2", false)
	select {
	case <-hA.gone:
	case <-time.After(requestDeadline):
		t.Fatal("A's turn still at the model")
	}
	select {
	case <-hB.arrived:
		t.Fatal("B's turn reached the model before A's left it")
	default:
	}
	r := rA.wait(t)
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "A's turn, fenced: body %s", r.body)
	assert.NotEmpty(t, r.header.Get("Retry-After"))
	arrive(t, hB, "tc-u2")
	hB.open()
	requireOK(t, rB.wait(t), false)
	assert.Equal(t, hist("u2", "a2", "u3"), b.ok(t, "c1", "tc-u3", false))
}
