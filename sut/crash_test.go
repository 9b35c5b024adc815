package sut_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Crash: the in-process kill -9.

// TestCrashKeepsAcknowledgedTurns: every turn the clean server
// acknowledged is there for the server that opens the data dir after a
// crash; Close and Crash after a crash do nothing.
func TestCrashKeepsAcknowledgedTurns(t *testing.T) {
	a := newAgentEnv(t)
	e := a.start(sut.Config{})
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	s := parseStream(t, e.turn(t, "", "c1", "tc-u2", true))
	require.True(t, s.done && s.stopped() && s.errors() == 0)
	require.Equal(t, toks("u3"), e.ok(t, "", "c2", "tc-u3"))
	crashed := a.cur
	a.crash()
	assert.NoError(t, crashed.Crash(), "a second crash does nothing")
	assert.NoError(t, crashed.Running.Close(), "a Close after a crash does nothing")
	_, err := http.Get(crashed.URL() + "/healthz") //nolint:noctx // refused at once
	require.Error(t, err, "a crashed server no longer listens")

	e = a.start(sut.Config{})
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u4"), e.ok(t, "", "c1", "tc-u4"))
	assert.Equal(t, toks("u3", "a3", "u5"), e.ok(t, "", "c2", "tc-u5"))
}

// TestCrashAfterCloseDoesNothing: a closed server has nothing left to
// crash.
func TestCrashAfterCloseDoesNothing(t *testing.T) {
	a := newAgentEnv(t)
	e := a.start(sut.Config{})
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	require.NoError(t, a.cur.Close())
	assert.NoError(t, a.cur.Crash())
}

// TestCrashEndsTurnsInFlight: a crash drops the connections of the turns in
// flight (their clients hear nothing), ends their model calls and the
// requests waiting behind them, and returns once they are over; none of
// them is committed.
func TestCrashEndsTurnsInFlight(t *testing.T) {
	a := newAgentEnv(t)
	g := &sut.Gauge{}
	e := a.start(sut.Config{Gauge: g})
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	arrived := a.am.Script("tc-u2", faults.Fault{Kind: faults.Hold})

	errs := make(chan error, 2)
	send := func(tok model.Token) {
		ctx, cancel := context.WithTimeout(context.Background(), requestDeadline)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL()+"/v1/chat/completions",
			strings.NewReader(chatBody(t, false, user(string(tok)+" hi"))))
		if err != nil {
			errs <- err
			return
		}
		req.Header.Set(sut.DefaultConversationHeader, "c1")
		resp, err := e.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errs <- err
	}
	go send("tc-u2")
	select {
	case <-arrived:
	case <-time.After(requestDeadline):
		require.FailNow(t, "the held call never arrived")
	}
	go send("tc-u3")
	awaitWaiting(t, g, 1)

	done := make(chan error, 1)
	go func() { done <- a.cur.Crash() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(requestDeadline):
		require.FailNow(t, "Crash did not return")
	}
	for range 2 {
		assert.Error(t, <-errs, "a client of a crashed server hears no reply")
	}
	working, waiting, _ := g.Read()
	assert.Zero(t, working+waiting, "Crash returned with requests still in the server")

	e = a.start(sut.Config{})
	assert.Equal(t, toks("u1", "a1", "u4"), e.ok(t, "", "c1", "tc-u4"))
}

// ---------------------------------------------------------------------------
// ack-before-durable: written behind, flushed on a graceful stop.

// TestAckBeforeDurableFlushesOnGracefulStop: the mutant loses nothing to a
// graceful stop, Close or Shutdown: only a crash shows its bug.
func TestAckBeforeDurableFlushesOnGracefulStop(t *testing.T) {
	defer sut.SetFlushInterval(time.Hour)()
	a := newAgentEnv(t)
	e := a.start(sut.Config{Mutant: sut.AckBeforeDurable, ConversationsMax: 1})
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	require.Equal(t, toks("u2"), e.ok(t, "", "c2", "tc-u2"))
	// c1 was evicted: it reloads with its queued turn on top of the store.
	require.Equal(t, toks("u1", "a1", "u3"), e.ok(t, "", "c1", "tc-u3"))

	e = a.start(sut.Config{Mutant: sut.AckBeforeDurable}) // Close
	require.Equal(t, toks("u1", "a1", "u3", "a3", "u4"), e.ok(t, "", "c1", "tc-u4"))
	ctx, cancel := context.WithTimeout(context.Background(), requestDeadline)
	defer cancel()
	require.NoError(t, a.cur.Shutdown(ctx))
	a.client.CloseIdleConnections()

	e = a.start(sut.Config{})
	assert.Equal(t, toks("u1", "a1", "u3", "a3", "u4", "a4", "u5"), e.ok(t, "", "c1", "tc-u5"))
	assert.Equal(t, toks("u2", "a2", "u6"), e.ok(t, "", "c2", "tc-u6"))
}

// TestAckBeforeDurableFlushesInTheBackground: what the mutant queued
// reaches the store on its own within its flush interval, and then
// survives a crash.
func TestAckBeforeDurableFlushesInTheBackground(t *testing.T) {
	defer sut.SetFlushInterval(10 * time.Millisecond)()
	a := newAgentEnv(t)
	e := a.start(sut.Config{Mutant: sut.AckBeforeDurable})
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))

	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", OmitHost: true, Path: filepath.Join(a.dir, "conversations.db")}).String())
	require.NoError(t, err)
	defer db.Close()
	require.Eventually(t, func() bool {
		var n int
		return db.QueryRow(`SELECT count(*) FROM messages WHERE conversation = 'c1'`).Scan(&n) == nil && n == 2
	}, requestDeadline, 5*time.Millisecond, "the queue was never flushed")

	a.crash()
	e = a.start(sut.Config{})
	assert.Equal(t, toks("u1", "a1", "u2"), e.ok(t, "", "c1", "tc-u2"))
}

// ---------------------------------------------------------------------------
// Mutants that only a restart, a crash or eviction shows.

// restartCases drive servers over one data dir and report whether the
// mutant's bug showed; each runs with its mutant and with the clean server.
var restartCases = []struct {
	mutant sut.Mutant
	run    func(t *testing.T, m sut.Mutant) bool
}{
	{
		// docker-agent #3410: the resume looks up the exact recorded key.
		mutant: sut.ExactSourceKeyOnly,
		run: func(t *testing.T, m sut.Mutant) bool {
			a := newAgentEnv(t)
			e := a.start(sut.Config{Mutant: m, Agents: []string{a.am.ref("helper", "tag=v1")}})
			require.Equal(t, toks("u1"), e.okAs(t, "helper", "c1", "tc-u1"))
			e = a.start(sut.Config{Mutant: m, Agents: []string{a.am.ref("helper", "tag=v2")}})
			n := a.am.CallCount()
			r := e.turnAs(t, "helper", "c1", "tc-u2")
			if r.status == http.StatusOK {
				assert.Equal(t, toks("u1", "a1", "u2"), oneCall(t, a.am.Model, n, "tc-u2"))
				return false
			}
			requireErrorBody(t, r, http.StatusInternalServerError, "server_error")
			assert.Contains(t, string(r.body), "agent not found")
			return true
		},
	},
	{
		// docker-agent #3410 through the sessions API alone.
		mutant: sut.SessionExactSourceKey,
		run:    sessionResumesAfterQueryChange,
	},
	{
		// T7: acknowledged turns still queued die with the process.
		mutant: sut.AckBeforeDurable,
		run: func(t *testing.T, m sut.Mutant) bool {
			defer sut.SetFlushInterval(time.Hour)()
			a := newAgentEnv(t)
			e := a.start(sut.Config{Mutant: m})
			require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
			require.Equal(t, toks("u1", "a1", "u2"), e.ok(t, "", "c1", "tc-u2"))
			a.crash()
			e = a.start(sut.Config{})
			got := e.ok(t, "", "c1", "tc-u3")
			if assert.ObjectsAreEqual(toks("u1", "a1", "u2", "a2", "u3"), got) {
				return false
			}
			assert.Equal(t, toks("u3"), got, "both acknowledged turns were lost")
			return true
		},
	},
	{
		// T2: an evicted conversation is deleted from the store.
		mutant: sut.LostOnEvict,
		run: func(t *testing.T, m sut.Mutant) bool {
			e := newEnv(t, sut.Config{Mutant: m, ConversationsMax: 1})
			require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
			require.Equal(t, toks("u2"), e.ok(t, "", "c2", "tc-u2"))
			got := e.ok(t, "", "c1", "tc-u3")
			if assert.ObjectsAreEqual(toks("u1", "a1", "u3"), got) {
				return false
			}
			assert.Equal(t, toks("u3"), got, "the evicted conversation came back empty")
			return true
		},
	},
}

func TestRestartMutantsBite(t *testing.T) {
	for _, rc := range restartCases {
		t.Run(string(rc.mutant), func(t *testing.T) {
			t.Run("mutant", func(t *testing.T) {
				assert.True(t, rc.run(t, rc.mutant), "the mutant's bug must show")
			})
			t.Run("clean", func(t *testing.T) {
				assert.False(t, rc.run(t, sut.Clean), "the clean server must not have the bug")
			})
		})
	}
}
