package sut

import (
	"errors"
	"os"

	"github.com/turncheck/turncheck/internal/loopback"
)

// Instance is a reference server as the harness runs it in process: on a
// fresh loopback port, on a data dir of its own, with model-call deadlines
// that pass only when the harness expires them and a gauge of its
// activity. It can be restarted, gracefully or as a crash, on the same
// data. Its methods are those the harness asks of a server it controls
// (URL, Close, Restart, ExpireDeadlines, Activity).
type Instance struct {
	*Running
	cfg       Config
	deadlines *ManualDeadlines
	gauge     *Gauge
}

// StartInstance serves cfg on a fresh loopback port, on a fresh data dir
// that Close removes; cfg's DataDir, Deadlines and Gauge are the
// instance's own.
func StartInstance(cfg Config) (*Instance, error) {
	dir, err := os.MkdirTemp("", "turncheck-sut-*")
	if err != nil {
		return nil, err
	}
	in := &Instance{deadlines: &ManualDeadlines{}, gauge: &Gauge{}}
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
	var err error
	if crash {
		err = in.Running.Crash()
	} else {
		err = in.Running.Close()
	}
	if err != nil {
		return err
	}
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

// Close stops the server and removes its data dir.
func (in *Instance) Close() error {
	return errors.Join(in.Running.Close(), os.RemoveAll(in.cfg.DataDir))
}
