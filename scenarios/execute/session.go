package execute

import (
	"cmp"
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
	// Aux are the instructions of the server's auxiliary calls learned so
	// far, shared with the labs that shrink and replay what this one
	// finds (Open gives a lab a set of its own).
	Aux *AuxInstructions
	// SkipKinds lists the kinds of wrong state already found: a violation
	// of one, under whatever invariant, is the same root cause again, and
	// sets its conversations aside as a skipped invariant's does.
	SkipKinds []model.Kind
	// Pace is what the server costs, as the run's labs measure it, shared
	// with the workers.
	Pace *Pace
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
	// ExitedBetween says, for each time a shared server was found to have
	// exited on its own between two checks (after the last step of one
	// was looked at), how it exited, with its last output: a crash no
	// step can be shown to have caused, started again and said.
	ExitedBetween []string
	// watched says that a session's server was one whose process the
	// harness watches (a ServerWatcher): an exit of its is seen.
	watched bool
	// down says the shared server went down in a session (its crash a
	// finding, or skipped) and did not come back when that session
	// closed: the next session starts it again, and says nothing more.
	down bool
	// NotStarted, once set, says the server did not start within its
	// tries: the start finding. Every later start of the lab's returns
	// it without trying: the run ends at it.
	NotStarted *NotStarted
	// Retried notes each try of a start that failed and was tried again
	// (targets.Profile.StartTries), with what the server last wrote.
	Retried []string
	// Starts counts the starts of the lab's servers that got ready: its
	// first, restarts, and starts again after it went down.
	Starts int
	// held are the sessions the shared server served since it started,
	// by their tag (protocol.EpochTag): a later session that meets their
	// messages, a leak between checks, shows it again only after their
	// steps (Session.Earlier).
	held map[string]heldSession
	// leaks says a replay here broke an invariant with messages of a
	// session it did not run (left on the shared server by a check, or by
	// another replay): the server leaks between sessions, and every later
	// replay runs on a fresh server, where only its own steps are.
	leaks bool
}

// heldSession is a session a shared server served: its number among the
// lab's sessions, its check's number (0 for a replay), and its steps.
type heldSession struct {
	n, check int
	plans    []plan.Plan
}

// startShared starts the server the lab's sessions share, which holds
// no session yet; what says which start it is, in words (Lab.start).
func (l *Lab) startShared(ctx context.Context, what string) error {
	s, err := l.start(ctx, what)
	if err != nil {
		return err
	}
	l.shared, l.held = s, map[string]heldSession{}
	return nil
}

// start starts a server of l's target (what says which start, in
// words), up to its tries, cut short when ctx (if not nil) ends. A
// server that ran and did not get ready in any try is NotStarted; any
// other error says that the server could not be started at all.
func (l *Lab) start(ctx context.Context, what string) (targets.Server, error) {
	if l.NotStarted != nil {
		return nil, l.NotStarted
	}
	var srv targets.Server
	tries, err := l.tryStart(ctx, what, func() error {
		began := time.Now()
		var err error
		if cs, ok := l.Target.(targets.ContextStarter); ok {
			srv, err = cs.StartContext(cmp.Or(ctx, context.Background()), l.fake.URL())
		} else {
			srv, err = l.Target.Start(l.fake.URL())
		}
		if err == nil {
			l.Pace.started(time.Since(began))
		}
		return err
	}, firstStartFailed)
	switch {
	case err == nil:
		return srv, nil
	case firstStartFailed(err) && !ended(ctx):
		return nil, l.notStarted(what, 0, tries, err)
	}
	return nil, fmt.Errorf("start the server under test: %w", err)
}

// revive starts the shared server again if it exited after the last
// step of the session before was checked (and looked at once more, End):
// no step of a check can be shown to have caused it, so it is no finding
// with steps, but it is said (ExitedBetween), never let pass.
func (l *Lab) revive(ctx context.Context) error {
	w, ok := l.shared.(targets.ServerWatcher)
	if !ok {
		return nil
	}
	exited := w.Exited()
	if exited == nil && !l.down {
		return nil
	}
	// A server that went down in the session before, and did not come
	// back when it closed, is started again whether or not a process of
	// it is left to have exited.
	r, ok := l.shared.(targets.Restarter)
	if !ok {
		return fmt.Errorf("the server under test exited between two checks, and cannot be started again: %w",
			cmp.Or(exited, errors.New("it is down")))
	}
	what := "its start again after it went down in the check before (a crash found, or skipped)"
	if !l.down {
		l.ExitedBetween = append(l.ExitedBetween, exited.Error())
		what = "its start again after it exited on its own between two checks"
	}
	if err := l.restart(ctx, r, true, l.firstRefs(), what); err != nil {
		var ns *NotStarted
		if errors.As(err, &ns) {
			return err
		}
		if l.down {
			return fmt.Errorf("the server under test went down (a finding), and did not come back when started again: %w", err)
		}
		return fmt.Errorf("the server under test exited between two checks (%v), and did not come back when started again: %w", exited, err)
	}
	l.down = false
	return nil
}

// firstRefs are the references a check starts the server's agent from:
// its first source, or nil for a server that loads none from the fake
// model (its command keeps what it has).
func (l *Lab) firstRefs() []string {
	if l.Profile.Agent == "" {
		return nil
	}
	return l.Profile.SourceRefs(l.fake.URL(), []string{targets.FirstSource})
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
	l := &Lab{Target: target, Profile: target.Profile(), Skip: skip, Aux: &AuxInstructions{}, Pace: &Pace{}}
	l.clock.Store(&atomic.Int64{})
	addr := ""
	if ma, ok := target.(targets.ModelAddresser); ok {
		addr = ma.ModelAddr()
	}
	fake, err := faults.StartModel(faults.ModelConfig{Addr: addr, Clock: func() int64 { return l.clock.Load().Add(1) },
		AgentDefinition: l.Profile.AgentDefinition,
		// Read at each call: a replay sets the instructions of its saved
		// failure after Open.
		Auxiliary: func(prompt uint32) bool { return l.Aux.has(prompt) }})
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
// of the helpers. A shared server found exited on its own is said in
// ExitedBetween, not an error.
func (l *Lab) Close() error {
	var err error
	if l.shared != nil {
		if w, ok := l.shared.(targets.ServerWatcher); ok && !l.down {
			if exited := w.Exited(); exited != nil {
				// After the last check was looked at: as between two.
				l.ExitedBetween, l.down = append(l.ExitedBetween, exited.Error()), true
			}
		}
		// One that went down says so as it stops: no news.
		if cerr := l.shared.Close(); cerr != nil && !l.down {
			err = fmt.Errorf("stop the server under test: %w", cerr)
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

// CanWatch reports whether a session of l or of a helper had a server
// whose process the harness watches: one that exits on its own is seen.
func (l *Lab) CanWatch() bool {
	return l.watched || slices.ContainsFunc(l.Helpers, (*Lab).CanWatch)
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
	// Folded is the first violation of each invariant counted in
	// SameCause: an example kept with the finding it was folded into.
	Folded map[model.Invariant]model.Violation
	// asideTokens are the user tokens of the conversations set aside:
	// seen anywhere later, they are a consequence of what set them aside.
	asideTokens map[model.Token]bool
	// unanswered counts the requests in a row that got no connection or
	// no answer at all; Dead, once set, stops the run: the server stopped
	// answering, or the harness could not heal a link it broke.
	unanswered int
	Dead       error
	// down says the server went down on its own (a crash finding, or
	// one skipped) and was not started again: closing the session then
	// starts a shared server again, and expects an own one stopped.
	down bool
	// Answered counts the prompts an ACP agent answered (a response, or an
	// error), each an evaluation of the wire finding (model.Wire).
	Answered int
	// Up counts the steps after which the server was seen up, watched or
	// back from a restart the plan drew: what a verdict on the crash
	// finding rests on.
	Up int
	// sources are the queries of the agent references the server loads.
	sources []string
	// Check is the number of the check the session runs, from 1, or 0
	// for a replay: set by the check, it names the session to a later
	// one its messages leak into (Earlier).
	Check int
	// n numbers the session among its lab's, and tag is what its user
	// messages carry on a shared server ("" on a server of its own).
	n   int
	tag string

	Plans   []plan.Plan
	History []history.Op
}

// Session starts a Session: a fresh server, or the shared one under a
// fresh namespace, with the fake model reset. Its requests in flight are
// aborted when ctx ends (nil: never). The caller closes it.
func (l *Lab) Session(ctx context.Context) (*Session, error) {
	return l.session(ctx, &atomic.Int64{})
}

// session is Session on the timeline clock: a new one for a check, the
// one of the sessions before it for a replay's later session.
func (l *Lab) session(ctx context.Context, clock *atomic.Int64) (*Session, error) {
	spent := timeSpent{}
	defer spent.since(spentStarting, time.Now())
	l.clock.Store(clock)
	l.sessions++
	if l.NotStarted != nil {
		// The server did not start since the session before (as it
		// closed, or in a replay): there is none to check.
		return nil, l.NotStarted
	}
	srv, own, ns := l.shared, false, ""
	if l.reuses() {
		if l.shared == nil {
			if err := l.startShared(l.Context, "its start"); err != nil {
				return nil, err
			}
		}
		if err := l.revive(ctx); err != nil {
			return nil, err
		}
		srv, ns = l.shared, fmt.Sprintf("%s-%d-", l.run, l.sessions)
	} else {
		s, err := l.start(ctx, "its start")
		if err != nil {
			return nil, err
		}
		srv, own = s, true
	}
	// On a shared server, every message the session sends carries its
	// namespace, and the fake model records only calls that carry it.
	l.fake.Reset(protocol.EpochTag(ns))
	_, l.restartable = srv.(targets.Restarter)
	_, l.watched = srv.(targets.ServerWatcher)
	l.Last = srv
	cl := protocol.NewClient(targets.URLs(srv), l.Profile, ns)
	cl.Attach(srv)
	if l.Profile.Agent != "" {
		cl.Loaded(l.firstRefs())
	}
	return &Session{
		lab:     l,
		Profile: l.Profile,
		Server:  srv,
		own:     own,
		fake:    l.fake,
		client:  cl,
		Exec:    &executor{srv: srv, fake: l.fake, client: cl, profile: l.Profile, clock: clock, ctx: ctx, spent: spent, aux: l.Aux, lab: l},
		Ref:     model.NewWith(l.Profile.Policies()),
		Aside:   map[model.ConversationRef]bool{},
		Skipped: map[model.Invariant]int{}, Consequences: map[model.Invariant]int{}, SameCause: map[model.Invariant]int{},
		Folded:      map[model.Invariant]model.Violation{},
		asideTokens: map[model.Token]bool{},
		sources:     []string{targets.FirstSource},
		n:           l.sessions,
		tag:         protocol.EpochTag(ns),
	}, nil
}

// Earlier returns the steps of the earlier sessions on the shared server
// whose messages ops showed (history.Op.ForeignFrom): a leak between
// checks, which a fresh server shows again only once those steps ran on
// it. They come in the order the sessions ran, each step marked with its
// session (plan.Plan.Earlier), to be run first, each session's in a
// session of its own. nil where ops show no session the server served
// since it started.
func (s *Session) Earlier(ops []history.Op) []plan.Plan {
	var met []heldSession
	for _, op := range ops {
		for _, tag := range op.ForeignFrom() {
			h, ok := s.lab.held[tag]
			if ok && !slices.ContainsFunc(met, func(m heldSession) bool { return m.n == h.n }) {
				met = append(met, h)
			}
		}
	}
	slices.SortFunc(met, func(a, b heldSession) int { return a.n - b.n })
	var out []plan.Plan
	for _, h := range met {
		for _, p := range h.plans {
			p.Earlier = plan.Origin{Check: h.check, Session: h.n}
			out = append(out, p)
		}
	}
	return out
}

// Pace is what the session's server costs, as its run measures it.
func (s *Session) Pace() *Pace { return s.lab.Pace }

// Step executes p, records its history, and checks it: the reference
// model's chain check, then linearizability of the conversations a burst
// touched, then whether the server is still up (a crash finding). It
// returns the ops p came to and the first violation, or nil. A violation
// of a skipped invariant is no violation: the conversations of the Step
// are set aside, and the run goes on with the others; a server that went
// down, once its crash is skipped, is started again and the run goes on.
func (s *Session) Step(p plan.Plan) ([]history.Op, *model.Violation) {
	began := time.Now()
	ops := s.Exec.execute(p)
	for i := range ops {
		ops[i].Earlier = p.Earlier
	}
	s.lab.Pace.stepped(p.Restart != nil, time.Since(began))
	s.Plans = append(s.Plans, p)
	s.History = append(s.History, ops...)
	for _, op := range ops {
		if op.HarnessError != "" {
			s.Dead = fmt.Errorf("step %d (%s): %s: the run stops, judging nothing by it", op.Step, op.Action, op.HarnessError)
			return ops, nil
		}
	}
	if ns := s.Exec.notStarted; ns != nil {
		// A restart the step drew did not start in any try: no server is
		// left to judge anything by. The start finding; the run stops.
		s.Dead, s.down = ns, true
		return ops, nil
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
	var v *model.Violation
	if len(turns) > 0 || restart == nil {
		for _, op := range ops {
			if op.Send.From != nil {
				// A branch starts from its base as the step found it
				// (the send as it went: protocol.Client.Resolve).
				s.Ref.Fork(*op.Send.From, op.Send.Conv)
			}
		}
		v = s.Ref.ApplyStep(turns)
		for _, op := range ops {
			if op.Restart == nil && s.Aside[op.Turn.Conv] {
				s.Ref.Touch(op.Turn.Conv)
			}
		}
		if v == nil {
			v = validate.CheckLinearizable(s.History, turns, s.lab.Profile.Eviction == targets.Forgets)
		}
	}
	if v == nil {
		v = s.wire(ops)
	} else {
		s.breachesBeside(v, ops)
	}
	down := s.wentDown(ops)
	if restart != nil && down == nil {
		// The turns ran up to the crash; the restart comes after them,
		// and the model learns of it even when a turn broke a skipped
		// invariant.
		s.restarted(p.Restart)
	}
	if down == nil {
		s.watch(ops)
	}
	if v = s.judge(v, ops, turns); v != nil {
		return ops, v
	}
	if down == nil {
		return ops, nil
	}
	if !slices.Contains(s.lab.Skip, model.Crash) {
		return ops, down
	}
	s.Skipped[model.Crash]++
	var drawn *plan.Restart
	if restart != nil {
		drawn = restart.Restart
	}
	s.recover(drawn)
	return ops, nil
}

// wire finds what an ACP or A2A agent did in the step ops that the
// protocol does not allow it (protocol.Response.Breaches): the wire finding, on the
// first such turn. Each prompt answered counts as an evaluation of it.
func (s *Session) wire(ops []history.Op) *model.Violation {
	if s.Profile.Protocol != targets.ACP && s.Profile.Protocol != targets.A2A {
		return nil
	}
	for _, op := range ops {
		if op.Restart != nil || s.Aside[op.Turn.Conv] {
			continue
		}
		if len(op.Response.Breaches) > 0 {
			return &model.Violation{Invariant: model.Wire, Conv: op.Turn.Conv, Turn: op.Turn.User,
				Reason: strings.Join(op.Response.Breaches, "; ")}
		}
		if op.Response.StopReason != "" || op.Response.Cause == protocol.CauseRPCError || op.Response.Cause == protocol.CauseA2AError {
			s.Answered++
		}
	}
	return nil
}

// breachesBeside counts what an agent did in the step ops that its
// protocol does not allow, where the step broke another invariant first
// (v): a breach a report prints under another finding is counted, as the
// wire finding's SAME CAUSE, never left as a pass (an A2A agent that runs
// a blank message again as a turn of its context, T3, and shows that turn
// in tasks/get as the task's own).
func (s *Session) breachesBeside(v *model.Violation, ops []history.Op) {
	if v.Invariant == model.Wire {
		return
	}
	w := s.wire(ops)
	if w == nil {
		return
	}
	s.SameCause[model.Wire]++
	if _, ok := s.Folded[model.Wire]; !ok {
		s.Folded[model.Wire] = *w
	}
}

// judge sorts the violation v the step ops (of turns) came to: a finding,
// returned, or one that sets its conversations aside (a consequence of
// what a finding touched, a skipped invariant, a kind of wrong state
// already found), counted, and nil returned.
func (s *Session) judge(v *model.Violation, ops []history.Op, turns []model.Turn) *model.Violation {
	switch {
	case v == nil:
		return nil
	case s.involvesAside(v, ops):
		// One root cause, one finding: what a violation already found
		// touched shows its consequences under other names.
		s.Consequences[v.Invariant]++
	case slices.Contains(s.lab.Skip, v.Invariant):
		s.Skipped[v.Invariant]++
	case v.Kind != "" && slices.Contains(s.lab.SkipKinds, v.Kind):
		s.SameCause[v.Invariant]++
		if _, ok := s.Folded[v.Invariant]; !ok {
			s.Folded[v.Invariant] = *v
		}
	default:
		return v
	}
	for _, t := range turns {
		s.setAside(t.Conv)
	}
	if v.Conv != (model.ConversationRef{}) {
		s.setAside(v.Conv)
	}
	return nil
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
// conversations, and a server that stopped answering (one whose process
// exited is a crash finding, wentDown's).
func (s *Session) watch(ops []history.Op) {
	for _, op := range ops {
		if op.Restart != nil {
			s.unanswered = 0 // it came back: wentDown judged it
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
	if s.Dead != nil || s.unanswered < deadAfter {
		return
	}
	last := ops[len(ops)-1]
	s.Dead = fmt.Errorf("the server under test stopped answering during the run: %d request(s) in a row, up to step %d, got %s; "+
		"its last answers before: %s", s.unanswered, last.Step, last.Response.Cause, s.lastAnswers(3))
}

// wentDown says whether the server went down in the step that came to
// ops without being told to (PROTOCOL.md, "A server stays up"): for a
// server whose process the harness watches, an exit. Its violation
// quotes what the server last wrote. A restart the plan drew that did
// not come back is no crash: the server did not start (Step stops at
// it, the start finding). A step after which the server was seen up,
// watched or back from a restart, counts as an evaluation of the finding
// (Up).
func (s *Session) wentDown(ops []history.Op) *model.Violation {
	step := s.Exec.steps
	drawn := slices.ContainsFunc(ops, func(op history.Op) bool { return op.Restart != nil })
	w, watched := s.Server.(targets.ServerWatcher)
	if watched {
		exited := w.Exited()
		for wait := time.Now(); exited == nil && !drawn && dying(ops) && time.Since(wait) < exitWait; {
			// A server that dropped its connections is most likely dying:
			// its exit, once seen, is the finding of this step rather
			// than the next. A later one is the next step's.
			time.Sleep(10 * time.Millisecond)
			exited = w.Exited()
		}
		if exited != nil {
			s.down = true
			return &model.Violation{Invariant: model.Crash,
				Reason: fmt.Sprintf("the server exited without being told to, by the end of step %d: %v", step, exited)}
		}
	}
	if watched || drawn {
		s.Up++
	}
	return nil
}

// dying reports whether a request of ops, none of them a restart the
// plan drew, ended as a server that dies ends one: no connection, a
// connection dropped without an answer, or a stream cut short that no
// fault the harness injected explains.
func dying(ops []history.Op) bool {
	return slices.ContainsFunc(ops, func(op history.Op) bool {
		switch op.Response.Cause {
		case protocol.CauseRefused, protocol.CauseNoAnswer, protocol.CauseAgentExited:
			return op.Net != history.NetBroken
		case protocol.CauseUnsent:
			// An ACP prompt whose session/new or load got no answer at all
			// (the agent's refusal has a status): no agent ran to send it
			// to. A session API's creation refused says nothing of that.
			return op.Response.Status == 0 && op.Request.ACP()
		case protocol.CauseNoDone, protocol.CauseNotCompleted:
			return op.Net != history.NetBroken && op.Send.Fault.Kind == faults.None && !op.Send.Abort
		}
		return false
	})
}

// End looks, once the session's last step is checked, at whether a
// watched server is still up, after a quiet period: a server that dies
// just after it answered the last step (a panic of a goroutine that
// outlives the response) is the session's crash finding, with all its
// steps. A crash skipped is counted, and the server is started again
// when the session closes.
func (s *Session) End() *model.Violation {
	w, watched := s.Server.(targets.ServerWatcher)
	if !watched || s.down || s.Dead != nil {
		return nil
	}
	time.Sleep(quietPeriod)
	exited := w.Exited()
	if exited == nil {
		return nil
	}
	s.down = true
	if slices.Contains(s.lab.Skip, model.Crash) {
		s.Skipped[model.Crash]++
		return nil
	}
	return &model.Violation{Invariant: model.Crash,
		Reason: fmt.Sprintf("the server exited without being told to, after the last step (%d) was answered: %v", s.Exec.steps, exited)}
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
// through, and came back from.
func (s *Session) restarted(r *plan.Restart) {
	changed := r.Sources != nil && !slices.Equal(r.Sources, s.sources)
	if r.Sources != nil {
		s.sources = r.Sources
	}
	s.Ref.Restart(changed, len(s.sources) > 1)
}

// recover starts the server again after it went down on its own, its
// crash skipped, so that the check goes on: with the agent sources of
// the restart drawn, if one that did not come back was drawn. A server
// that declares it survives a crash is then followed through it as
// through a crash the harness drew (T7 judges what it still holds); for
// any other, what it holds is unknowable, and every conversation so far
// is set aside. A server that does not come back stops the run.
func (s *Session) recover(drawn *plan.Restart) {
	r := plan.Restart{Crash: true}
	if drawn != nil && drawn.Replica == nil {
		r.Sources = drawn.Sources
	}
	op := s.Exec.restart(plan.Plan{Action: recoverAction, Restart: &r}, s.Exec.steps, 0)
	if ctx := s.Exec.ctx; op.Response.Outcome != model.OK && ctx != nil && ctx.Err() != nil {
		// The run's end cut the start short (the executor says so,
		// cutRestart): no finding, and no error.
		return
	}
	if ns := s.Exec.notStarted; ns != nil {
		s.Dead = ns
		return
	}
	if op.Response.Outcome != model.OK {
		s.Dead = fmt.Errorf("the server under test went down, and did not come back when the harness started it again "+
			"(its crash is a finding already, or skipped): %s", cmp.Or(op.HarnessError, op.Response.Detail))
		return
	}
	s.down = false
	if s.Profile.Durability.Crash {
		s.restarted(&r)
		return
	}
	for _, op := range s.History {
		if op.Restart == nil {
			s.setAside(op.Send.Conv)
		}
	}
}

// recoverAction is the action of the start again of a server that went
// down on its own (Session.recover), as its history names it.
const recoverAction = "start again"

// Close stops the session's server, if it started it, and checks that a
// shared server is still alive. A server that does not stop cleanly, or
// died on its own, is a defect.
func (s *Session) Close() error {
	s.client.Close()
	if !s.own && s.tag != "" && len(s.Plans) > 0 && s.lab.held != nil {
		s.lab.held[s.tag] = heldSession{n: s.n, check: s.Check, plans: s.Plans}
	}
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
		if s.Exec.cutRestart || s.down || !slices.Equal(s.sources, []string{targets.FirstSource}) {
			r, ok := s.Server.(targets.Restarter)
			if ok {
				s.lab.down = s.down
				what := "its restart after a check, for the next to start as every check does"
				if s.down {
					what = "its start again after it went down in a check (a crash found, or skipped)"
				}
				err := s.lab.restart(nil, r, s.down, s.lab.firstRefs(), what)
				var ns *NotStarted
				switch {
				case err == nil:
					s.lab.down = false
				case errors.As(err, &ns):
					// Said by the check that closes, and by every later
					// start of the lab's.
					s.lab.down = true
					return err
				case !s.down:
					return fmt.Errorf("restart the server under test with its first agent source: %w", err)
				}
				// A server that went down and does not come back yet is
				// started again by the next session, or stops the run
				// there.
			}
		}
		return nil // a shared server's death is found when the next session starts
	}
	if err := s.Server.Close(); err != nil && !s.down {
		// A server that went down on its own is a finding, or skipped:
		// that it was down when stopped says nothing more.
		return fmt.Errorf("stop the server under test: %w", err)
	}
	return nil
}

// Replay executes plans in a new session of l, stopped when ctx ends: the
// requests in flight are aborted, and the run decides nothing. Steps of
// earlier checks (plan.Plan.Earlier) run first, each check's in a
// session of its own, as they ran in the run: on the one server the
// lab's sessions share (where each session starts a server of its own,
// so does each of these, and no leak between checks comes back); the
// history numbers the steps through, on one timeline.
//
// On a server the lab's sessions share, where a fresh one can stand in
// (FreshServers), a replay that broke an invariant with messages of a
// session it did not run (one of an earlier check, or of another
// replay, left on the server) showed what the server held, not what its
// plans do: it is run again on a fresh server, and so is every later
// replay of the lab.
func (l *Lab) Replay(ctx context.Context, plans []plan.Plan) ([]history.Op, *model.Violation, error) {
	if l.leaks && l.FreshServers() {
		return l.FreshReplay(ctx, plans)
	}
	h, v, tags, err := l.replay(ctx, plans)
	if v == nil || err != nil || ctx.Err() != nil || !l.FreshServers() || !leftBehind(h, tags) {
		return h, v, err
	}
	l.leaks = true
	return l.FreshReplay(ctx, plans)
}

// replay is Replay on whatever server the lab's sessions have, and the
// tags of the sessions it ran.
func (l *Lab) replay(ctx context.Context, plans []plan.Plan) (ops []history.Op, v *model.Violation, tags []string, err error) {
	clock := &atomic.Int64{}
	steps := 0
	for _, session := range plan.Sessions(plans) {
		s, err := l.session(ctx, clock)
		if err != nil {
			return ops, nil, tags, err
		}
		tags = append(tags, s.tag)
		s.Exec.steps = steps // numbered through the sessions
		for _, p := range session {
			if ctx.Err() != nil {
				break
			}
			if _, v = s.Step(p); v != nil {
				break
			}
			if s.Dead != nil {
				cerr := s.Close()
				if errors.Is(cerr, s.Dead) {
					cerr = nil // a server that did not start says so as it closes too
				}
				return append(ops, s.History...), nil, tags, errors.Join(s.Dead, cerr)
			}
		}
		if v == nil && ctx.Err() == nil {
			v = s.End()
		}
		ops = append(ops, s.History...)
		if err := s.Close(); err != nil || v != nil || ctx.Err() != nil {
			return ops, v, tags, err
		}
		steps += len(session)
	}
	return ops, v, tags, nil
}

// leftBehind reports whether the last step of a replay's history showed
// messages of a session other than the replay's own (tags): what another
// session left on the server.
func leftBehind(ops []history.Op, tags []string) bool {
	if len(ops) == 0 {
		return false
	}
	last := ops[len(ops)-1].Step
	for _, op := range ops {
		if op.Step != last {
			continue
		}
		for _, t := range op.ForeignFrom() {
			if !slices.Contains(tags, t) {
				return true
			}
		}
	}
	return false
}

// All are l and its helpers: every lab whose servers a run used.
func (l *Lab) All() []*Lab { return append([]*Lab{l}, l.Helpers...) }

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
		h.Skip, h.SkipKinds, h.Context, h.Aux, h.Pace = l.Skip, l.SkipKinds, l.Context, l.Aux, l.Pace
		out = append(out, h)
	}
	return out, nil
}
