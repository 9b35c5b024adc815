// Package pgtest runs a throwaway PostgreSQL server for a test binary: on
// 127.0.0.1, on a free port, with its data and its socket in a temporary
// directory, and gives each test a schema of its own in its one database
// (a schema costs nothing to make; a database, a quarter of a second with
// fsync on). It skips the tests that ask for one where PostgreSQL is not
// installed.
//
// A test binary that uses it wraps its TestMain's m with Main, which stops
// the server, if a test started it, once the tests have run:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.Main(m)) }
package pgtest

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/turncheck/turncheck/internal/pgserver"
)

// The test binary's server, started by the first Start.
var (
	mu      sync.Mutex
	wrapped bool             // Main runs the tests
	srv     *pgserver.Server // nil until started
	schemas int              // schemas made so far, to name the next
)

// database is the database the tests' schemas are made in.
const database = "test"

// Main wraps a test binary's m so that the server a test started is
// stopped after the tests: its processes ended, its directory removed.
// A server that does not stop fails the binary.
func Main(m *testing.M) interface{ Run() int } { return mainRunner{m} }

type mainRunner struct{ m *testing.M }

func (r mainRunner) Run() int {
	mu.Lock()
	wrapped = true
	mu.Unlock()
	code := r.m.Run()
	mu.Lock()
	defer mu.Unlock()
	if srv == nil {
		return code
	}
	if err := srv.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		return 1
	}
	srv = nil
	return code
}

// Start returns the URL of a new empty schema on the test binary's
// PostgreSQL server, which it starts at its first call: the URL names
// the schema as the connection's search_path, so that everything made
// through it is made there. It skips t if no PostgreSQL is installed,
// and fails it if the binary's TestMain does not use Main. The schema is
// left to go with the server. Advisory locks are the database's, shared
// by every schema: tests that run at once and lock the same keys wait
// for each other.
func Start(t testing.TB) (url string) {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if !wrapped {
		t.Fatal("pgtest: wrap TestMain's m with pgtest.Main, which stops the server")
	}
	if srv == nil {
		began := time.Now()
		var err error
		if srv, err = pgserver.Start(); errors.Is(err, pgserver.ErrNotInstalled) {
			t.Skipf("pgtest: %v", err)
		} else if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		if err := srv.Exec("postgres", "CREATE DATABASE "+database); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		t.Logf("pgtest: PostgreSQL %s up in %s", srv.Dir(), time.Since(began).Round(time.Millisecond))
	}
	schemas++
	name := "test" + strconv.Itoa(schemas)
	if err := srv.Exec(database, "CREATE SCHEMA "+name); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	return srv.URL(database) + "&search_path=" + name
}
