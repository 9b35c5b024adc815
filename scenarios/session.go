package scenarios

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/protocol"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/scenarios/validate"
)

// lab is what the sessions of one run share: the fake model, on one
// address for the whole run, and, for a target that reuses its server,
// that server. A check's run, each replay of the shrinker, and a replay of
// saved steps are each a session of a lab.
type lab struct {
	target  targets.Target
	profile targets.Profile
	fake    *faults.Model
	// clock is the timeline of the current session; the fake model stamps
	// calls on it, so each session's timeline starts at zero.
	clock atomic.Pointer[atomic.Int64]
	// shared is the server every session uses when the target reuses its
	// server, nil otherwise; started by the first session.
	shared targets.Server
	// run prefixes the namespaces of a reused server: unique to this run,
	// so that a second run against the same long-lived server does not
	// meet the first run's conversations.
	run      string
	sessions int
	// restartable says that a session's server could be restarted by the
	// harness (a Restarter).
	restartable bool
	// skip lists invariants whose violations do not stop a run: their
	// conversations are set aside and checking goes on.
	skip []model.Invariant
	// last is the server the latest session used, for its output.
	last targets.Server
	// skipKinds lists the kinds of wrong state already found: a violation
	// of one, under whatever invariant, is the same root cause again, and
	// sets its conversations aside as a skipped invariant's does.
	skipKinds []model.Kind
	// helpers are the labs that run checks and replays beside this one
	// (workers), closed with it.
	helpers []*lab
	// ctx, if not nil, is the run's: it bounds the start of a shared
	// server and its restarts, where the target allows (targets.ContextStarter).
	ctx context.Context
}

// start starts a server of l's target, cut short when ctx (if not nil)
// ends.
func (l *lab) start(ctx context.Context) (targets.Server, error) {
	cs, ok := l.target.(targets.ContextStarter)
	if !ok {
		return l.target.Start(l.fake.URL())
	}
	if ctx == nil {
		ctx = context.Background()
	}
	return cs.StartContext(ctx, l.fake.URL())
}

// output is the last lines the latest session's server wrote, "" if it
// keeps none.
func (l *lab) output() string {
	if o, ok := l.last.(targets.Outputter); ok {
		return strings.TrimRight(o.Output(), "\n ")
	}
	return ""
}

// StopNotes splits err, as Check, Conform or Replay return it, into what
// is only a note (a server that exited on SIGTERM with a failure status,
// after serving everything asked of it) and the rest, which is an error.
func StopNotes(err error) (notes []string, rest error) {
	if err == nil {
		return nil, nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var errs []error
		for _, e := range j.Unwrap() {
			n, r := StopNotes(e)
			notes = append(notes, n...)
			errs = append(errs, r)
		}
		return notes, errors.Join(errs...)
	}
	if se := (*faults.StopError)(nil); errors.As(err, &se) {
		return []string{"the server did not stop cleanly: " + err.Error()}, nil
	}
	return nil, err
}

// openLab starts the fake model a run's sessions share.
func openLab(target targets.Target, skip []model.Invariant) (*lab, error) {
	l := &lab{target: target, profile: target.Profile(), skip: skip}
	l.clock.Store(&atomic.Int64{})
	addr := ""
	if ma, ok := target.(targets.ModelAddresser); ok {
		addr = ma.ModelAddr()
	}
	fake, err := faults.StartModel(faults.ModelConfig{Addr: addr, Clock: func() int64 { return l.clock.Load().Add(1) }})
	if err != nil {
		return nil, err
	}
	l.fake = fake
	var nonce [3]byte
	_, _ = rand.Read(nonce[:]) // names a namespace only: never decides anything
	l.run = "tc" + hex.EncodeToString(nonce[:])
	return l, nil
}

func (l *lab) reuses() bool {
	r, ok := l.target.(targets.ServerReuser)
	return ok && r.ReuseServer()
}

// close stops the shared server, if any, and the fake model, and those
// of the helpers.
func (l *lab) close() error {
	var err error
	if l.shared != nil {
		if err = l.shared.Close(); err != nil {
			err = fmt.Errorf("stop the server under test: %w", err)
		}
	}
	err = errors.Join(err, l.fake.Close())
	for _, h := range l.helpers {
		err = errors.Join(err, h.close())
	}
	return err
}

// canRestart reports whether a session of l or of a helper had a server
// the harness could restart.
func (l *lab) canRestart() bool {
	return l.restartable || slices.ContainsFunc(l.helpers, (*lab).canRestart)
}

// session is one check against a server under test, and what executing
// plans against it has shown so far: the history and the reference state.
// A check's run and a replay of saved plans are both a session, so a plan
// executes the same way in either.
type session struct {
	lab     *lab
	profile targets.Profile
	srv     targets.Server
	// own is set when the session started srv, and so stops it.
	own    bool
	fake   *faults.Model
	client *protocol.Client
	exec   *executor
	ref    *model.Model
	// aside holds conversations set aside after a violation of a skipped
	// invariant: the reference state no longer says what they hold, so no
	// later turn of theirs is judged.
	aside map[model.ConversationRef]bool
	// skipped counts the violations of skipped invariants seen,
	// consequences the violations that involved set-aside state, and
	// sameCause those of a kind already found.
	skipped, consequences, sameCause map[model.Invariant]int
	// asideTokens are the user tokens of the conversations set aside:
	// seen anywhere later, they are a consequence of what set them aside.
	asideTokens map[model.Token]bool
	// unanswered counts the requests in a row that got no connection or
	// no answer at all, and dead says the server stopped answering.
	unanswered int
	dead       error
	// sources are the queries of the agent references the server loads.
	sources []string

	plans   []plan.Plan
	history []history.Op
}

// session starts a session: a fresh server, or the shared one under a
// fresh namespace, with the fake model reset. Its requests in flight are
// aborted when ctx ends (nil: never). The caller closes it.
func (l *lab) session(ctx context.Context) (*session, error) {
	spent := timeSpent{}
	defer spent.since(spentStarting, time.Now())
	clock := &atomic.Int64{}
	l.clock.Store(clock)
	l.sessions++
	srv, own, ns := l.shared, false, ""
	if l.reuses() {
		if l.shared == nil {
			s, err := l.start(l.ctx)
			if err != nil {
				return nil, fmt.Errorf("start the server under test: %w", err)
			}
			l.shared = s
		}
		if w, ok := l.shared.(targets.ServerWatcher); ok {
			if err := w.Exited(); err != nil {
				return nil, fmt.Errorf("the server under test died during the run: %w", err)
			}
		}
		srv, ns = l.shared, fmt.Sprintf("%s-%d-", l.run, l.sessions)
	} else {
		s, err := l.start(ctx)
		if err != nil {
			return nil, fmt.Errorf("start the server under test: %w", err)
		}
		srv, own = s, true
	}
	// On a shared server, every message the session sends carries its
	// namespace, and the fake model records only calls that carry it.
	l.fake.Reset(protocol.EpochTag(ns))
	_, l.restartable = srv.(targets.Restarter)
	l.last = srv
	cl := protocol.NewClient(srv.URL(), l.profile, ns)
	return &session{
		lab:     l,
		profile: l.profile,
		srv:     srv,
		own:     own,
		fake:    l.fake,
		client:  cl,
		exec:    &executor{srv: srv, fake: l.fake, client: cl, profile: l.profile, clock: clock, ctx: ctx, spent: spent},
		ref:     model.NewWith(l.profile.Policies()),
		aside:   map[model.ConversationRef]bool{},
		skipped: map[model.Invariant]int{}, consequences: map[model.Invariant]int{}, sameCause: map[model.Invariant]int{},
		asideTokens: map[model.Token]bool{},
		sources:     []string{targets.FirstSource},
	}, nil
}

// step executes p, records its history, and checks it: the reference
// model's chain check, then linearizability of the conversations a burst
// touched. It returns the ops p came to and the first violation, or nil.
// A violation of a skipped invariant is no violation: the conversations
// of the step are set aside, and the run goes on with the others.
func (s *session) step(p plan.Plan) ([]history.Op, *model.Violation) {
	ops := s.exec.execute(p)
	s.plans = append(s.plans, p)
	s.history = append(s.history, ops...)
	if ctx := s.exec.ctx; ctx != nil && ctx.Err() != nil {
		// The run's end cut the step short (its requests aborted, a
		// restart not waited for): what it came to decides nothing.
		return ops, nil
	}
	var restart *history.Op
	turns := make([]model.Turn, 0, len(ops))
	for i, op := range ops {
		switch {
		case op.Restart != nil:
			restart = &ops[i]
		case !s.aside[op.Turn.Conv]:
			turns = append(turns, op.Turn)
		}
	}
	if len(turns) == 0 && restart != nil {
		return ops, s.restarted(p.Restart, *restart)
	}
	v := s.ref.ApplyStep(turns)
	if v == nil {
		v = validate.CheckLinearizable(s.history, turns)
	}
	if restart != nil {
		// The turns ran up to the crash; the restart comes after them,
		// and the model learns of it even when a turn broke a skipped
		// invariant.
		if rv := s.restarted(p.Restart, *restart); v == nil {
			v = rv
		}
	}
	s.watch(ops)
	switch {
	case v == nil:
		return ops, nil
	case s.involvesAside(v, ops):
		// One root cause, one finding: what a violation already found
		// touched shows its consequences under other names.
		s.consequences[v.Invariant]++
	case slices.Contains(s.lab.skip, v.Invariant):
		s.skipped[v.Invariant]++
	case v.Kind != "" && slices.Contains(s.lab.skipKinds, v.Kind):
		s.sameCause[v.Invariant]++
	default:
		return ops, v
	}
	for _, t := range turns {
		s.setAside(t.Conv)
	}
	if v.Conv != (model.ConversationRef{}) {
		s.setAside(v.Conv)
	}
	return ops, nil
}

// setAside sets conversation ref aside, with every token sent on it so
// far; later ones are added as they are sent (watch).
func (s *session) setAside(ref model.ConversationRef) {
	s.aside[ref] = true
	for _, op := range s.history {
		if op.Restart == nil && op.Send.Conv == ref && op.Send.Token != "" {
			s.asideTokens[op.Send.Token] = true
		}
	}
}

// involvesAside reports whether v, seen in ops, involves state a violation
// already found set aside: its conversation, or a token of one.
func (s *session) involvesAside(v *model.Violation, ops []history.Op) bool {
	if len(s.aside) == 0 {
		return false
	}
	if s.aside[v.Conv] {
		return true
	}
	mentions := func(toks []model.Token) bool {
		return slices.ContainsFunc(toks, func(tok model.Token) bool { return s.asideTokens[tok.User()] })
	}
	if mentions(v.Observed) {
		return true
	}
	for _, op := range ops {
		if op.Send.Conv != v.Conv {
			continue
		}
		for _, c := range op.Turn.Calls {
			if mentions(c.History) {
				return true
			}
		}
	}
	return false
}

// deadAfter is how many requests in a row may go without a connection or
// an answer before the run takes the server to have stopped answering;
// exitWait is how long a watched process then has to be seen exiting.
const (
	deadAfter = 8
	exitWait  = 2 * time.Second
)

// watch follows the step's requests: tokens sent on set-aside
// conversations, and a server that stopped answering.
func (s *session) watch(ops []history.Op) {
	for _, op := range ops {
		if op.Restart != nil {
			s.unanswered = 0 // a restart that did not come back is T7's, or an error
			continue
		}
		if s.aside[op.Send.Conv] && op.Send.Token != "" {
			s.asideTokens[op.Send.Token] = true
		}
		switch op.Response.Cause {
		case protocol.CauseRefused, protocol.CauseNoAnswer:
			s.unanswered++
		default:
			s.unanswered = 0
		}
	}
	if s.dead != nil || s.unanswered == 0 {
		return
	}
	w, watched := s.srv.(targets.ServerWatcher)
	exited := error(nil)
	if watched {
		exited = w.Exited()
	}
	if exited == nil && s.unanswered < deadAfter {
		return
	}
	for wait := time.Now(); watched && exited == nil && time.Since(wait) < exitWait; {
		// A process that stopped answering is most likely dying: say so,
		// with its last words, once it is seen to have exited.
		time.Sleep(10 * time.Millisecond)
		exited = w.Exited()
	}
	last := ops[len(ops)-1]
	if exited != nil {
		s.dead = fmt.Errorf("the server under test died during the run: step %d got %s; its last answers before: %s\n%w",
			last.Step, last.Response.Cause, s.lastAnswers(3), exited)
		return
	}
	s.dead = fmt.Errorf("the server under test stopped answering during the run: %d request(s) in a row, up to step %d, got %s; "+
		"its last answers before: %s", s.unanswered, last.Step, last.Response.Cause, s.lastAnswers(3))
}

// lastAnswers describes the last n answers the server gave, newest last.
func (s *session) lastAnswers(n int) string {
	var out []string
	for i := len(s.history) - 1; i >= 0 && len(out) < n; i-- {
		op := s.history[i]
		if op.Restart != nil || op.Response.Status == 0 {
			continue
		}
		a := fmt.Sprintf("step %d: %s %d", op.Step, op.Response.Outcome, op.Response.Status)
		if op.Response.Detail != "" {
			a += " (" + protocol.ClipText(op.Response.Detail, 80) + ")"
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return "none"
	}
	slices.Reverse(out)
	return strings.Join(out, "; ")
}

// restarted tells the reference model of a restart the server went
// through. A server that declares it survives restarts, and did not come
// back on its own data, has lost every committed turn (T7).
func (s *session) restarted(r *plan.Restart, op history.Op) *model.Violation {
	if op.Response.Outcome != model.OK {
		return &model.Violation{Invariant: model.T7, Reason: r.String() + ": " + op.Response.Detail}
	}
	changed := r.Sources != nil && !slices.Equal(r.Sources, s.sources)
	if r.Sources != nil {
		s.sources = r.Sources
	}
	s.ref.Restart(changed, len(s.sources) > 1)
	return nil
}

// close stops the session's server, if it started it, and checks that a
// shared server is still alive. A server that does not stop cleanly, or
// died on its own, is a defect.
func (s *session) close() error {
	s.client.Close()
	if !s.own {
		if s.lab.ctx != nil && s.lab.ctx.Err() != nil {
			return nil // the run is over: the shared server is stopped next
		}
		// The next check starts as this one did: the agent under its
		// first reference, on a server that runs (a restart its check's
		// bound cut short left none).
		if s.exec.cutRestart || !slices.Equal(s.sources, []string{targets.FirstSource}) {
			r, ok := s.srv.(targets.Restarter)
			if ok {
				refs := targets.SourceRefs(s.fake.URL(), s.profile.Agent, []string{targets.FirstSource})
				if err := r.Restart(false, refs); err != nil {
					return fmt.Errorf("restart the server under test with its first agent source: %w", err)
				}
			}
		}
		return nil // a shared server's death is found when the next session starts
	}
	if err := s.srv.Close(); err != nil {
		return fmt.Errorf("stop the server under test: %w", err)
	}
	return nil
}

// Replay executes plans, in order, against a fresh server of target, and
// validates every step as a check does, without rapid's search: the same
// plans give the same steps, and, against a server that behaves the same
// way under them, the same verdict. Violations of the skipped invariants
// set their conversations aside, as in the run that found the failure. It
// stops at the first other violation and returns the history up to it and
// the violation (nil if none). The error says the replay could not be
// carried out.
func Replay(target targets.Target, plans []plan.Plan, skip ...model.Invariant) ([]history.Op, *model.Violation, error) {
	return ReplayFailure(target, &report.Failure{Plans: plans, Skipped: skip})
}

// ReplayFailure is Replay of a saved failure's plans, with what its run
// had set aside: the invariants it skipped, and the kinds of wrong state
// already found, whose violations set their conversations aside again.
func ReplayFailure(target targets.Target, f *report.Failure) ([]history.Op, *model.Violation, error) {
	for i, p := range f.Plans {
		if err := p.Check(); err != nil {
			return nil, nil, fmt.Errorf("step %d: %w", i+1, err)
		}
	}
	l, err := openLab(target, f.Skipped)
	if err != nil {
		return nil, nil, err
	}
	l.skipKinds = f.SkippedKinds
	history, v, err := l.replay(context.Background(), f.Plans)
	return history, v, errors.Join(err, l.close())
}

// replay executes plans in a new session of l, stopped when ctx ends: the
// requests in flight are aborted, and the run decides nothing.
func (l *lab) replay(ctx context.Context, plans []plan.Plan) ([]history.Op, *model.Violation, error) {
	s, err := l.session(ctx)
	if err != nil {
		return nil, nil, err
	}
	var v *model.Violation
	for _, p := range plans {
		if ctx.Err() != nil {
			break
		}
		if _, v = s.step(p); v != nil {
			break
		}
		if s.dead != nil {
			return s.history, nil, errors.Join(s.dead, s.close())
		}
	}
	return s.history, v, s.close()
}
