// Package pgtest runs a throwaway PostgreSQL server for a test binary
// (package pgserver: on 127.0.0.1, on a free port, with its data and its
// socket in a temporary directory), and gives each test a schema of its
// own in its one database (a schema costs nothing to make; a database, a
// quarter of a second with fsync on). It skips the tests that ask for one
// where PostgreSQL is not installed.
//
// A test binary that uses it wraps its TestMain's m with Main, which
// starts the server in the background and stops it once the tests have
// run:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.Main(m)) }
package pgtest

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turncheck/turncheck/internal/pgserver"
)

// The test binary's server, started by Main in the background, so that
// its start overlaps the tests that come before the first that needs it.
var (
	wrapped = make(chan struct{}) // closed when Main runs the tests
	booted  = make(chan struct{}) // closed when the start is over
	srv     *pgserver.Server      // nil if it did not start
	noBoot  error                 // why there is no PostgreSQL to start
	bootErr error                 // why it failed to start
	upIn    time.Duration         // how long its start took

	mu      sync.Mutex
	schemas int // schemas made so far, to name the next
)

// database is the database the tests' schemas are made in.
const database = "test"

// Main wraps a test binary's m: it starts the server in the background
// while the tests run, and stops it after them (its processes ended, its
// directory removed). A server that does not stop fails the binary.
func Main(m *testing.M) interface{ Run() int } { return mainRunner{m} }

type mainRunner struct{ m *testing.M }

func (r mainRunner) Run() int {
	close(wrapped)
	go boot()
	code := r.m.Run()
	<-booted
	if srv == nil {
		return code
	}
	if err := srv.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		return 1
	}
	return code
}

// boot starts the server and its database, or says why it cannot, and
// closes booted.
func boot() {
	defer close(booted)
	began := time.Now()
	// The tests crash the reference server's replicas, never PostgreSQL:
	// it need not wait for the disk, which makes a replica's start (its
	// tables made on a fresh schema) several times faster.
	s, err := pgserver.Start("fsync=off", "synchronous_commit=off", "full_page_writes=off")
	switch {
	case errors.Is(err, pgserver.ErrNotInstalled):
		noBoot = err
		return
	case err != nil:
		bootErr = err
		return
	}
	if err := s.Exec("postgres", "CREATE DATABASE "+database); err != nil {
		bootErr = errors.Join(err, s.Stop())
		return
	}
	srv, upIn = s, time.Since(began)
}

// Start returns the URL of a new empty schema on the test binary's
// PostgreSQL server, once it is up: the URL names the schema as the
// connection's search_path, so that everything made through it is made
// there. It skips t if no PostgreSQL is installed, and fails it if the
// server did not start or the binary's TestMain does not use Main. The
// schema is left to go with the server. Advisory locks are the
// database's, shared by every schema.
func Start(t testing.TB) (url string) {
	t.Helper()
	url, err := Schema()
	switch {
	case err != nil && errors.Is(err, noBoot):
		t.Skip("pgtest: ", err)
	case err != nil:
		t.Fatalf("pgtest: %v", err)
	}
	if strings.HasSuffix(url, "=test1") {
		t.Logf("pgtest: PostgreSQL %s took %s to start", srv.Dir(), upIn.Round(time.Millisecond))
	}
	return url
}

// Schema is Start for code that must not stop its test's goroutine (a
// server start the harness runs on a goroutine of its own): the URL of a
// new empty schema, or an error, also where no PostgreSQL runs. Call
// Start first in the test, which skips it without PostgreSQL.
func Schema() (url string, err error) {
	select {
	case <-wrapped:
	default:
		return "", errors.New("wrap TestMain's m with pgtest.Main, which starts and stops the server")
	}
	<-booted
	switch {
	case noBoot != nil:
		return "", noBoot
	case bootErr != nil:
		return "", bootErr
	}
	mu.Lock()
	schemas++
	name := "test" + strconv.Itoa(schemas)
	mu.Unlock()
	if err := srv.Exec(database, "CREATE SCHEMA "+name); err != nil {
		return "", fmt.Errorf("create schema: %w", err)
	}
	return srv.URL(database) + "&search_path=" + name, nil
}
