package execute

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
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/scenarios/validate"
)

// Lab is what the sessions of one run share: the fake model, on one
// address for the whole run, and, for a target that reuses its server,
// that server. A check's run, each replay of the shrinker, and a replay of
// saved steps are each a session of a Lab.
type Lab struct {
	Target  targets.Target
	Profile targets.Profile
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
	// Skip lists invariants whose violations do not stop a run: their
	// conversations are set aside and checking goes on.
	Skip []model.Invariant
	// Last is the server the latest session used, for its output.
	Last targets.Server
	// SkipKinds lists the kinds of wrong state already found: a violation
	// of one, under whatever invariant, is the same root cause again, and
	// sets its conversations aside as a skipped invariant's does.
	SkipKinds []model.Kind
	// Helpers are the labs that run checks and replays beside this one
	// (workers), closed with it.
	Helpers []*Lab
	// earlier are the last answers of the server the previous session of
	// a shared server got: what a check that meets the server dead at
	// once can quote.
	earlier []string
	// Context, if not nil, is the run's: it bounds the start of a shared
	// server and its restarts, where the target allows (targets.ContextStarter).
	Context context.Context
}

// start starts a server of l's target, cut short when ctx (if not nil)
// ends.
func (l *Lab) start(ctx context.Context) (targets.Server, error) {
	cs, ok := l.Target.(targets.ContextStarter)
	if !ok {
		return l.Target.Start(l.fake.URL())
	}
	if ctx == nil {
		ctx = context.Background()
	}
	return cs.StartContext(ctx, l.fake.URL())
}

// Output is the last lines the latest session's server wrote, "" if it
// keeps none.
func (l *Lab) Output() string {
	if o, ok := l.Last.(targets.Outputter); ok {
		return strings.TrimRight(o.Output(), "\n ")
	}
	return ""
}

// Open starts the fake model a run's sessions share.
func Open(target targets.Target, skip []model.Invariant) (*Lab, error) {
	l := &Lab{Target: target, Profile: target.Profile(), Skip: skip}
	l.clock.Store(&atomic.Int64{})
	addr := ""
	if ma, ok := target.(targets.ModelAddresser); ok {
		addr = ma.ModelAddr()
	}
	fake, err := faults.StartModel(faults.ModelConfig{Addr: addr, Clock: func() int64 { return l.clock.Load().Add(1) },
		AgentDefinition: l.Profile.AgentDefinition})
	if err != nil {
		return nil, err
	}
	l.fake = fake
	var nonce [3]byte
	_, _ = rand.Read(nonce[:]) // names a namespace only: never decides anything
	l.run = "tc" + hex.EncodeToString(nonce[:])
	return l, nil
}

func (l *Lab) reuses() bool {
	r, ok := l.Target.(targets.ServerReuser)
	return ok && r.ReuseServer()
}

// Close stops the shared server, if any, and the fake model, and those
// of the helpers.
func (l *Lab) Close() error {
	var err error
	if l.shared != nil {
		if err = l.shared.Close(); err != nil {
			err = fmt.Errorf("stop the server under test: %w", err)
		}
	}
	err = errors.Join(err, l.fake.Close())
	for _, h := range l.Helpers {
		err = errors.Join(err, h.Close())
	}
	return err
}

// CanRestart reports whether a session of l or of a helper had a server
// the harness could restart.
func (l *Lab) CanRestart() bool {
	return l.restartable || slices.ContainsFunc(l.Helpers, (*Lab).CanRestart)
}

// Session is one check against a server under test, and what executing
// plans against it has shown so far: the history and the reference state.
// A check's run and a replay of saved plans are both a Session, so a plan
// executes the same way in either.
type Session struct {
	lab     *Lab
	Profile targets.Profile
	Server  targets.Server
	// own is set when the session started srv, and so stops it.
	own    bool
	fake   *faults.Model
	client *protocol.Client
	Exec   *executor
	Ref    *model.Model
	// Aside holds conversations set Aside after a violation of a skipped
	// invariant: the reference state no longer says what they hold, so no
	// later turn of theirs is judged.
	Aside map[model.ConversationRef]bool
	// Skipped counts the violations of Skipped invariants seen,
	// Consequences the violations that involved set-aside state, and
	// SameCause those of a kind already found.
	Skipped, Consequences, SameCause map[model.Invariant]int
	// asideTokens are the user tokens of the conversations set aside:
	// seen anywhere later, they are a consequence of what set them aside.
	asideTokens map[model.Token]bool
	// unanswered counts the requests in a row that got no connection or
	// no answer at all; Dead, once set, stops the run: the server stopped
	// answering, or the harness could not heal a link it broke.
	unanswered int
	Dead       error
	// sources are the queries of the agent references the server loads.
	sources []string

	Plans   []plan.Plan
	History []history.Op
}

// Session starts a Session: a fresh server, or the shared one under a
// fresh namespace, with the fake model reset. Its requests in flight are
// aborted when ctx ends (nil: never). The caller closes it.
func (l *Lab) Session(ctx context.Context) (*Session, error) {
	spent := timeSpent{}
	defer spent.since(spentStarting, time.Now())
	clock := &atomic.Int64{}
	l.clock.Store(clock)
	l.sessions++
	srv, own, ns := l.shared, false, ""
	if l.reuses() {
		if l.shared == nil {
			s, err := l.start(l.Context)
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
	l.Last = srv
	cl := protocol.NewClient(targets.URLs(srv), l.Profile, ns)
	if l.Profile.Agent != "" {
		cl.Loaded(l.Profile.SourceRefs(l.fake.URL(), []string{targets.FirstSource}))
	}
	return &Session{
		lab:     l,
		Profile: l.Profile,
		Server:  srv,
		own:     own,
		fake:    l.fake,
		client:  cl,
		Exec:    &executor{srv: srv, fake: l.fake, client: cl, profile: l.Profile, clock: clock, ctx: ctx, spent: spent},
		Ref:     model.NewWith(l.Profile.Policies()),
		Aside:   map[model.ConversationRef]bool{},
		Skipped: map[model.Invariant]int{}, Consequences: map[model.Invariant]int{}, SameCause: map[model.Invariant]int{},
		asideTokens: map[model.Token]bool{},
		sources:     []string{targets.FirstSource},
	}, nil
}

// Step executes p, records its history, and checks it: the reference
// model's chain check, then linearizability of the conversations a burst
// touched. It returns the ops p came to and the first violation, or nil.
// A violation of a skipped invariant is no violation: the conversations
// of the Step are set aside, and the run goes on with the others.
func (s *Session) Step(p plan.Plan) ([]history.Op, *model.Violation) {
	ops := s.Exec.execute(p)
	s.Plans = append(s.Plans, p)
	s.History = append(s.History, ops...)
	for _, op := range ops {
		if op.HarnessError != "" {
			s.Dead = fmt.Errorf("step %d (%s): %s: the run stops, judging nothing by it", op.Step, op.Action, op.HarnessError)
			return ops, nil
		}
	}
	if ctx := s.Exec.ctx; ctx != nil && ctx.Err() != nil {
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
		case !s.Aside[op.Turn.Conv]:
			turns = append(turns, op.Turn)
		}
	}
	if len(turns) == 0 && restart != nil {
		return ops, s.restarted(p.Restart, *restart)
	}
	for _, send := range p.Sends {
		if send.From != nil {
			// A branch starts from its base as the step found it.
			s.Ref.Fork(*send.From, send.Conv)
		}
	}
	v := s.Ref.ApplyStep(turns)
	if v == nil {
		v = validate.CheckLinearizable(s.History, turns)
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
		s.Consequences[v.Invariant]++
	case slices.Contains(s.lab.Skip, v.Invariant):
		s.Skipped[v.Invariant]++
	case v.Kind != "" && slices.Contains(s.lab.SkipKinds, v.Kind):
		s.SameCause[v.Invariant]++
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
func (s *Session) setAside(ref model.ConversationRef) {
	s.Aside[ref] = true
	for _, op := range s.History {
		if op.Restart == nil && op.Send.Conv == ref && op.Send.Token != "" {
			s.asideTokens[op.Send.Token] = true
		}
	}
}

// involvesAside reports whether v, seen in ops, involves state a violation
// already found set aside: its conversation, or a token of one.
func (s *Session) involvesAside(v *model.Violation, ops []history.Op) bool {
	if len(s.Aside) == 0 {
		return false
	}
	if s.Aside[v.Conv] {
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
func (s *Session) watch(ops []history.Op) {
	for _, op := range ops {
		if op.Restart != nil {
			s.unanswered = 0 // a restart that did not come back is T7's, or an error
			continue
		}
		if s.Aside[op.Send.Conv] && op.Send.Token != "" {
			s.asideTokens[op.Send.Token] = true
		}
		if strings.Contains(op.Net, history.NetNotHealed) {
			// Later steps would run over a link that may still be
			// broken, and be judged as the server's doing: the run stops,
			// an error of the harness's, not a verdict.
			s.Dead = fmt.Errorf("the harness could not take its network fault off a replica's link (%s): the run stops", op.Net)
			return
		}
		switch op.Response.Cause {
		case protocol.CauseRefused, protocol.CauseNoAnswer:
			if op.Net == history.NetBroken {
				// The harness broke the link: no sign of a server that
				// stopped answering.
				continue
			}
			s.unanswered++
		default:
			s.unanswered = 0
		}
	}
	if s.Dead != nil || s.unanswered == 0 {
		return
	}
	w, watched := s.Server.(targets.ServerWatcher)
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
		s.Dead = fmt.Errorf("the server under test died during the run: step %d got %s; its last answers before: %s\n%w",
			last.Step, last.Response.Cause, s.lastAnswers(3), exited)
		return
	}
	s.Dead = fmt.Errorf("the server under test stopped answering during the run: %d request(s) in a row, up to step %d, got %s; "+
		"its last answers before: %s", s.unanswered, last.Step, last.Response.Cause, s.lastAnswers(3))
}

// lastAnswers describes the last n answers the server gave, newest last:
// in this session, or, on a shared server that gave it none, in the one
// before.
func (s *Session) lastAnswers(n int) string {
	out := s.answers(n)
	switch {
	case len(out) > 0:
		return strings.Join(out, "; ")
	case len(s.lab.earlier) > 0:
		return "none in this check; in the check before, " + strings.Join(s.lab.earlier, "; ")
	}
	return "none"
}

// answers are the last n answers the server gave in this session, newest
// last.
func (s *Session) answers(n int) []string {
	var out []string
	for i := len(s.History) - 1; i >= 0 && len(out) < n; i-- {
		op := s.History[i]
		if op.Restart != nil || op.Response.Status == 0 {
			continue
		}
		a := fmt.Sprintf("step %d: %s %d", op.Step, op.Response.Outcome, op.Response.Status)
		if op.Response.Detail != "" {
			a += " (" + protocol.ClipText(op.Response.Detail, 80) + ")"
		}
		out = append(out, a)
	}
	slices.Reverse(out)
	return out
}

// restarted tells the reference model of a restart the server went
// through. A server that declares it survives restarts, and did not come
// back on its own data, has lost every committed turn (T7).
func (s *Session) restarted(r *plan.Restart, op history.Op) *model.Violation {
	if op.Response.Outcome != model.OK {
		return &model.Violation{Invariant: model.T7, Reason: r.String() + ": " + op.Response.Detail}
	}
	changed := r.Sources != nil && !slices.Equal(r.Sources, s.sources)
	if r.Sources != nil {
		s.sources = r.Sources
	}
	s.Ref.Restart(changed, len(s.sources) > 1)
	return nil
}

// Close stops the session's server, if it started it, and checks that a
// shared server is still alive. A server that does not stop cleanly, or
// died on its own, is a defect.
func (s *Session) Close() error {
	s.client.Close()
	if !s.own {
		if a := s.answers(3); len(a) > 0 {
			s.lab.earlier = a
		}
		if s.lab.Context != nil && s.lab.Context.Err() != nil {
			return nil // the run is over: the shared server is stopped next
		}
		// The next check starts as this one did: the agent under its
		// first reference, on a server that runs (a restart its check's
		// bound cut short left none).
		if s.Exec.cutRestart || !slices.Equal(s.sources, []string{targets.FirstSource}) {
			r, ok := s.Server.(targets.Restarter)
			if ok {
				refs := s.Profile.SourceRefs(s.fake.URL(), []string{targets.FirstSource})
				if err := r.Restart(false, refs); err != nil {
					return fmt.Errorf("restart the server under test with its first agent source: %w", err)
				}
			}
		}
		return nil // a shared server's death is found when the next session starts
	}
	if err := s.Server.Close(); err != nil {
		return fmt.Errorf("stop the server under test: %w", err)
	}
	return nil
}

// Replay executes plans in a new session of l, stopped when ctx ends: the
// requests in flight are aborted, and the run decides nothing.
func (l *Lab) Replay(ctx context.Context, plans []plan.Plan) ([]history.Op, *model.Violation, error) {
	s, err := l.Session(ctx)
	if err != nil {
		return nil, nil, err
	}
	var v *model.Violation
	for _, p := range plans {
		if ctx.Err() != nil {
			break
		}
		if _, v = s.Step(p); v != nil {
			break
		}
		if s.Dead != nil {
			return s.History, nil, errors.Join(s.Dead, s.Close())
		}
	}
	return s.History, v, s.Close()
}

// Workers returns n labs for checks and replays to run in at once: l
// and n-1 more, each with a fake model and servers of its own, kept until
// l closes. They set aside what l sets aside.
func (l *Lab) Workers(n int) ([]*Lab, error) {
	for len(l.Helpers) < n-1 {
		h, err := Open(l.Target, nil)
		if err != nil {
			return nil, err
		}
		l.Helpers = append(l.Helpers, h)
	}
	out := []*Lab{l}
	for _, h := range l.Helpers[:max(n-1, 0)] {
		h.Skip, h.SkipKinds, h.Context = l.Skip, l.SkipKinds, l.Context
		out = append(out, h)
	}
	return out, nil
}
