package sut

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"

	"github.com/turncheck/turncheck/sut/internal/acp"
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
)

// ACPInstance is the reference server as an ACP agent (ServeACP) as the
// harness runs it in process: each run serves one client over a pair of
// pipes that stand for the process's stdin and stdout, on a data dir of
// its own, with model-call deadlines that pass only when the harness
// expires them and a gauge of its activity, as an Instance has. It can be
// restarted, gracefully or as a crash, on the same data: each run is a
// new connection, as a new process of 'turncheck serve acp' would be.
type ACPInstance struct {
	cfg       config.Config
	deadlines *config.ManualDeadlines
	gauge     *admission.Gauge

	mu  sync.Mutex
	run *acpRun
}

// ACPPipes are one run's ends of the pipes the client holds: what it
// writes to the agent (In, the agent's stdin) and what it reads of it
// (Out, the agent's stdout, which ends once the run has), and Exited,
// closed once the run has ended.
type ACPPipes struct {
	In     io.Writer
	Out    io.Reader
	Exited <-chan struct{}
}

// acpRun is one run of an ACPInstance: its server, the pipes, and what
// ends it.
type acpRun struct {
	s      *Server
	cancel context.CancelFunc
	// inR and outW are the server's ends of its stdin and stdout; inW and
	// outR the client's.
	inR  *io.PipeReader
	inW  *io.PipeWriter
	outR *io.PipeReader
	outW *io.PipeWriter
	// served is closed when serveACP has returned, with its error in err;
	// exited once the run has ended (its pipes cut).
	served chan struct{}
	err    error
	exited chan struct{}
	once   sync.Once
}

// errACPRunEnded is what a read or write on the pipes of a run that has
// ended gives.
var errACPRunEnded = errors.New("the agent's run has ended")

// StartACPInstance serves cfg as an ACP agent in process, on a fresh data
// dir that Close removes; cfg's DataDir, Deadlines and Gauge are the
// instance's own.
func StartACPInstance(cfg config.Config) (*ACPInstance, error) {
	dir, err := os.MkdirTemp("", "turncheck-sut-acp-*")
	if err != nil {
		return nil, err
	}
	in := &ACPInstance{deadlines: &config.ManualDeadlines{}, gauge: &admission.Gauge{}}
	cfg.DataDir, cfg.Deadlines, cfg.Gauge = dir, in.deadlines, in.gauge
	in.cfg = cfg
	if err := in.start(nil); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	return in, nil
}

// start serves a new run on the instance's data dir, loading agents if
// not nil.
func (in *ACPInstance) start(agents []string) error {
	if agents != nil {
		in.cfg.Agents = agents
	}
	s, err := New(in.cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &acpRun{s: s, cancel: cancel, served: make(chan struct{}), exited: make(chan struct{})}
	r.inR, r.inW = io.Pipe()
	r.outR, r.outW = io.Pipe()
	go func() {
		defer close(r.served)
		r.err = acp.Serve(ctx, s.engine, s.Close, r.inR, r.outW)
	}()
	in.mu.Lock()
	in.run = r
	in.mu.Unlock()
	return nil
}

// Pipes are the client's ends of the current run's stdin and stdout.
func (in *ACPInstance) Pipes() ACPPipes {
	in.mu.Lock()
	r := in.run
	in.mu.Unlock()
	return ACPPipes{In: r.inW, Out: r.outR, Exited: r.exited}
}

// cut ends the run's pipes, as a process's end does: its output ends (the
// client reads what was written, then EOF), its input takes nothing
// more, and Exited is closed.
func (r *acpRun) cut() {
	r.once.Do(func() {
		_ = r.outW.CloseWithError(io.EOF)
		_ = r.inR.CloseWithError(errACPRunEnded)
		close(r.exited)
	})
}

// Stop ends the run: gracefully as on SIGTERM to 'turncheck serve acp'
// (the prompts in flight dropped, each answered with an error, nothing of
// them kept), or as kill -9 (crash: no answer reaches the client, what is
// not durable is lost). It returns once every goroutine of the server has
// ended, so that a new run can open the same data dir at once.
func (r *acpRun) stop(crash bool) error {
	if crash {
		// The turns in flight die with the process: none may take its
		// cut pipes for a client that went away, and commit.
		r.s.engine.Crashing.Store(true)
		r.cut()
		_, err := r.s.crash()
		r.cancel()
		<-r.served
		return err
	}
	r.cancel()
	<-r.served
	r.cut()
	return r.err
}

// Restart ends the current run, gracefully or as a crash, and serves a
// new one on the same data dir, loading agents if not nil: the client
// then talks to the new run, through its pipes (Pipes).
func (in *ACPInstance) Restart(crash bool, agents []string) error {
	in.mu.Lock()
	r := in.run
	in.mu.Unlock()
	if err := r.stop(crash); err != nil {
		return err
	}
	return in.start(agents)
}

// ExpireDeadlines makes the deadline of every model call in flight pass
// now.
func (in *ACPInstance) ExpireDeadlines() { in.deadlines.Expire() }

// Activity returns how many prompts the server is working on, how many
// wait for their session's turn, and a channel closed at the next change.
func (in *ACPInstance) Activity() (working, waiting int, changed <-chan struct{}) {
	return in.gauge.Read()
}

// Close ends the current run gracefully and removes the data dir.
func (in *ACPInstance) Close() error {
	in.mu.Lock()
	r := in.run
	in.mu.Unlock()
	return errors.Join(r.stop(false), os.RemoveAll(in.cfg.DataDir))
}
