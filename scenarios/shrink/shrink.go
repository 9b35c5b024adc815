// Package shrink minimises a failing run to a short sequence of steps that
// still breaks the same invariant, replaying candidates in labs within a
// hard wall-clock bound.
package shrink

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// Shrinker minimises a failing run's plans directly, as delta debugging
// does: first whole steps go (ddmin over the plans), then each step is made
// simpler (fewer requests in a burst, no fault, no stream, fewer
// conversations). Every candidate is replayed in a session of its own, and
// kept if it breaks the same invariant; with several labs, as many
// candidates as there are labs are replayed at once, and the first of
// them in the order tried alone is kept, so the result is the one one lab
// gives. rapid stays the search; this is the Shrinker, bounded by a hard
// wall-clock budget.
type Shrinker struct {
	labs []*execute.Lab
	want model.Invariant
	ctx  context.Context
	// Runs counts the candidates replayed; after is called after each,
	// with the steps of the smallest failing run so far.
	Runs  int
	after func(steps int)
	// from is how many steps the failing run had.
	from int
	// Cut says the bound ran out before the shrinker was done, and kept
	// counts the smaller candidates it kept before then.
	Cut  bool
	Kept int
	// Plans, history and violation are the smallest failing run so far.
	Plans     []plan.Plan
	History   []history.Op
	Violation *model.Violation
	// misses are the histories of the replays of the original steps that
	// did not break the invariant: what differed, for a flaky failure.
	misses [][]history.Op
	// replayOn replays plans in a lab: (*execute.Lab).Replay, but for
	// tests of the shrinker itself.
	replayOn func(l *execute.Lab, ctx context.Context, plans []plan.Plan) ([]history.Op, *model.Violation, error)
	// found are the failing runs kept so far, the smallest last: a
	// candidate that broke the invariant once, on a server that runs a
	// burst another way on another replay, may not again (confirm).
	found []foundRun
}

// foundRun is a failing run the shrinker kept.
type foundRun struct {
	plans     []plan.Plan
	history   []history.Op
	violation *model.Violation
}

// Run returns the smallest run it finds, within ctx, that breaks v's
// invariant as plans did, replaying candidates in labs. ok is false if
// plans, replayed, did not break it at all: the failure did not reproduce.
func Run(ctx context.Context, labs []*execute.Lab, plans []plan.Plan, v *model.Violation, after func(steps int)) (s *Shrinker, ok bool) {
	s = &Shrinker{labs: labs, want: v.Invariant, ctx: ctx, after: after, from: len(plans), Plans: plans, Violation: v,
		replayOn: (*execute.Lab).Replay}
	return s, s.run(plans)
}

// run shrinks plans, and reports whether they broke the invariant again.
func (s *Shrinker) run(plans []plan.Plan) bool {
	// The steps that touch the failing conversation, alone, are tried
	// first: when they break the invariant, the failure reproduces, and
	// the replay of the whole run, often the costliest of all (its
	// restarts on a server slow to start), is spared.
	if !s.slice() && !s.reproduce(plans) {
		return false
	}
	s.ddmin()
	for changed := true; changed && !s.done(); {
		changed = s.simplify()
		if changed {
			s.ddmin()
		}
	}
	s.confirm()
	// A candidate the bound cut short decided nothing: the shrinker may
	// have stopped short of where it would have ended.
	s.Cut = s.done()
	return true
}

func (s *Shrinker) done() bool { return s.ctx.Err() != nil }

// reproduce replays plans until they break the invariant again, and
// reports whether they did. A server that does not report its activity
// may run a burst in another interleaving on a replay: a failure is
// taken not to reproduce only after several tries.
func (s *Shrinker) reproduce(plans []plan.Plan) bool {
	r, ok := s.breaksAgain(plans, func(miss replayed) { s.misses = append(s.misses, miss.history) })
	if ok {
		// The run itself, not a smaller one: nothing kept yet.
		s.record(plans, r)
	}
	return ok
}

// breaksAgain replays plans up to ReproduceTries times, the first alone
// (it mostly breaks the invariant), then as many at once as there are
// labs, and returns the first replay that breaks the invariant; missed
// hears of each one that came to an end without breaking it.
func (s *Shrinker) breaksAgain(plans []plan.Plan, missed func(replayed)) (replayed, bool) {
	for tries := 0; tries < ReproduceTries && !s.done(); {
		n := 1
		if tries > 0 {
			n = min(len(s.labs), ReproduceTries-tries)
		}
		for _, r := range s.replay(slices.Repeat([][]plan.Plan{plans}, n)) {
			if r.err == nil && r.v != nil && r.v.Invariant == s.want && !s.done() {
				return r, true
			}
			if r.err == nil && !s.done() && missed != nil {
				missed(r)
			}
		}
		tries += n
	}
	return replayed{}, false
}

// ReproduceTries is how many replays of a failing run's steps must all
// pass before the failure is called flaky.
const ReproduceTries = 3

// replayed is what one replay of a candidate came to.
type replayed struct {
	history []history.Op
	v       *model.Violation
	err     error
}

// replay replays the candidates, at most one per lab, at once.
func (s *Shrinker) replay(cands [][]plan.Plan) []replayed {
	out := make([]replayed, len(cands))
	var wg sync.WaitGroup
	for i, plans := range cands {
		wg.Go(func() {
			h, v, err := s.replayOn(s.labs[i], s.ctx, plans)
			out[i] = replayed{history: h, v: v, err: err}
		})
	}
	wg.Wait()
	for range cands {
		s.Runs++
		if s.after != nil {
			s.after(cmp.Or(len(s.Plans), s.from))
		}
	}
	return out
}

// keep keeps plans, cut after the step that broke the invariant, if r
// says they broke it.
func (s *Shrinker) keep(plans []plan.Plan, r replayed) bool {
	if r.err != nil || r.v == nil || r.v.Invariant != s.want || s.done() {
		return false
	}
	s.Kept++
	s.record(plans, r)
	return true
}

// record makes plans, cut after the step that broke the invariant in r,
// the smallest failing run so far.
func (s *Shrinker) record(plans []plan.Plan, r replayed) {
	s.Plans = slices.Clone(plans[:r.history[len(r.history)-1].Step])
	s.History, s.Violation = r.history, r.v
	s.found = append(s.found, foundRun{s.Plans, s.History, s.Violation})
}

// confirm makes sure the smallest failing run kept breaks the invariant
// again, in one of ReproduceTries replays, before it is reported: one
// that broke it once by the luck of an interleaving would be saved as a
// failure that does not replay. One that does not is dropped for the
// next smallest, down to the first run kept, which reproduced already.
// On a server that behaves the same way under the same steps, it costs
// one replay.
func (s *Shrinker) confirm() {
	for len(s.found) > 1 && !s.done() {
		if _, ok := s.breaksAgain(s.found[len(s.found)-1].plans, nil); ok {
			return
		}
		if s.done() {
			return // cut short: the bound says so (partly shrunk)
		}
		s.found = s.found[:len(s.found)-1]
		next := s.found[len(s.found)-1]
		s.Plans, s.History, s.Violation = next.plans, next.history, next.violation
	}
}

// try replays plans and keeps them if they break the invariant.
func (s *Shrinker) try(plans []plan.Plan) bool { return s.tryFirst([][]plan.Plan{plans}) }

// tryFirst replays the candidates, as many at once as there are labs, and
// keeps the first, in order, that breaks the invariant.
func (s *Shrinker) tryFirst(cands [][]plan.Plan) bool {
	cands = slices.DeleteFunc(slices.Clone(cands), func(c []plan.Plan) bool { return len(c) == 0 })
	for len(cands) > 0 && !s.done() {
		batch := cands[:min(len(s.labs), len(cands))]
		cands = cands[len(batch):]
		for i, r := range s.replay(batch) {
			if s.keep(batch[i], r) {
				return true
			}
		}
	}
	return false
}

// slice tries the steps that touch the violation's conversation alone,
// first without a restart, then with every restart they may depend on,
// and reports whether one broke the invariant: most failures need
// nothing else, and on a server that is slow to start the one or two
// replays save many of ddmin's, each restart most of all.
func (s *Shrinker) slice() bool {
	conv := s.Violation.Conv
	if conv == (model.ConversationRef{}) {
		return false
	}
	var alone, restarted []plan.Plan
	for _, p := range s.Plans {
		touches := slices.ContainsFunc(p.Sends, func(x plan.Send) bool { return x.Conv == conv })
		if touches && p.Restart == nil {
			alone = append(alone, p)
		}
		if touches || p.Restart != nil {
			restarted = append(restarted, p)
		}
	}
	var cands [][]plan.Plan
	if len(alone) < len(restarted) {
		cands = append(cands, alone)
	}
	if len(restarted) < len(s.Plans) {
		cands = append(cands, restarted)
	}
	return s.tryFirst(cands)
}

// ddmin removes as many whole steps as it can: chunks of the plans, halved
// until single steps, as Zeller's delta debugging does with complements.
func (s *Shrinker) ddmin() {
	n := 2
	for len(s.Plans) >= 2 && !s.done() {
		n = min(n, len(s.Plans))
		cands := make([][]plan.Plan, n)
		for i := range n {
			lo, hi := i*len(s.Plans)/n, (i+1)*len(s.Plans)/n
			cands[i] = slices.Concat(s.Plans[:lo], s.Plans[hi:])
		}
		switch {
		case s.tryFirst(cands):
			n = max(n-1, 2)
		case n == len(s.Plans):
			return
		default:
			n = min(2*n, len(s.Plans))
		}
	}
}

// simplify tries to make each step simpler, latest first, and reports
// whether any candidate was kept.
func (s *Shrinker) simplify() bool {
	changed := false
	for i := len(s.Plans) - 1; i >= 0 && !s.done(); i-- {
		if i >= len(s.Plans) {
			continue // a kept candidate ended earlier
		}
		var cands [][]plan.Plan
		branches := s.labs[0].Profile.Protocol == targets.Responses
		for _, p := range simpler(s.Plans[i], s.Plans, branches) {
			cands = append(cands, slices.Concat(s.Plans[:i], []plan.Plan{p}, s.Plans[i+1:]))
		}
		if s.tryFirst(cands) {
			changed = true
		}
	}
	return changed
}

// simpler lists simpler versions of p, most drastic first: the burst
// without one of its requests, then one request without its fault, with
// its abort at its first call, without its network fault, with fewer or plainer tool calls, without
// its stream, or sent to the first replica, then the burst's requests on
// fewer conversations,
// where that keeps a branch (branches: under the Responses API) a branch.
func simpler(p plan.Plan, all []plan.Plan, branches bool) []plan.Plan {
	var out []plan.Plan
	if p.Restart != nil && len(p.Sends) > 0 {
		// A crash with a turn in flight: the crash alone, or the turn alone.
		out = append(out, plan.Plan{Action: "crash", Restart: p.Restart},
			plan.Plan{Action: "continue", Sends: slices.Clone(p.Sends), Release: slices.Clone(p.Release)})
	}
	if len(p.Sends) > 1 {
		for k := range p.Sends {
			out = append(out, withoutSend(p, k))
		}
	}
	for k, send := range p.Sends {
		if send.Abort || send.Fault.Kind != faults.None {
			q := clonePlan(p)
			q.Sends[k].Abort, q.Sends[k].AbortAt, q.Sends[k].Fault = false, nil, faults.Fault{}
			out = append(out, q)
		}
		if send.AbortAt != nil {
			q := clonePlan(p)
			q.Sends[k].AbortAt = nil
			out = append(out, q)
		}
		if send.Net != nil {
			q := clonePlan(p)
			q.Sends[k].Net = nil
			out = append(out, q)
		}
		for _, s := range simplerTools(send) {
			q := clonePlan(p)
			q.Sends[k] = s
			out = append(out, q)
		}
	}
	for k, send := range p.Sends {
		if send.Stream {
			q := clonePlan(p)
			q.Sends[k].Stream = false
			out = append(out, q)
		}
		if send.Replica != 0 && (p.Restart == nil || p.Restart.Replica == nil) {
			q := clonePlan(p)
			q.Sends[k].Replica = 0
			out = append(out, q)
		}
	}
	if first := firstConv(all); len(p.Sends) > 1 {
		// Where turns sent at once on one conversation branch (the
		// Responses API), a send joins the first conversation only if no
		// other of the step is on it, and a branch stays one.
		onFirst := slices.ContainsFunc(p.Sends, func(s plan.Send) bool { return s.Conv == first })
		for k, send := range p.Sends {
			if branches && (onFirst || send.From != nil) {
				continue
			}
			if send.Conv != first && send.Token != "" {
				q := clonePlan(p)
				q.Sends[k].Conv = first
				out = append(out, q)
			}
		}
	}
	return out
}

// withoutSend is p without its k-th request; the release order keeps the
// others' order.
func withoutSend(p plan.Plan, k int) plan.Plan {
	q := plan.Plan{Action: p.Action, Sends: slices.Delete(slices.Clone(p.Sends), k, k+1), Restart: p.Restart}
	if p.Action == plan.BurstAction(len(p.Sends)) {
		q.Action = plan.BurstAction(len(q.Sends))
	}
	for _, i := range p.Release {
		switch {
		case i < k:
			q.Release = append(q.Release, i)
		case i > k:
			q.Release = append(q.Release, i-1)
		}
	}
	return q
}

// simplerTools lists the send with fewer or plainer tool calls: without
// its last round, without one call of a round, with a lookup made an
// echo; each only where its fault and abort point still fit.
func simplerTools(s plan.Send) []plan.Send {
	var out []plan.Send
	add := func(rounds []faults.Round) {
		c := s
		c.Rounds = rounds
		if c.CheckTools() == nil {
			out = append(out, c)
		}
	}
	if n := len(s.Rounds); n > 0 {
		add(cloneRounds(s.Rounds[:n-1]))
	}
	for r, round := range s.Rounds {
		for i, name := range round {
			if len(round) > 1 {
				rounds := cloneRounds(s.Rounds)
				rounds[r] = slices.Delete(rounds[r], i, i+1)
				add(rounds)
			}
			if name == faults.ToolLookup {
				rounds := cloneRounds(s.Rounds)
				rounds[r][i] = faults.ToolEcho
				add(rounds)
			}
		}
	}
	return out
}

func cloneRounds(rounds []faults.Round) []faults.Round {
	out := make([]faults.Round, len(rounds))
	for i, r := range rounds {
		out[i] = slices.Clone(r)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func clonePlan(p plan.Plan) plan.Plan {
	return plan.Plan{Action: p.Action, Sends: slices.Clone(p.Sends), Release: slices.Clone(p.Release), Restart: p.Restart}
}

// firstConv is the conversation the run's first request was sent on.
func firstConv(plans []plan.Plan) model.ConversationRef {
	for _, p := range plans {
		for _, s := range p.Sends {
			return s.Conv
		}
	}
	return model.ConversationRef{}
}

// Budget is the context a shrink runs in: ShrinkTime from now, or
// until the run's own context ends.
func Budget(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	return context.WithTimeout(parent, d)
}

// Differed says, for a failure that did not reproduce, where each replay
// of its steps first went another way than the failing run: a person
// reads there what the server does not do the same way twice.
func (s *Shrinker) Differed(failing []history.Op) string {
	var b strings.Builder
	for i, h := range s.misses {
		fmt.Fprintf(&b, "\nReplay %d %s.", i+1, firstDifference(failing, h))
	}
	return b.String()
}

// firstDifference describes the first request of the failing run whose
// replay came to something else: another outcome or status, another
// number of model calls, or another order of the requests of a burst.
func firstDifference(failing, replay []history.Op) string {
	byPlace := map[[2]int]history.Op{}
	for _, op := range replay {
		byPlace[[2]int{op.Step, op.Index}] = op
	}
	for _, a := range failing {
		b, ok := byPlace[[2]int{a.Step, a.Index}]
		where := fmt.Sprintf("at step %d", a.Step)
		if a.Restart == nil {
			what := string(a.Send.Token)
			if what == "" {
				what = "no new user message"
			}
			where = fmt.Sprintf("at step %d, request %d (%s, %s)", a.Step, a.Index+1, a.Send.Conv.ID, what)
		}
		switch {
		case !ok:
			return fmt.Sprintf("ended before step %d", a.Step)
		case a.Response.Outcome != b.Response.Outcome || a.Response.Status != b.Response.Status:
			return fmt.Sprintf("differed %s: the failing run got %s, the replay %s", where, answer(a), answer(b))
		case len(a.Turn.Calls) != len(b.Turn.Calls):
			return fmt.Sprintf("differed %s: the request reached the model %d time(s) in the failing run, %d in the replay",
				where, len(a.Turn.Calls), len(b.Turn.Calls))
		}
	}
	for step := range stepsOf(failing) {
		if x, y := returnOrder(failing, step), returnOrder(replay, step); !slices.Equal(x, y) {
			return fmt.Sprintf("differed at step %d: its requests were answered in the order %v in the failing run, %v in the replay",
				step, x, y)
		}
	}
	return "came to the same outcomes and order; it differed in what the model was asked"
}

// answer is an op's outcome in a few words.
func answer(op history.Op) string {
	r := op.Response
	a := r.Outcome.String()
	if r.Status != 0 {
		a += fmt.Sprintf(" %d", r.Status)
	}
	if r.Cause != "" && !strings.HasPrefix(r.Cause, "status ") {
		a += " (" + r.Cause + ")"
	}
	return a
}

// stepsOf yields the steps of ops with more than one request, in order.
func stepsOf(ops []history.Op) func(func(int) bool) {
	return func(yield func(int) bool) {
		count := map[int]int{}
		var order []int
		for _, op := range ops {
			if count[op.Step] == 0 {
				order = append(order, op.Step)
			}
			count[op.Step]++
		}
		for _, st := range order {
			if count[st] > 1 && !yield(st) {
				return
			}
		}
	}
}

// returnOrder is the requests of step, numbered from 1, in the order their
// outcomes were learned.
func returnOrder(ops []history.Op, step int) []int {
	var in []history.Op
	for _, op := range ops {
		if op.Step == step && op.Restart == nil {
			in = append(in, op)
		}
	}
	slices.SortStableFunc(in, func(a, b history.Op) int { return cmp.Compare(a.Turn.Return, b.Turn.Return) })
	out := make([]int, len(in))
	for i, op := range in {
		out[i] = op.Index + 1
	}
	return out
}
