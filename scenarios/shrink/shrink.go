// Package shrink minimises a failing run to a short sequence of steps that
// still breaks the same invariant, replaying candidates in labs within a
// wall-clock bound: no replay starts after it, the one in flight is cut,
// and stopping that replay's server may take its stop grace more.
package shrink

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/openai"
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
// kept if it breaks the same invariant on one of its tries: a candidate
// is rejected only after as many tries as the failing run needed to break
// it again, and at least two where a step sends requests at once to a
// server that does not report its activity (it may interleave them
// another way on each replay). The candidates are tried in rounds, one
// try each a round; with several labs, as many replays as there are labs
// run at once, and the first candidate, in order, that broke the
// invariant in the round is kept, so the result is the one one lab gives.
// rapid stays the search; this is the Shrinker, bounded by a hard
// wall-clock budget, whose end makes the result partly shrunk, never
// another verdict.
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
	// Dropped counts the smaller runs kept that did not break the
	// invariant again when confirmed, and were not reported (confirm).
	Dropped int
	// Plans, history and violation are the smallest failing run so far.
	Plans     []plan.Plan
	History   []history.Op
	Violation *model.Violation
	// misses are the histories of the replays of the original steps that
	// did not break the invariant: what differed, for a flaky failure.
	misses [][]history.Op
	// replayErr is the first error of a replay that could not be carried
	// out (the server did not start, say).
	replayErr error
	// replayOn replays plans in a lab: (*execute.Lab).Replay, but for
	// tests of the shrinker itself; freshOn replays them on a server
	// started for the replay ((*execute.Lab).FreshReplay).
	replayOn, freshOn func(l *execute.Lab, ctx context.Context, plans []plan.Plan) ([]history.Op, *model.Violation, error)
	// found are the failing runs kept so far, the smallest last: a
	// candidate that broke the invariant once, on a server that runs a
	// burst another way on another replay, may not again (confirm).
	found []foundRun
	// need is how many tries the failing run took to break the invariant
	// again: a candidate is not rejected after fewer.
	need int
	// reports says the labs' servers say when a burst is at rest
	// (targets.KnowsRest): it then comes to rest, replay
	// after replay, in the interleaving its plan draws.
	reports bool
	// fresh says the run shared one server across its checks: what is
	// reported is confirmed on a fresh one, as a replay of the saved
	// failure runs it.
	fresh bool
	// cands are the candidates tried, by their plans as JSON.
	cands map[string]*candidate
	// confirmed says the reported run broke the invariant again when
	// confirmed (on a fresh server if fresh); unconfirmed says that even
	// the first run kept did not, on a fresh server; unreplayed that the
	// replays to confirm it failed to run.
	confirmed, unconfirmed, unreplayed bool
	// took is how long the failing run ran, and reproduceBy when the
	// share of the bound a failure has to reproduce in (reproduceIn,
	// ReproduceShare) ends: before the failure broke its invariant again, no
	// replay starts that would not end by then at the failing run's pace.
	// gaveUp says the shrinker stopped so, after the replays it had made.
	// now is the clock (time.Now, but for tests of the shrinker itself).
	took        time.Duration
	reproduceIn time.Duration
	reproduceBy time.Time
	gaveUp      bool
	now         func() time.Time
	// slicing says the first slice is being tried, before the failing
	// run's own steps were replayed: a slice starts only if a replay of
	// those still ends by reproduceBy after it; sliced says one did not.
	slicing, sliced bool
	// replayShown says the failing run showed a T3 violation as a replay:
	// the request without a usable message came after a committed turn
	// of its conversation. A smaller candidate is kept only if it shows
	// it too: one invalid request on a new conversation breaks T3 as
	// well, but no longer shows what was replayed, nor from where.
	replayShown bool
}

// foundRun is a failing run the shrinker kept; smaller says it is one of
// the smaller candidates, not the failing run's own steps replayed.
type foundRun struct {
	plans     []plan.Plan
	history   []history.Op
	violation *model.Violation
	smaller   bool
}

// candidate is how a candidate fared: how many times it was replayed,
// how many of those replays failed to run (no verdict), whether it was
// kept, or left without being kept (tryFirst); burst says one of its
// steps sends requests at once.
type candidate struct {
	tries, errs       int
	kept, left, burst bool
}

// Run returns the smallest run it finds, within ctx, that breaks v's
// invariant as plans did, replaying candidates in labs; took is how long
// plans ran when they failed. ok is false if plans, replayed, did not
// break it at all: the failure did not reproduce, or the shrinker gave
// up before it did (GaveUp).
func Run(ctx context.Context, labs []*execute.Lab, plans []plan.Plan, v *model.Violation, took time.Duration, after func(steps int)) (s *Shrinker, ok bool) {
	s = newRun(ctx, labs, plans, v, took, after)
	return s, s.run(plans)
}

// newRun is Run's shrinker, before it runs.
func newRun(ctx context.Context, labs []*execute.Lab, plans []plan.Plan, v *model.Violation, took time.Duration, after func(steps int)) *Shrinker {
	// A failing check on a server earlier checks shared is replayed with
	// their steps first (plan.Plan.Earlier): at its own pace, they take
	// longer than it did.
	own := len(plans) - countEarlier(plans)
	if own > 0 {
		took = took * time.Duration(len(plans)) / time.Duration(own)
	}
	s := &Shrinker{labs: labs, want: v.Invariant, ctx: ctx, after: after, from: len(plans), Plans: plans, Violation: v,
		replayOn: (*execute.Lab).Replay, freshOn: (*execute.Lab).FreshReplay,
		reports: reportsActivity(labs), fresh: labs[0].FreshServers(), took: took, now: time.Now}
	if bound, ok := ctx.Value(boundKey{}).(time.Duration); ok {
		s.reproduceWithin(bound)
	}
	return s
}

// countEarlier is how many of plans are earlier checks' steps.
func countEarlier(plans []plan.Plan) int {
	n := 0
	for _, p := range plans {
		if p.Earlier != (plan.Origin{}) {
			n++
		}
	}
	return n
}

// reproduceWithin gives the failure its share of bound, from now, to
// break its invariant again in.
func (s *Shrinker) reproduceWithin(bound time.Duration) {
	s.reproduceIn = time.Duration(float64(bound) * ReproduceShare)
	s.reproduceBy = s.now().Add(s.reproduceIn)
}

// ReproduceShare is the share of a shrink's bound a failure has to break
// its invariant again in. On a server whose replays take minutes, the
// tries that show a failure does not reproduce would fill the bound, and
// the time they take is the run's next checks': the shrinker gives up
// before a replay that would end past it, and says so (GaveUp). Once the
// failure reproduced, the rest of the bound is the search's.
const ReproduceShare = 0.5

// GaveUp says the shrinker stopped before the failure broke its
// invariant again, as no replay at the failing run's pace would have
// ended within the share of the bound it had for that (ReproduceShare).
func (s *Shrinker) GaveUp() bool { return s.gaveUp }

// reportsActivity reports whether the servers the labs' last sessions
// used report their activity: all of a target's servers do, or none.
// Read before any replay, which changes them.
func reportsActivity(labs []*execute.Lab) bool {
	return slices.ContainsFunc(labs, func(l *execute.Lab) bool { return targets.KnowsRest(l.Last) })
}

// run shrinks plans, and reports whether they broke the invariant again.
func (s *Shrinker) run(plans []plan.Plan) bool {
	if s.need == 0 {
		s.need = 1
	}
	// The steps that touch the failing conversation, alone, are tried
	// first: when they break the invariant, the failure reproduces, and
	// the replay of the whole run, often the costliest of all (its
	// restarts on a server slow to start), is spared.
	s.slicing = true
	kept := s.slice()
	s.slicing, s.sliced = false, false
	if !kept {
		if !s.reproduce(plans) {
			// Given up, the shrinker stopped before the bound did.
			s.Cut = !s.gaveUp && s.ctx.Err() != nil
			return false
		}
		// The failure may have needed more tries than the slice gave its
		// candidates: they get the rest (those already tried enough are
		// not replayed again).
		s.slice()
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
	s.Cut = s.ctx.Err() != nil
	return true
}

// done says the shrink, or its first slice, is to stop: its bound ran
// out, its run was stopped, or it gave up before the failure reproduced.
func (s *Shrinker) done() bool { return s.gaveUp || s.sliced || s.ctx.Err() != nil }

// givesUp reports whether no replay is to start, as the failure has not
// broken its invariant again and a replay at the failing run's pace would
// end past the share of the bound it had for that; it then gives up. A
// slice, tried first, must leave time for one replay of the failing
// run's own steps after it: where it would not, the slice stops instead.
func (s *Shrinker) givesUp() bool {
	if len(s.found) > 0 || s.reproduceBy.IsZero() {
		return s.gaveUp
	}
	end := s.now().Add(s.took)
	switch {
	case s.slicing && end.Add(s.took).After(s.reproduceBy):
		s.sliced = true
	case end.After(s.reproduceBy):
		s.gaveUp = true
	}
	return s.gaveUp || s.sliced
}

// reproduce replays plans until they break the invariant again, and
// reports whether they did. A server that does not report its activity
// may run a burst in another interleaving on a replay: a failure is
// taken not to reproduce only after several tries, and the tries it took
// are those every smaller candidate gets.
func (s *Shrinker) reproduce(plans []plan.Plan) bool {
	r, tries, ok := s.breaksAgain(plans, s.replayOn, func(miss replayed) { s.misses = append(s.misses, miss.history) })
	if ok {
		// The run itself, not a smaller one: nothing kept yet.
		s.replayShown = s.want == model.T3 && showsReplay(r.history, r.v)
		s.need = max(s.need, tries)
		s.record(plans, r, false)
	}
	return ok
}

// breaksAgain replays plans with replayOn up to ReproduceTries times, the
// first alone (it mostly breaks the invariant), then as many at once as
// there are labs, and returns the first replay that breaks the invariant
// and which try that was, from 1; missed hears of each one that came to
// an end without breaking it.
func (s *Shrinker) breaksAgain(plans []plan.Plan, replayOn replayFunc, missed func(replayed)) (replayed, int, bool) {
	for tries := 0; tries < ReproduceTries && !s.done(); {
		n := 1
		if tries > 0 {
			n = min(len(s.labs), ReproduceTries-tries)
		}
		for i, r := range s.replay(slices.Repeat([][]plan.Plan{plans}, n), replayOn) {
			if s.breaks(r) && !s.done() {
				return r, tries + i + 1, true
			}
			if r.err == nil && !s.done() && missed != nil {
				missed(r)
			}
		}
		tries += n
	}
	return replayed{}, 0, false
}

// ReproduceTries is how many replays of a failing run's steps must all
// pass before the failure is called flaky, and how many a replay of a
// saved failure gives it by default.
const ReproduceTries = 3

// replayFunc replays plans in a lab (replayOn, freshOn).
type replayFunc = func(l *execute.Lab, ctx context.Context, plans []plan.Plan) ([]history.Op, *model.Violation, error)

// replayed is what one replay of a candidate came to.
type replayed struct {
	history []history.Op
	v       *model.Violation
	err     error
}

// breaks reports whether r broke the invariant sought.
//
// A committed turn lost after a restart (T7) that a candidate shows lost
// with no restart (T2, the same kind) breaks it too, and from then on the
// loss is T2's: one loss gets the name its simplest failing run shows,
// whichever the seed met first (PROTOCOL.md, "One root cause, one
// finding").
func (s *Shrinker) breaks(r replayed) bool {
	if r.err != nil || r.v == nil {
		return false
	}
	if r.v.Invariant != s.want && !lostWithoutRestart(s.Violation, r.v) {
		return false
	}
	return !s.replayShown || showsReplay(r.history, r.v)
}

// lostWithoutRestart reports whether v is a loss seen without a restart
// where sought is the same kind of loss seen after one (T7's other
// findings, a resume refused, a replay unlike the history, are not).
func lostWithoutRestart(sought, v *model.Violation) bool {
	return sought != nil && sought.Invariant == model.T7 && sought.Kind == model.Lost &&
		v.Invariant == model.T2 && v.Kind == model.Lost
}

// showsReplay reports whether the violating request of a history (its
// last step's) came after a turn of its conversation that was committed:
// what a request without a usable message may replay is then shown.
func showsReplay(ops []history.Op, v *model.Violation) bool {
	if len(ops) == 0 {
		return false
	}
	last := ops[len(ops)-1]
	for _, op := range ops {
		// An earlier check's conversation of the same name is another.
		if op.Step < last.Step && op.Earlier == last.Earlier && op.Send.Conv == v.Conv && op.Send.Token != "" && op.Response.Outcome == model.OK {
			return true
		}
	}
	return false
}

// withoutUntidyStop is err without a replay's server stopped untidily (an
// exit status on SIGTERM, or killed past its grace): that says nothing of
// the steps, which ran and were judged. Any other error of err stays.
func withoutUntidyStop(err error) error {
	switch e := err.(type) {
	case nil, *faults.StopError:
		return nil
	case interface{ Unwrap() []error }:
		var rest []error
		for _, x := range e.Unwrap() {
			if x = withoutUntidyStop(x); x != nil {
				rest = append(rest, x)
			}
		}
		return errors.Join(rest...)
	case interface{ Unwrap() error }:
		if withoutUntidyStop(e.Unwrap()) == nil {
			return nil
		}
	}
	return err
}

// replay replays the candidates, at most one per lab, at once.
func (s *Shrinker) replay(cands [][]plan.Plan, replayOn replayFunc) []replayed {
	out := make([]replayed, len(cands))
	if s.givesUp() {
		return out // none ran: done says so to every caller
	}
	var wg sync.WaitGroup
	for i, plans := range cands {
		wg.Go(func() {
			h, v, err := replayOn(s.labs[i], s.ctx, plans)
			out[i] = replayed{history: h, v: v, err: withoutUntidyStop(err)}
		})
	}
	wg.Wait()
	for _, r := range out {
		if r.err != nil && s.replayErr == nil && !s.done() {
			s.replayErr = r.err
		}
	}
	for range cands {
		s.Runs++
		if s.after != nil {
			s.after(cmp.Or(len(s.Plans), s.from))
		}
	}
	return out
}

// record makes plans, cut after the step that broke the invariant in r,
// the smallest failing run so far.
func (s *Shrinker) record(plans []plan.Plan, r replayed, smaller bool) {
	s.Plans = slices.Clone(plans[:r.history[len(r.history)-1].Step])
	s.History, s.Violation, s.want = r.history, r.v, r.v.Invariant
	s.found = append(s.found, foundRun{s.Plans, s.History, s.Violation, smaller})
}

// confirm makes sure the smallest failing run kept breaks the invariant
// again, in one of ReproduceTries replays, before it is reported: one
// that broke it once by the luck of an interleaving would be saved as a
// failure that does not replay. One that does not is dropped for the
// next smallest, down to the first run kept, which reproduced already.
// Where the run shared one server across its checks, each is confirmed
// on a fresh server, the first run kept too: what is saved is replayed
// on one (turncheck replay starts its own), and a run that broke the
// invariant only on a server earlier checks had used would not replay.
// On a server that behaves the same way under the same steps, it costs
// one replay.
func (s *Shrinker) confirm() {
	replayOn := s.replayOn
	if s.fresh {
		replayOn = s.freshOn
	}
	for {
		if len(s.found) == 1 && !s.fresh {
			s.confirmed = true // it broke the invariant when reproduced
			return
		}
		if s.done() {
			return
		}
		ended := 0
		if _, _, ok := s.breaksAgain(s.found[len(s.found)-1].plans, replayOn, func(replayed) { ended++ }); ok {
			s.confirmed = true
			return
		}
		if s.done() {
			return // cut short: the bound says so (partly shrunk)
		}
		if ended == 0 {
			// No replay came to an end (the server did not start, say):
			// nothing says the run does not break the invariant again.
			s.unreplayed = true
			return
		}
		if len(s.found) == 1 {
			// Not even the failing run's own steps broke it again on a
			// fresh server: they are reported, and the report says so.
			s.unconfirmed = true
			return
		}
		s.found = s.found[:len(s.found)-1]
		s.Dropped++
		next := s.found[len(s.found)-1]
		// Back to that run's name too: a loss it showed after a restart
		// (T7) is sought as such again.
		s.Plans, s.History, s.Violation, s.want = next.plans, next.history, next.violation, next.violation.Invariant
	}
}

// tryFirst replays the candidates in rounds, one try of each a round that
// has not had the tries it needs (needs), as many at once as there are
// labs, and keeps the first, in order, that broke the invariant in the
// round. Replays the bound cut short decide nothing, and are not counted
// as tries. Where none is kept, each tried is left: rejected, or, on
// fewer tries than it needed, left undecided (State).
func (s *Shrinker) tryFirst(cands [][]plan.Plan) bool {
	cands = slices.DeleteFunc(slices.Clone(cands), func(c []plan.Plan) bool { return len(c) == 0 })
	for i, c := range cands {
		cands[i] = onlySent(c)
	}
	if s.tryRounds(cands) {
		return true
	}
	for _, plans := range cands {
		if c := s.candidate(plans); c.tries > 0 {
			c.left = true
		}
	}
	return false
}

// tryRounds is tryFirst's search, which reports whether it kept one.
func (s *Shrinker) tryRounds(cands [][]plan.Plan) bool {
	for !s.done() {
		var due [][]plan.Plan
		for _, plans := range cands {
			if c := s.candidate(plans); c.tries < s.needs(c) {
				due = append(due, plans)
			}
		}
		if len(due) == 0 {
			return false
		}
		for len(due) > 0 {
			batch := due[:min(len(s.labs), len(due))]
			due = due[len(batch):]
			rs := s.replay(batch, s.replayOn)
			if s.done() {
				return false
			}
			first := -1
			for i, r := range rs {
				c := s.candidate(batch[i])
				c.tries++
				if r.err != nil {
					c.errs++
				}
				if first < 0 && s.breaks(r) {
					first = i
				}
			}
			if first >= 0 {
				s.keep(batch[first], rs[first])
				return true
			}
		}
	}
	return false
}

// keep keeps plans, cut after the step that broke the invariant in r.
// Kept first, by the slice, they set the tries every later candidate
// needs, as a failing run replayed would.
func (s *Shrinker) keep(plans []plan.Plan, r replayed) {
	c := s.candidate(plans)
	c.kept = true
	if len(s.found) == 0 {
		s.need = max(s.need, c.tries)
	}
	s.Kept++
	s.record(plans, r, true)
}

// candidate is how the candidate plans fared so far.
func (s *Shrinker) candidate(plans []plan.Plan) *candidate {
	if s.cands == nil {
		s.cands = map[string]*candidate{}
	}
	b, err := json.Marshal(plans)
	key := string(b)
	if err != nil {
		// No two candidates share a key they could not be written as.
		key = fmt.Sprintf("%p", plans)
	}
	c := s.cands[key]
	if c == nil {
		c = &candidate{burst: slices.ContainsFunc(plans, func(p plan.Plan) bool { return len(p.Sends) > 1 })}
		s.cands[key] = c
	}
	return c
}

// needs is how many tries candidate c gets before it is rejected: as
// many as the failing run needed to break the invariant again, and two
// where a step sends requests at once to a server that does not say when
// they came to rest, which may run them in another interleaving on each
// replay.
func (s *Shrinker) needs(c *candidate) int {
	n := max(s.need, 1)
	if c.burst && !s.reports {
		n = max(n, 2)
	}
	return n
}

// slice tries the steps that touch the violation's conversation alone,
// first without a restart, then with every restart they may depend on,
// and reports whether one broke the invariant: most failures need
// nothing else, and on a server that is slow to start the one or two
// replays save many of ddmin's, each restart most of all. The steps of
// earlier checks (plan.Plan.Earlier), whose conversations are others
// whatever their names, stay: they are what a leak between checks
// leaked, and ddmin tells which of them it needs.
func (s *Shrinker) slice() bool {
	conv := s.Violation.Conv
	if conv == (model.ConversationRef{}) {
		return false
	}
	var alone, restarted []plan.Plan
	for _, p := range s.Plans {
		if p.Earlier != (plan.Origin{}) {
			alone, restarted = append(alone, p), append(restarted, p)
			continue
		}
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
		// Its session's steps alone: an earlier check's conversations are
		// others, whatever their names.
		session := slices.DeleteFunc(slices.Clone(s.Plans), func(p plan.Plan) bool { return p.Earlier != s.Plans[i].Earlier })
		for _, p := range simpler(s.Plans[i], session, branches) {
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
// fewer conversations (of all, the steps of p's session),
// where that keeps a branch (branches: under the Responses API) a branch.
func simpler(p plan.Plan, all []plan.Plan, branches bool) []plan.Plan {
	var out []plan.Plan
	if p.Restart != nil && len(p.Sends) > 0 {
		// A crash with a turn in flight: the crash alone, or the turn alone.
		out = append(out, plan.Plan{Action: "crash", Restart: p.Restart, Earlier: p.Earlier},
			plan.Plan{Action: "continue", Sends: slices.Clone(p.Sends), Release: slices.Clone(p.Release), Earlier: p.Earlier})
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
	q := plan.Plan{Action: p.Action, Sends: slices.Delete(slices.Clone(p.Sends), k, k+1), Restart: p.Restart, Earlier: p.Earlier}
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

// onlySent is plans, with each request that carries no message of its
// own (an invalid continuation) rebuilt from its conversation's state as
// plans leave it: an earlier user message it quotes, where plans no
// longer send that message before it, is the conversation's latest one
// sent before it instead, or is left out where there is none. A shrunk
// failure then never quotes a message its steps do not send, nor calls
// it an earlier one (T3). Each session's steps (plan.Sessions) are read
// apart: an earlier check's tokens and conversations are others,
// whatever their names. Plans needing no change are returned as they
// are, shared.
func onlySent(plans []plan.Plan) []plan.Plan {
	latest := map[model.ConversationRef]openai.Message{}
	sent := map[model.Token]bool{}
	var out []plan.Plan // a copy, once a plan changes
	for i, p := range plans {
		if i > 0 && p.Earlier != plans[i-1].Earlier {
			clear(latest)
			clear(sent)
		}
		cloned := false
		for k, send := range p.Sends {
			if send.Token != "" {
				continue
			}
			msgs, changed := make([]openai.Message, 0, len(send.Messages)), false
			for _, m := range send.Messages {
				toks := model.Tokens(string(m.Content))
				if m.Role != openai.RoleUser || len(toks) == 0 || sent[toks[0]] {
					msgs = append(msgs, m)
					continue
				}
				changed = true
				if last, ok := latest[send.Conv]; ok {
					msgs = append(msgs, last)
				}
			}
			if !changed {
				continue
			}
			if out == nil {
				out = slices.Clone(plans)
			}
			if !cloned {
				out[i], cloned = clonePlan(p), true
			}
			out[i].Sends[k].Messages = msgs
		}
		for _, send := range p.Sends {
			if send.Token != "" {
				sent[send.Token] = true
				if n := len(send.Messages); n > 0 {
					latest[send.Conv] = send.Messages[n-1]
				}
			}
		}
	}
	if out == nil {
		return plans
	}
	return out
}

func clonePlan(p plan.Plan) plan.Plan {
	return plan.Plan{Action: p.Action, Sends: slices.Clone(p.Sends), Release: slices.Clone(p.Release), Restart: p.Restart, Earlier: p.Earlier}
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

// Budget is the context a shrink runs in: d from now, or until the run's
// own context ends. Its end, when the time ran out, has a boundError for
// cause, which says the bound as said: the report tells the bound from a
// run stopped.
func Budget(parent context.Context, d time.Duration, said string) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithTimeoutCause(parent, d, boundError{said})
	return context.WithValue(ctx, boundKey{}, d), cancel
}

// boundKey is the key of a Budget's bound in its context: the share of it
// a failure has to reproduce in is the shrinker's (ReproduceShare).
type boundKey struct{}

// boundError is why a shrink's context ended when its budget ran out.
type boundError struct{ said string }

func (e boundError) Error() string { return "the shrink bound, " + e.said + ", ran out" }

// The bound of a shrink no Options.ShrinkTime bounds: ShrinkReplays
// replays of the failing run, at the speed it ran, within MinShrink and
// MaxShrink. A slow server's failure gets the replays a fast one's does.
const (
	ShrinkReplays = 100
	MinShrink     = 30 * time.Second
	MaxShrink     = 10 * time.Minute
)

// ReplayBound is the bound of a shrink of a failing run that took took,
// and how it is said. left, if not 0, is the time the run has left, and
// still the checks that are to run after the shrink, each, as the checks
// so far, taking each: a run's time goes to its checks first, and a
// shrink takes what they leave, never what they need. A bound of 0 (or
// less) is no shrink at all.
func ReplayBound(took, left time.Duration, still int, each time.Duration) (time.Duration, string) {
	d := min(max(ShrinkReplays*took, MinShrink), MaxShrink)
	said := fmt.Sprintf("%d replays of the failing run at the %s it took, within %s and %s",
		ShrinkReplays, took.Round(10*time.Millisecond), MinShrink, MaxShrink)
	if left > 0 {
		need := time.Duration(still) * each
		if spare := left - need; spare < d {
			d = spare
			said += fmt.Sprintf(", and what the run's time left (%s) leaves beside the %d check(s) still to run (%s, at the %s a check took so far)",
				left.Round(time.Second), still, need.Round(time.Second), each.Round(10*time.Millisecond))
		}
	}
	return d, max(d, 0).Round(time.Second).String() + ": " + said
}

// Unreplayed says why a failure that did not reproduce could not be
// replayed at all: the first replay's error, where no replay of its steps
// came to an end; nil where one did (the failure then did not reproduce).
func (s *Shrinker) Unreplayed() error {
	if len(s.misses) > 0 {
		return nil
	}
	return s.replayErr
}

// Misses is how many replays of the failure's own steps came to an end
// without breaking the invariant: those Differed describes.
func (s *Shrinker) Misses() int { return len(s.misses) }

// Differed says, for a failure that did not reproduce, where each replay
// of its steps first went another way than the failing run: a person
// reads there what the server does not do the same way twice.
func (s *Shrinker) Differed(failing []history.Op) string {
	var b strings.Builder
	for i, h := range s.misses {
		d := Differences(failing, h)
		if len(d) == 0 {
			d = []string{"came to the same outcomes and order; it differed in what the model was asked"}
		}
		fmt.Fprintf(&b, "\nReplay %d differed: %s.", i+1, strings.Join(d, "; "))
	}
	return b.String()
}

// answer is an op's outcome in a few words.
func answer(op history.Op) string {
	r := op.Response
	a := r.Outcome.String()
	switch {
	case r.Outcome == model.Unknown && r.Status != 0:
		// Its answer began, then ended unknown: that it began is what
		// tells it from one with no answer at all.
		a += fmt.Sprintf(" after status %d", r.Status)
	case r.Outcome == model.Unknown:
		a += " with no status"
	case r.Status != 0:
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
