//go:build unix

package reference

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// acpReady bounds the wait for a run of the in-process agent to answer
// initialize: it answers at once, with nothing to load but the store.
const acpReady = 30 * time.Second

// acpServer is the reference server as an ACP agent, in process
// (sut.ACPInstance): the harness talks to each of its runs over the
// run's pipes, as it talks to 'turncheck serve acp' over a process's
// stdin and stdout, with the deadlines and the activity of an in-process
// server. Its methods are what the harness asks of an ACP agent it
// controls (ACP, Restart, ExpireDeadlines, Activity). It does not report
// when it is done with a request (a DisconnectReporter): ACP's prompts
// carry no tag of the harness's.
type acpServer struct {
	in   *sut.ACPInstance
	caps targets.ACPCapabilities
	// work is the sessions' working directory.
	work string

	mu   sync.Mutex
	conn *targets.ACPConn
}

// startACP serves cfg as an ACP agent in process and connects to it.
func startACP(cfg sut.Config, caps targets.ACPCapabilities) (targets.Server, error) {
	work, err := os.MkdirTemp("", "turncheck-acp-work-*")
	if err != nil {
		return nil, err
	}
	in, err := sut.StartACPInstance(cfg)
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(work))
	}
	s := &acpServer{in: in, caps: caps, work: work}
	if err := s.dial(); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// dial connects to the agent's current run: ready once it answers
// initialize.
func (s *acpServer) dial() error {
	p := s.in.Pipes()
	ctx, cancel := context.WithTimeout(context.Background(), acpReady)
	defer cancel()
	c, err := targets.DialACP(ctx, faults.StdioRun{In: p.In, Out: p.Out, Log: io.Discard, Exited: p.Exited}, s.caps, s.work)
	if err != nil {
		return fmt.Errorf("the in-process ACP agent: %w", err)
	}
	s.mu.Lock()
	s.conn = c
	s.mu.Unlock()
	return nil
}

// URL names the agent for reports: it listens on no address.
func (s *acpServer) URL() string { return "acp:in-process" }

// ACP is the connection to the agent's current run.
func (s *acpServer) ACP() *targets.ACPConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn
}

// Restart ends the agent's run, gracefully or as a crash, starts another
// on the same data, loading agents if not nil, and connects to it.
func (s *acpServer) Restart(crash bool, agents []string) error {
	if err := s.in.Restart(crash, agents); err != nil {
		return err
	}
	return s.dial()
}

// ExpireDeadlines makes the deadline of every model call in flight pass
// now.
func (s *acpServer) ExpireDeadlines() { s.in.ExpireDeadlines() }

// Activity returns how many prompts the agent is working on, how many
// wait for their session's turn, and a channel closed at the next change.
func (s *acpServer) Activity() (working, waiting int, changed <-chan struct{}) {
	return s.in.Activity()
}

// Close stops the agent and removes its data and working directory.
func (s *acpServer) Close() error {
	return errors.Join(s.in.Close(), os.RemoveAll(s.work))
}
