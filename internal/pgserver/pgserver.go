// Package pgserver runs a throwaway PostgreSQL server: on 127.0.0.1, on a
// free port, with its data and its socket in a temporary directory it
// removes when it stops. Tests start one through package pgtest; the
// harness starts one for a profile whose server keeps its store in
// PostgreSQL (store: postgres). Its cluster is a copy of one initdb made
// once, kept in the user's cache directory (turncheck/pgserver, a few
// tens of MB a PostgreSQL; safe to remove).
package pgserver

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
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/turncheck/turncheck/internal/loopback"
	"github.com/turncheck/turncheck/internal/syncbuf"
)

// Bounds on the server's start and stop: a server that does not come up
// or go down in time is an error, never a stall.
const (
	readyTimeout = 30 * time.Second
	stopTimeout  = 10 * time.Second
)

// ErrNotInstalled says that no PostgreSQL is installed here.
var ErrNotInstalled = errors.New("no PostgreSQL here: install it (Debian: apt-get install postgresql)")

// Installed returns nil where PostgreSQL can be run, and an error wrapping
// ErrNotInstalled where it is not installed.
func Installed() error {
	if _, err := findBin(); err != nil {
		return fmt.Errorf("%w (%v)", ErrNotInstalled, err)
	}
	_, err := procAttr()
	return err
}

// Start makes a cluster in a new temporary directory and starts PostgreSQL
// on it, returning once it accepts connections; settings are more
// "name=value" settings of the server's. Its error wraps ErrNotInstalled
// where there is no PostgreSQL to run.
func Start(settings ...string) (*Server, error) {
	if err := Installed(); err != nil {
		return nil, err
	}
	bin, _ := findBin()
	attr, err := procAttr()
	if err != nil {
		return nil, fmt.Errorf("cannot run PostgreSQL here: %w", err)
	}
	// A directory of its own, traversable by the server's user when that
	// is not ours (root runs it as another).
	dir, err := os.MkdirTemp("", "pgserver-*")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, log: &syncbuf.Buffer{}}
	if err := s.start(bin, attr, settings); err != nil {
		return nil, errors.Join(err, s.Stop())
	}
	return s, nil
}

// CreateDatabase makes an empty database and returns its URL.
func (s *Server) CreateDatabase(name string) (string, error) {
	if err := s.Exec("postgres", "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	return s.URL(name), nil
}

// Dir is the server's directory.
func (s *Server) Dir() string { return s.dir }

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

// Server is a running PostgreSQL: its process, its directory and its port.
type Server struct {
	dir    string // removed on stop; data/ in it is the cluster and its socket
	port   int
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been waited for
	log    *syncbuf.Buffer
}

func (s *Server) start(bin string, attr *syscall.SysProcAttr, settings []string) error {
	data := filepath.Join(s.dir, "data")
	if err := prepareDirs(s.dir, data, attr); err != nil {
		return err
	}
	if err := s.makeCluster(bin, data, attr); err != nil {
		return err
	}
	addr, err := loopback.FreeAddr()
	if err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(addr)
	s.port, _ = strconv.Atoi(port)
	args := []string{"-D", data, "-c", "listen_addresses=127.0.0.1", "-k", data, "-p", strconv.Itoa(s.port)}
	for _, set := range settings {
		args = append(args, "-c", set)
	}
	s.cmd = s.command(attr, filepath.Join(bin, "postgres"), args...)
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	s.exited = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	if err := s.awaitReady(); err != nil {
		return err
	}
	return nil
}

// command returns a command run with attr in the server's directory, its
// output going to the server's log.
func (s *Server) command(attr *syscall.SysProcAttr, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = attr
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

// awaitReady waits, at most readyTimeout, for the server to take
// connections.
func (s *Server) awaitReady() error {
	deadline := time.Now().Add(readyTimeout)
	for {
		err := s.Exec("postgres", "SELECT 1")
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

// URL is the URL of database name, as the superuser, over TCP.
func (s *Server) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, name)
}

// Exec runs one statement in database name, on a connection of its own.
func (s *Server) Exec(name, stmt string) error {
	db, err := sql.Open("pgx", s.URL(name)+"&connect_timeout=5")
	if err != nil {
		return err
	}
	_, err = db.Exec(stmt)
	return errors.Join(err, db.Close())
}

// Stop ends the server with a fast shutdown (SIGINT), or SIGKILL if it
// is not down within stopTimeout, and removes its directory.
func (s *Server) Stop() error {
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
