package sut_test

import (
	"database/sql"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/pgtest"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// The mutants of replicas: correct in one process, wrong on two replicas
// over one PostgreSQL database.

// waitingOrDone waits until the server of g has a request waiting for its
// conversation's turn (it returns nil) or f has its response (it returns
// it): a turn that takes no lock it should have never waits.
func waitingOrDone(t *testing.T, g *sut.Gauge, f *inFlight) *reply {
	t.Helper()
	timeout := time.After(requestDeadline)
	for {
		_, waiting, changed := g.Read()
		if waiting > 0 {
			return nil
		}
		select {
		case r := <-f.done:
			require.NoError(t, f.err)
			return &r
		case <-changed:
		case <-timeout:
			require.FailNow(t, "the turn neither waited nor ended")
		}
	}
}

// heldOnOneSentToOther commits a turn of c1 on replica a, sends a second
// that a's model holds, and a third to replica b (returned), on two
// replicas with mutant m: b's turn must wait for a's and then see it.
func heldOnOneSentToOther(t *testing.T, m sut.Mutant) (b *raceEnv, held *held, r2, r3 *inFlight) {
	t.Helper()
	rs := raceReplicas(t, 2, sut.Config{Mutant: m})
	a, b := rs[0], rs[1]
	require.Equal(t, hist("u1"), a.ok(t, "c1", "tc-u1", false))
	held = a.model.hold("tc-u2")
	r2 = a.send(t, "c1", "tc-u2", false)
	arrive(t, held, "tc-u2")
	return b, held, r2, b.send(t, "c1", "tc-u3", false)
}

// replicaOnlyMutantCases are the mutants whose bug needs two replicas: each
// reports whether its bug showed.
var replicaOnlyMutantCases = []replicaMutantCase{
	{
		// T4: a turn sent to replica b while replica a runs one on the
		// same conversation does not wait for it, and forks.
		mutant: sut.ReplicaLocalLock,
		run: func(t *testing.T, m sut.Mutant) bool {
			b, held, r2, r3 := heldOnOneSentToOther(t, m)
			early := waitingOrDone(t, b.gauge, r3)
			held.open()
			requireOK(t, r2.wait(t), false)
			if early == nil {
				requireOK(t, r3.wait(t), false)
			} else {
				requireOK(t, *early, false)
			}
			return !assert.ObjectsAreEqual(hist("u1", "a1", "u2", "a2", "u3"), b.model.callsOf("tc-u3")[0].history)
		},
	},
	{
		// T2: sequential turns alternating replicas; a's cached c1 lacks
		// b's turn, and a serves it all the same.
		mutant: sut.ReplicaStaleCache,
		run: func(t *testing.T, m sut.Mutant) bool {
			rs := raceReplicas(t, 2, sut.Config{Mutant: m})
			a, b := rs[0], rs[1]
			require.Equal(t, hist("u1"), a.ok(t, "c1", "tc-u1", false))
			require.Equal(t, hist("u1", "a1", "u2"), b.ok(t, "c1", "tc-u2", false))
			got := a.ok(t, "c1", "tc-u3", false)
			if assert.ObjectsAreEqual(hist("u1", "a1", "u2", "a2", "u3"), got) {
				return false
			}
			// Its commit went over b's turn, and b, on its own stale copy,
			// misses a's.
			require.Equal(t, hist("u1", "a1", "u2", "a2", "u4"), b.ok(t, "c1", "tc-u4", false))
			return true
		},
	},
	{
		// T4 (and T2: its commit loses a's turn): a turn sent to replica
		// b while replica a runs one waits for it, as it should, but runs
		// on the base from before it, and its commit overwrites it.
		mutant: sut.ReplicaCommitUnlocked,
		run: func(t *testing.T, m sut.Mutant) bool {
			b, held, r2, r3 := heldOnOneSentToOther(t, m)
			awaitWaiting(t, b.gauge, 1)
			held.open()
			requireOK(t, r2.wait(t), false)
			requireOK(t, r3.wait(t), false)
			if assert.ObjectsAreEqual(hist("u1", "a1", "u2", "a2", "u3"), b.model.callsOf("tc-u3")[0].history) {
				return false
			}
			// The turn b waited for is gone from the store.
			require.Equal(t, hist("u1", "a1", "u3", "a3", "u4"), b.ok(t, "c1", "tc-u4", false))
			return true
		},
	},
	{
		// T2: the store fails a turn's commit (on replicas, a network
		// fault between a replica and the store does): the clean server
		// answers 500, the mutant acknowledges the turn, which the next
		// turn, on the other replica, does not see.
		mutant: sut.StoreErrorAcked,
		run: func(t *testing.T, m sut.Mutant) bool {
			r2, b := storeFailsCommit(t, m)
			got := b.ok(t, "c1", "tc-u3", false)
			if r2.status != http.StatusOK {
				require.Equal(t, http.StatusInternalServerError, r2.status, "%s", r2.body)
				require.Equal(t, hist("u1", "a1", "u3"), got, "a failed turn leaves nothing")
				return false
			}
			return !assert.ObjectsAreEqual(hist("u1", "a1", "u2", "a2", "u3"), got)
		},
	},
}

// storeFailsCommit commits a turn of c1 on replica a, then sends a
// second whose store write fails: the store loses its messages table
// while the model holds the turn, and gets it back once the turn is
// answered. It returns the second turn's answer and replica b.
func storeFailsCommit(t *testing.T, m sut.Mutant) (r2 reply, b *raceEnv) {
	t.Helper()
	url := pgtest.Start(t)
	gm, c := startGateModel(t), newClient(t)
	replica := func() *raceEnv {
		cfg := sut.Config{Mutant: m, Store: url, ModelURL: gm.URL(), DataDir: "unused", Gauge: &sut.Gauge{}}
		return &raceEnv{model: gm, srv: startServer(t, nil, cfg), gauge: cfg.Gauge, client: c}
	}
	a, b := replica(), replica()
	require.Equal(t, hist("u1"), a.ok(t, "c1", "tc-u1", false))
	held := a.model.hold("tc-u2")
	f := a.send(t, "c1", "tc-u2", false)
	arrive(t, held, "tc-u2")
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	_, err = db.Exec(`ALTER TABLE messages RENAME TO messages_away`)
	require.NoError(t, err)
	held.open()
	r2 = f.wait(t)
	_, err = db.Exec(`ALTER TABLE messages_away RENAME TO messages`)
	require.NoError(t, err)
	return r2, b
}

// TestReplicaOnlyMutantsBite: each mutant of replicas shows its bug on two
// replicas, and the clean server does not.
func TestReplicaOnlyMutantsBite(t *testing.T) { bite(t, replicaOnlyMutantCases) }

// TestReplicaOnlyMutantsAreRightAlone: in one process on SQLite, each
// mutant of replicas passes what shows its bug on two replicas:
// concurrent turns wait and see each other, and sequential ones see
// every committed turn.
func TestReplicaOnlyMutantsAreRightAlone(t *testing.T) {
	for _, info := range sut.Mutants() {
		if info.Replicas == 0 {
			continue
		}
		t.Run(string(info.Mutant), func(t *testing.T) {
			e := newRaceEnv(t, sut.Config{Mutant: info.Mutant})
			assert.Equal(t, hist("u1"), e.ok(t, "c1", "tc-u1", false))
			held := e.model.hold("tc-u2")
			r2 := e.send(t, "c1", "tc-u2", false)
			arrive(t, held, "tc-u2")
			r3 := e.send(t, "c1", "tc-u3", false)
			awaitWaiting(t, e.gauge, 1)
			held.open()
			requireOK(t, r2.wait(t), false)
			requireOK(t, r3.wait(t), false)
			assert.Equal(t, hist("u1", "a1", "u2", "a2", "u3"), e.model.callsOf("tc-u3")[0].history)
			assert.Equal(t, hist("u1", "a1", "u2", "a2", "u3", "a3", "u4"), e.ok(t, "c1", "tc-u4", false))
		})
	}
}
