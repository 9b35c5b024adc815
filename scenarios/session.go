package scenarios

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
)

// session is one fresh server under test with its own fake model, and
// what executing plans against it has shown so far: the history and the
// reference state. A check's run and a replay of saved plans are both a
// session, so a plan executes the same way in either.
type session struct {
	profile Profile
	srv     Server
	fake    *faults.Model
	client  *client
	exec    *executor
	ref     *model.Model

	plans   []Plan
	history []Op
}

// startSession starts a fake model and one of target's servers in front of
// it. The caller closes the session.
func startSession(target Target) (*session, error) {
	clock := &atomic.Int64{}
	fake, err := faults.StartModel(faults.ModelConfig{Clock: func() int64 { return clock.Add(1) }})
	if err != nil {
		return nil, err
	}
	srv, err := target.Start(fake.URL())
	if err != nil {
		return nil, errors.Join(fmt.Errorf("start the server under test: %w", err), fake.Close())
	}
	profile := target.Profile()
	cl := newClient(srv.URL(), profile)
	return &session{
		profile: profile,
		srv:     srv,
		fake:    fake,
		client:  cl,
		exec:    &executor{srv: srv, fake: fake, client: cl, clock: clock},
		ref:     model.NewWith(model.Policies{Concurrency: profile.Concurrency}),
	}, nil
}

// step executes p, records its history, and checks it: the reference
// model's chain check, then linearizability of the conversations a burst
// touched. It returns the ops p came to and the first violation, or nil.
func (s *session) step(p Plan) ([]Op, *model.Violation) {
	ops := s.exec.execute(p)
	s.plans = append(s.plans, p)
	s.history = append(s.history, ops...)
	turns := make([]model.Turn, len(ops))
	for i, op := range ops {
		turns[i] = op.Turn
	}
	v := s.ref.ApplyStep(turns)
	if v == nil {
		v = checkLinearizable(s.history, turns)
	}
	return ops, v
}

// close stops the server and the fake model. The server's error comes
// first: a server that does not stop cleanly is a defect.
func (s *session) close() error {
	s.client.close()
	err := s.srv.Close()
	_ = s.fake.Close()
	if err != nil {
		return fmt.Errorf("stop the server under test: %w", err)
	}
	return nil
}

// Replay executes plans, in order, against a fresh server of target, and
// validates every step as a check does, without rapid's search: the same
// plans give the same steps, and, against a server that behaves the same
// way under them, the same verdict. It stops at the first violation and
// returns the history up to it and the violation (nil if none). The error
// says the replay could not be carried out.
func Replay(target Target, plans []Plan) ([]Op, *model.Violation, error) {
	for i, p := range plans {
		if err := p.check(); err != nil {
			return nil, nil, fmt.Errorf("step %d: %w", i+1, err)
		}
	}
	return replayContext(context.Background(), target, plans)
}
