package sut

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/turncheck/turncheck/internal/loopback"
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/store"
)

// Instance is a reference server as the harness runs it in process: on a
// fresh loopback port, on a data dir of its own, with model-call deadlines
// that pass only when the harness expires them and a gauge of its
// activity. It can be restarted, gracefully or as a crash, on the same
// data. Its methods are those the harness asks of a server it controls
// (URL, Close, Restart, ExpireDeadlines, Activity).
type Instance struct {
	*Running
	cfg       config.Config
	deadlines *config.ManualDeadlines
	gauge     *admission.Gauge
}

// StartInstance serves cfg on a fresh loopback port, on a fresh data dir
// that Close removes; cfg's DataDir, Deadlines and Gauge are the
// instance's own.
func StartInstance(cfg config.Config) (*Instance, error) {
	return startInstance(cfg, &config.ManualDeadlines{}, &admission.Gauge{})
}

// startInstance is StartInstance with the given deadlines and gauge,
// which replicas share.
func startInstance(cfg config.Config, deadlines *config.ManualDeadlines, gauge *admission.Gauge) (*Instance, error) {
	dir, err := os.MkdirTemp("", "turncheck-sut-*")
	if err != nil {
		return nil, err
	}
	in := &Instance{deadlines: deadlines, gauge: gauge}
	cfg.DataDir, cfg.Deadlines, cfg.Gauge = dir, in.deadlines, in.gauge
	in.cfg = cfg
	if err := in.serve(); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	return in, nil
}

// serve starts the server on the instance's config, on a fresh loopback
// port whose connections reset on close: the harness starts thousands.
func (in *Instance) serve() error {
	time.Sleep(in.cfg.StartDelay)
	ln, err := loopback.Listen("")
	if err != nil {
		return err
	}
	run, err := Serve(in.cfg, ln)
	if err != nil {
		return err
	}
	in.Running = run
	return nil
}

// Restart closes the server, or drops it as a crash would (no graceful
// close: what was not durable is lost), and serves again on the same data
// dir, loading agents if not nil.
func (in *Instance) Restart(crash bool, agents []string) error {
	if err := in.stop(crash); err != nil {
		return err
	}
	return in.start(agents)
}

// Stop closes the server, or drops it as a crash would.
func (in *Instance) stop(crash bool) error {
	if crash {
		return in.Running.Crash()
	}
	return in.Running.Close()
}

// start serves again on the same data dir, loading agents if not nil.
func (in *Instance) start(agents []string) error {
	if agents != nil {
		in.cfg.Agents = agents
	}
	return in.serve()
}

// ExpireDeadlines makes the deadline of every model call in flight pass
// now.
func (in *Instance) ExpireDeadlines() { in.deadlines.Expire() }

// Activity returns how many requests the server is working on, how many
// wait for their conversation's turn, and a channel closed at the next
// change.
func (in *Instance) Activity() (working, waiting int, changed <-chan struct{}) {
	return in.gauge.Read()
}

// DoneWith reports whether the server is done with the request tagged
// tag (RequestTagHeader): it saw its client go away, or answered it.
func (in *Instance) DoneWith(tag string) bool { return in.gauge.DoneWith(tag) }

// Close stops the server and removes its data dir.
func (in *Instance) Close() error {
	return errors.Join(in.Running.Close(), os.RemoveAll(in.cfg.DataDir))
}

// Replicas are reference servers as the harness runs them in process over
// one PostgreSQL store (Config.Store), as a server of several replicas:
// each on a loopback port of its own, with a cache and conversation locks
// of its own, the store's locks shared. They share one gauge, so that
// their activity reads as one server's (a turn waiting for another
// replica's lock is waiting), and one set of model-call deadlines, which
// the harness expires on all at once. Its methods are an Instance's, and
// URLs and RestartReplica.
type Replicas struct {
	replicas  []*Instance
	deadlines *config.ManualDeadlines
	gauge     *admission.Gauge
}

// StartReplicas serves n replicas of cfg, whose Store must be a
// PostgreSQL URL: over SQLite each replica would open a store of its own.
func StartReplicas(cfg config.Config, n int) (*Replicas, error) {
	if !store.IsPostgresURL(cfg.Store) {
		return nil, errors.New("replicas share a PostgreSQL store: Config.Store must be a postgres:// URL")
	}
	if n < 1 {
		return nil, errors.New("replicas: at least one")
	}
	r := &Replicas{deadlines: &config.ManualDeadlines{}, gauge: &admission.Gauge{}}
	for range n {
		in, err := startInstance(cfg, r.deadlines, r.gauge)
		if err != nil {
			return nil, errors.Join(err, r.Close())
		}
		r.replicas = append(r.replicas, in)
	}
	return r, nil
}

// URL is the first replica's base URL.
func (r *Replicas) URL() string { return r.replicas[0].URL() }

// URLs are the replicas' base URLs, in order.
func (r *Replicas) URLs() []string {
	urls := make([]string, len(r.replicas))
	for i, in := range r.replicas {
		urls[i] = in.URL()
	}
	return urls
}

// Replicas is how many replicas serve.
func (r *Replicas) Replicas() int { return len(r.replicas) }

// Restart stops every replica, gracefully or as a crash, then serves
// each again, loading agents if not nil: as a whole server's restart, no
// replica serves while another is down.
func (r *Replicas) Restart(crash bool, agents []string) error {
	var errs []error
	for _, in := range r.replicas {
		errs = append(errs, in.stop(crash))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, in := range r.replicas {
		if err := in.start(agents); err != nil {
			return err
		}
	}
	return nil
}

// RestartReplica restarts replica i alone, gracefully or as a crash,
// while the others go on serving. It takes a context to be what the
// harness asks of a replicated server; an in-process start does not wait.
func (r *Replicas) RestartReplica(_ context.Context, i int, crash bool) error {
	if i < 0 || i >= len(r.replicas) {
		return fmt.Errorf("no replica %d of %d", i, len(r.replicas))
	}
	return r.replicas[i].Restart(crash, nil)
}

// ExpireDeadlines makes the deadline of every model call in flight, on
// any replica, pass now.
func (r *Replicas) ExpireDeadlines() { r.deadlines.Expire() }

// Activity returns how many requests the replicas are working on, how
// many wait for their conversation's turn, and a channel closed at the
// next change.
func (r *Replicas) Activity() (working, waiting int, changed <-chan struct{}) {
	return r.gauge.Read()
}

// DoneWith reports whether a replica is done with the request tagged
// tag (RequestTagHeader): it saw its client go away, or answered it.
func (r *Replicas) DoneWith(tag string) bool { return r.gauge.DoneWith(tag) }

// Close stops every replica.
func (r *Replicas) Close() error {
	var errs []error
	for _, in := range r.replicas {
		errs = append(errs, in.Close())
	}
	return errors.Join(errs...)
}
