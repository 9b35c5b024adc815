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
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/turncheck/turncheck/internal/syncbuf"
)

// Bounds on the server's start and stop: a server that does not come up
// or go down in time fails the tests instead of stalling them.
const (
	readyTimeout = 30 * time.Second
	stopTimeout  = 10 * time.Second
)

// The test binary's server, started by Main in the background, so that
// its start overlaps the tests that come before the first that needs it.
var (
	wrapped = make(chan struct{}) // closed when Main runs the tests
	booted  = make(chan struct{}) // closed when the start is over
	srv     *server               // nil if it did not start
	noBoot  string                // why there is no PostgreSQL to start
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
	if err := srv.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		return 1
	}
	return code
}

// boot starts the server, or says why it cannot, and closes booted.
func boot() {
	defer close(booted)
	bin, err := findBin()
	if err != nil {
		noBoot = fmt.Sprintf("no PostgreSQL here (%v): install it (Debian: apt-get install postgresql)", err)
		return
	}
	attr, err := procAttr()
	if err != nil {
		noBoot = fmt.Sprintf("cannot run PostgreSQL here: %v", err)
		return
	}
	began := time.Now()
	srv, bootErr = startServer(bin, attr)
	upIn = time.Since(began)
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
	select {
	case <-wrapped:
	default:
		t.Fatal("pgtest: wrap TestMain's m with pgtest.Main, which starts and stops the server")
	}
	<-booted
	switch {
	case noBoot != "":
		t.Skip("pgtest: " + noBoot)
	case bootErr != nil:
		t.Fatalf("pgtest: %v", bootErr)
	}
	mu.Lock()
	schemas++
	name := "test" + strconv.Itoa(schemas)
	mu.Unlock()
	if name == "test1" {
		t.Logf("pgtest: PostgreSQL %s took %s to start", srv.dir, upIn.Round(time.Millisecond))
	}
	if err := srv.exec(database, "CREATE SCHEMA "+name); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	return srv.url(database) + "&search_path=" + name
}

// findBin returns the directory holding initdb and postgres: the one on
// PATH, else Debian's newest /usr/lib/postgresql/*/bin.
func findBin() (string, error) {
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(versions, func(a, b string) int { return version(b) - version(a) })
	for _, d := range append(dirs, versions...) {
		if isFile(filepath.Join(d, "initdb")) && isFile(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("no initdb and postgres on PATH or in /usr/lib/postgresql/*/bin")
}

// version is the major version of a /usr/lib/postgresql/N/bin, or 0.
func version(bin string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(bin)))
	return n
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}

// server is a running PostgreSQL: its process, its directory and its port.
type server struct {
	dir    string // removed on stop; data/ in it is the cluster and its socket
	port   int
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been waited for
	log    *syncbuf.Buffer
}

// startServer makes a cluster in a new directory and starts PostgreSQL on
// it, returning once it accepts connections.
func startServer(bin string, attr *syscall.SysProcAttr) (*server, error) {
	// A directory of its own, traversable by the server's user when that
	// is not ours (root runs it as another).
	dir, err := os.MkdirTemp("", "pgtest-*")
	if err != nil {
		return nil, err
	}
	s := &server{dir: dir, log: &syncbuf.Buffer{}}
	if err := s.start(bin, attr); err != nil {
		return nil, errors.Join(err, s.stop())
	}
	return s, nil
}

func (s *server) start(bin string, attr *syscall.SysProcAttr) error {
	data := filepath.Join(s.dir, "data")
	if err := prepareDirs(s.dir, data, attr); err != nil {
		return err
	}
	initdb := s.command(attr, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	if err := initdb.Run(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, s.log)
	}
	var err error
	if s.port, err = freePort(); err != nil {
		return err
	}
	s.cmd = s.command(attr, filepath.Join(bin, "postgres"), "-D", data,
		"-c", "listen_addresses=127.0.0.1", "-k", data, "-p", strconv.Itoa(s.port))
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	s.exited = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	if err := s.awaitReady(); err != nil {
		return err
	}
	return s.exec("postgres", "CREATE DATABASE "+database)
}

// command returns a command run with attr in the server's directory, its
// output going to the server's log.
func (s *server) command(attr *syscall.SysProcAttr, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = attr
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

// awaitReady waits, at most readyTimeout, for the server to take
// connections.
func (s *server) awaitReady() error {
	deadline := time.Now().Add(readyTimeout)
	for {
		err := s.exec("postgres", "SELECT 1")
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("postgres exited at start:\n%s", s.log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres not ready within %s: %v\n%s", readyTimeout, err, s.log)
		}
	}
}

// url is the URL of database name, as the superuser, over TCP.
func (s *server) url(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, name)
}

// exec runs one statement in database name, on a connection of its own.
func (s *server) exec(name, stmt string) error {
	db, err := sql.Open("pgx", s.url(name)+"&connect_timeout=5")
	if err != nil {
		return err
	}
	_, err = db.Exec(stmt)
	return errors.Join(err, db.Close())
}

// stop ends the server with a fast shutdown (SIGINT), or SIGKILL if it
// is not down within stopTimeout, and removes its directory.
func (s *server) stop() error {
	var err error
	if s.exited != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exited:
		case <-time.After(stopTimeout):
			err = fmt.Errorf("postgres not down within %s: killed", stopTimeout)
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	return errors.Join(err, os.RemoveAll(s.dir))
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	return port, ln.Close()
}
