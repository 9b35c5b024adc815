package sut

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/turn"
)

// Running is a Server listening on an address.
type Running struct {
	*Server
	ln      net.Listener
	hs      *http.Server
	conns   *admission.ConnTracker
	serving chan struct{}
}

// Start opens a server with cfg and serves it on addr ("127.0.0.1:0" when
// empty: loopback, any free port). It returns once the server is listening.
func Start(cfg config.Config, addr string) (*Running, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return Serve(cfg, ln)
}

// Serve opens a server with cfg and serves it on ln, which it closes when
// the server stops or fails to open. Its connections are bounded in number
// (cfg.MaxConns), in the time their headers may take (cfg.HeaderTimeout)
// and in the time they may stay idle (cfg.IdleTimeout); the handler bounds
// the body. There is no write timeout for the whole response: a stream
// lasts as long as its turn, and every write has a deadline of its own
// (StreamWriteTimeout).
func Serve(cfg config.Config, ln net.Listener) (*Running, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, errors.Join(err, ln.Close())
	}
	conns := admission.NewConnTracker(s.engine.Cfg.MaxConns, s.engine.Log)
	r := &Running{
		Server: s,
		ln:     ln,
		conns:  conns,
		hs: &http.Server{
			Handler:           s,
			ReadHeaderTimeout: s.engine.Cfg.HeaderTimeout,
			IdleTimeout:       s.engine.Cfg.IdleTimeout,
			MaxHeaderBytes:    admission.MaxHeaderBytes,
			ConnContext:       conns.ConnContext,
			// net/http's complaints (accept errors) go to the server's log.
			ErrorLog: slog.NewLogLogger(s.engine.Log.Handler(), slog.LevelWarn),
		},
		serving: make(chan struct{}),
	}
	go func() {
		defer close(r.serving)
		_ = r.hs.Serve(conns.Listener(ln))
	}()
	return r, nil
}

// URL is the server's base URL, such as http://127.0.0.1:41234.
func (r *Running) URL() string { return "http://" + r.ln.Addr().String() }

// Close stops listening, drops every connection (turns in flight see their
// client go away and end as interrupted: Config.Interruption), waits for
// them to end and closes the store. Under Complete, where a client's going
// does not end a turn, it drops the turns in flight too: they commit
// nothing.
func (r *Running) Close() error {
	r.conns.Stop()
	r.dropTurns()
	err := r.hs.Close()
	<-r.serving
	r.conns.Wait()
	return errors.Join(err, r.Server.Close())
}

// dropTurns ends the turns still running, each answered that the server
// dropped it, and waits at most turn.DropAnswerWait for the answers to be
// written: an answer leaves net/http's buffer only after its handler
// returns, and a Shutdown returns once every connection is idle, its
// answer written (or the wait is over). The connections may close after.
func (r *Running) dropTurns() {
	r.Server.engine.DropTurns(0)
	answered, cancel := context.WithTimeout(context.Background(), turn.DropAnswerWait)
	defer cancel()
	_ = r.hs.Shutdown(answered)
}

// Crash is an in-process stand-in for kill -9: it closes the listener and
// every connection at once (no client hears how its turn ended), ends every
// model call in flight, drops what was acknowledged but is not durable yet
// (only the ack-before-durable mutant holds any) without writing it, and
// closes the store. It returns once every goroutine of the server has
// ended, so that a new server can open the same data dir at once: that one
// sees exactly what was durable. A later Close or Shutdown does nothing;
// after one of them, Crash does nothing.
func (r *Running) Crash() error {
	// The turns in flight die with the process: none may take its
	// dropped connection for a client that disconnected, and commit.
	r.Server.engine.Crashing.Store(true)
	// The connections go first: from here on nothing is written on any
	// of them, and each is closed (those with a turn running too), so no
	// reply reaches a client.
	r.conns.Crash()
	err := r.hs.Close()
	crashed, serr := r.Server.crash()
	<-r.serving
	r.conns.Wait()
	if !crashed {
		return nil // closed already
	}
	return errors.Join(err, serr)
}

// Shutdown stops listening, lets turns in flight finish (until ctx ends,
// when the rest are dropped and end as interrupted; under Complete they
// end too, and commit nothing), then closes the store. A turn that goes on
// after its client left (Complete) is a turn in flight like any other. A
// connection on which no turn runs (idle, or still sending its request) is
// closed at once: a stalled client does not hold the stop.
func (r *Running) Shutdown(ctx context.Context) error {
	r.conns.Stop()
	err := r.hs.Shutdown(ctx)
	if err != nil {
		// The grace ran out: the turns still running are dropped, each
		// answered so before its connection closes.
		r.dropTurns()
		err = errors.Join(err, r.hs.Close())
	}
	<-r.serving
	r.conns.Wait()
	return errors.Join(err, r.Server.Close())
}
