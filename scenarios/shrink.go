package scenarios

import (
	"context"
	"slices"
	"time"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
)

// shrinker minimises a failing run's plans directly, as delta debugging
// does: first whole steps go (ddmin over the plans), then each step is made
// simpler (fewer requests in a burst, no fault, no stream, fewer
// conversations). Every candidate is replayed in a session of its own, and
// kept if it breaks the same invariant. rapid stays the search; this is
// the shrinker, bounded by a hard wall-clock budget.
type shrinker struct {
	lab  *lab
	want model.Invariant
	ctx  context.Context
	// runs counts the candidates replayed; after is called after each.
	runs  int
	after func()
	// cut says the bound ran out before the shrinker was done, and kept
	// counts the smaller candidates it kept before then.
	cut  bool
	kept int
	// plans, history and violation are the smallest failing run so far.
	plans     []Plan
	history   []Op
	violation *model.Violation
}

// shrink returns the smallest run it finds, within ctx, that breaks v's
// invariant as plans did. ok is false if plans, replayed, did not break it
// at all: the failure did not reproduce.
func shrink(ctx context.Context, l *lab, plans []Plan, v *model.Violation, after func()) (s *shrinker, ok bool) {
	s = &shrinker{lab: l, want: v.Invariant, ctx: ctx, after: after}
	// A server that does not report its activity may run a burst in
	// another interleaving on a replay: a failure is taken not to
	// reproduce only after several tries.
	reproduced := false
	for range reproduceTries {
		if reproduced = s.try(plans); reproduced || s.done() {
			break
		}
	}
	if !reproduced {
		return s, false
	}
	s.slice()
	s.ddmin()
	for changed := true; changed && !s.done(); {
		changed = s.simplify()
		if changed {
			s.ddmin()
		}
	}
	// A candidate the bound cut short decided nothing: the shrinker may
	// have stopped short of where it would have ended.
	s.cut = s.done()
	return s, true
}

func (s *shrinker) done() bool { return s.ctx.Err() != nil }

// reproduceTries is how many replays of a failing run's steps must all
// pass before the failure is called flaky.
const reproduceTries = 3

// try replays plans; it keeps them, cut after the step that broke the
// invariant, if they break it.
func (s *shrinker) try(plans []Plan) bool {
	if s.done() || len(plans) == 0 {
		return false
	}
	s.runs++
	history, v, err := s.lab.replay(s.ctx, plans)
	if s.after != nil {
		s.after()
	}
	if err != nil || v == nil || v.Invariant != s.want || s.done() {
		return false
	}
	if s.plans != nil {
		s.kept++
	}
	s.plans = slices.Clone(plans[:history[len(history)-1].Step])
	s.history, s.violation = history, v
	return true
}

// slice tries, in one replay, the steps that touch the violation's
// conversation, with every restart they may depend on: most failures
// need nothing else, and on a server that is slow to start one replay
// saves many of ddmin's.
func (s *shrinker) slice() {
	conv := s.violation.Conv
	if conv == (model.ConversationRef{}) {
		return
	}
	var kept []Plan
	for _, p := range s.plans {
		if p.Restart != nil || slices.ContainsFunc(p.Sends, func(x Send) bool { return x.Conv == conv }) {
			kept = append(kept, p)
		}
	}
	if len(kept) < len(s.plans) {
		s.try(kept)
	}
}

// ddmin removes as many whole steps as it can: chunks of the plans, halved
// until single steps, as Zeller's delta debugging does with complements.
func (s *shrinker) ddmin() {
	n := 2
	for len(s.plans) >= 2 && !s.done() {
		n = min(n, len(s.plans))
		reduced := false
		for i := range n {
			lo, hi := i*len(s.plans)/n, (i+1)*len(s.plans)/n
			if s.try(slices.Concat(s.plans[:lo], s.plans[hi:])) {
				n = max(n-1, 2)
				reduced = true
				break
			}
		}
		if !reduced {
			if n == len(s.plans) {
				return
			}
			n = min(2*n, len(s.plans))
		}
	}
}

// simplify tries to make each step simpler, latest first, and reports
// whether any candidate was kept.
func (s *shrinker) simplify() bool {
	changed := false
	for i := len(s.plans) - 1; i >= 0 && !s.done(); i-- {
		if i >= len(s.plans) {
			continue // a kept candidate ended earlier
		}
		for _, p := range simpler(s.plans[i], s.plans) {
			if s.try(slices.Concat(s.plans[:i], []Plan{p}, s.plans[i+1:])) {
				changed = true
				break
			}
		}
	}
	return changed
}

// simpler lists simpler versions of p, most drastic first: the burst
// without one of its requests, then one request without its fault, with
// its abort at its first call, with fewer or plainer tool calls, or
// without its stream, then the burst's requests on fewer conversations.
func simpler(p Plan, all []Plan) []Plan {
	var out []Plan
	if p.Restart != nil && len(p.Sends) > 0 {
		// A crash with a turn in flight: the crash alone, or the turn alone.
		out = append(out, Plan{Action: "crash", Restart: p.Restart},
			Plan{Action: "continue", Sends: slices.Clone(p.Sends), Release: slices.Clone(p.Release)})
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
	}
	if first := firstConv(all); len(p.Sends) > 1 {
		for k, send := range p.Sends {
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
func withoutSend(p Plan, k int) Plan {
	q := Plan{Action: p.Action, Sends: slices.Delete(slices.Clone(p.Sends), k, k+1), Restart: p.Restart}
	if p.Action == burstAction(len(p.Sends)) {
		q.Action = burstAction(len(q.Sends))
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
func simplerTools(s Send) []Send {
	var out []Send
	add := func(rounds []faults.Round) {
		c := s
		c.Rounds = rounds
		if c.checkTools() == nil {
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

func clonePlan(p Plan) Plan {
	return Plan{Action: p.Action, Sends: slices.Clone(p.Sends), Release: slices.Clone(p.Release), Restart: p.Restart}
}

// firstConv is the conversation the run's first request was sent on.
func firstConv(plans []Plan) model.ConversationRef {
	for _, p := range plans {
		for _, s := range p.Sends {
			return s.Conv
		}
	}
	return model.ConversationRef{}
}

// shrinkBudget is the context a shrink runs in: ShrinkTime from now, or
// until the run's own context ends.
func shrinkBudget(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	return context.WithTimeout(parent, d)
}
