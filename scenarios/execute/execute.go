// Package execute carries out plans against a server: a Lab holds the fake
// model and the server of a run, a Session is one check against it, and
// its executor sends each step's requests, injects its faults, records its
// history and validates it against the reference model.
package execute

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/protocol"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// quietPeriod is how long the harness waits for a server that does not
// report its activity to do something more, before it takes the requests
// in flight to be queued behind one another. It decides which interleaving
// runs, never a verdict.
const quietPeriod = 25 * time.Millisecond

// executor carries out plans against one server and records their history.
type executor struct {
	srv    targets.Server
	fake   *faults.Model
	client *protocol.Client
	// profile is the server's, as the client was made for it.
	profile targets.Profile
	// clock is the run's timeline: invocations, completions and (through
	// the fake model's Clock) model calls all take a tick of it.
	clock *atomic.Int64
	steps int
	// ctx, if set, aborts every request in flight when it ends.
	ctx context.Context
	// spent is where the executor's wall time went, for a run's summary.
	spent timeSpent
	// cutRestart says a restart was cut short by ctx: the server may not
	// run at all now.
	cutRestart bool
}

// timeSpent is where a run's wall time went, by what it waited on.
type timeSpent map[string]time.Duration

// The places time goes that a summary names.
const (
	spentStarting = "starting servers"
	spentRestarts = "restarts and crashes"
	spentSettling = "waiting for the server to come to rest"
	spentQuiet    = "quiet periods (the server reports no activity)"
	spentTimeouts = "held calls waiting out the server's model timeout"
	spentStopping = "dropped turns waiting for the server to let go of the model"
	SpentShrink   = "shrinking"
)

// since adds the time since start to what.
func (t timeSpent) since(what string, start time.Time) { t[what] += time.Since(start) }

func (e *executor) tick() int64 { return e.clock.Add(1) }

// flight is one request of a plan in flight.
type flight struct {
	// gate is where the model holds the request now, or will: its first
	// call, then, for an abort at a later point, that point (later).
	gate, later *faults.Gate
	// gates are all of them, released when the step ends.
	gates   []*faults.Gate
	cancel  context.CancelFunc
	done    chan struct{}
	arrived atomic.Bool // the model holds the request at gate
	acted   bool        // let go, aborted or timed out
	// tok is the turn's user token ("" for a request without one), and
	// tag what the request is tagged with for a server that reports which
	// client it saw go away ("" for others).
	tok model.Token
	tag string
	// interrupted: the client dropped the connection while the model
	// held the turn; abortedAt is when, and dropped when on the run's
	// timeline, from which the model answered nothing of the turn.
	interrupted bool
	abortedAt   time.Time
	dropped     int64
	// released is when the harness let go of what the model held of this
	// dropped turn (0: the server gave up on all of it first).
	released int64
	// waitingOut is when the harness left a held call to the server's own
	// model timeout (zero if it did not), and ended when the request
	// ended: the time between is what that timeout cost the run.
	waitingOut, ended time.Time
}

func (f *flight) finished() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// held reports whether the model holds the request's call, waiting for the
// harness.
func (f *flight) held() bool { return f.arrived.Load() && !f.acted && !f.finished() }

// execute sends p's requests and returns what each came to, with the model
// calls attributed to each by the token of its last user message.
func (e *executor) execute(p plan.Plan) (ops []history.Op) {
	if p.Restart != nil && len(p.Sends) == 0 {
		e.steps++
		return []history.Op{e.restart(p, e.steps, 0)}
	}
	e.steps++
	start := e.clock.Load()
	ops = make([]history.Op, len(p.Sends))
	// crashed is the restart of a plan that crashes the server with a turn
	// in flight; it comes after the turns in the history.
	var crashed *history.Op
	defer func() {
		if p.Restart != nil {
			if crashed == nil {
				// The turn ended before its call was held (refused, say):
				// the crash comes after it.
				op := e.restart(p, e.steps, len(p.Sends))
				crashed = &op
			}
			ops = append(ops, *crashed)
		}
	}()
	// heal undoes the network fault of the send at index broken, once
	// its link is broken.
	var heal func() error
	broken := -1
	flights := make([]*flight, len(p.Sends))
	wake := make(chan struct{}, 1)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	// watch marks f arrived when the model holds it at its gate.
	watch := func(f *flight) {
		g := f.gate
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-g.Arrived():
				f.arrived.Store(true)
				poke()
			case <-f.done:
			}
		}()
	}
	_, reportsGone := e.srv.(targets.DisconnectReporter)
	for i, s := range p.Sends {
		f := &flight{done: make(chan struct{}), tok: s.Token}
		if reportsGone {
			f.tag = fmt.Sprintf("%d-%d", e.steps, i)
		}
		flights[i] = f
		if s.Token != "" {
			e.fake.ScriptReply(s.Token, faults.Reply{Rounds: s.Rounds, Fault: s.Fault})
			f.gate = e.fake.Gate(s.Token)
			f.gates = []*faults.Gate{f.gate}
			if later, ok := laterPoint(s); ok {
				f.later = e.fake.HoldAt(s.Token, later)
				f.gates = append(f.gates, f.later)
			}
		}
	}
	for i, s := range p.Sends {
		f := flights[i]
		base := e.ctx
		if base == nil {
			base = context.Background()
		}
		ctx, cancel := context.WithCancel(base)
		f.cancel = cancel
		req := e.client.NewRequest(ctx, s)
		req.Tag = f.tag
		ops[i] = history.Op{Step: e.steps, Index: i, Action: p.Action, Send: s, Request: req}
		ops[i].Turn.Invoke = e.tick()
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent := time.Now()
			ops[i].Response = e.client.Send(ctx, req)
			if ops[i].Response.Cause == protocol.CauseAborted && base.Err() != nil {
				// Not an abort the plan drew: the run ended with it open.
				ops[i].Response.Cause = protocol.CauseRunEnded
			}
			ops[i].Turn.Return = e.tick()
			// Wall time only ever excuses: a refusal after this long may
			// be a bounded wait ending (T4).
			ops[i].Turn.WaitedOut = time.Since(sent) >= e.profile.ModelTimeoutOrDefault()
			f.ended = time.Now()
			close(f.done)
			poke() // after done: a wake-up must find the change it announces
		}()
		if f.gate != nil {
			watch(f)
		}
		e.settle(flights[:i+1], wake)
	}
	for {
		e.settle(flights, wake)
		next := -1
		all := true
		for _, i := range p.Release {
			if !flights[i].finished() {
				all = false
			}
			if next < 0 && flights[i].held() {
				next = i
			}
		}
		if all {
			break
		}
		if next < 0 {
			// Nothing is held: a request is on its way (to the model, or
			// out of a queue); wait for it to come to rest. A dropped
			// turn whose server still waits on what the model holds of
			// it keeps the others queued: its calls are let go once the
			// server is known to have seen the disconnect, or at the
			// bound (releaseDropped).
			if !e.releaseDropped(flights) {
				e.waitChange(wake, e.dropWait(flights))
			}
			continue
		}
		if p.Restart != nil && crashed == nil {
			// A crash while the turn's call is held: the server dies with
			// the turn in flight, and the client never learns its outcome.
			flights[next].acted = true
			op := e.restart(p, e.steps, len(p.Sends))
			crashed = &op
			continue
		}
		if s := p.Sends[next]; s.Net != nil && ops[next].Net == "" {
			// The turn is in flight, its replica holding the conversation:
			// the link breaks now, and stays broken until the request ends.
			heal, ops[next].Net = e.breakLink(s)
			broken = next
		}
		if f := flights[next]; f.later != nil {
			// The turn goes on to the point where the client drops it, or
			// the server's deadline passes.
			f.gate.Release()
			f.gate, f.later = f.later, nil
			f.arrived.Store(false)
			watch(f)
			continue
		}
		e.let(p.Sends[next], flights[next])
	}
	wg.Wait()
	if heal != nil {
		if err := heal(); err != nil {
			ops[broken].Net += history.NetNotHealed + err.Error()
		}
	}
	if targets.Fronted(e.srv) {
		for i := range ops {
			lost := crashed != nil ||
				ops[i].Send.Net != nil && ops[i].Send.Net.Link == targets.ClientLink && strings.HasPrefix(ops[i].Net, history.NetBroken)
			frontAnswered(&ops[i].Response, lost)
			status := ops[i].Response.Status
			ops[i].Turn.Gateway = status == http.StatusBadGateway || status == http.StatusGatewayTimeout
			if r, ok := e.fake.ServedBy(ops[i].Send.Token); ok && ops[i].Send.Token != "" {
				ops[i].Served = &r
			}
		}
	}
	for _, f := range flights {
		f.cancel()
		if !f.waitingOut.IsZero() {
			e.spent[spentTimeouts] += f.ended.Sub(f.waitingOut)
		}
	}
	interrupted := slices.ContainsFunc(flights, func(f *flight) bool { return f.interrupted })
	// A dropped turn is let go of only once its server gave up on what
	// the model holds of it, said it saw the disconnect, or had the whole
	// bound: never after a grace a slow machine could outlast.
	e.awaitStop(flights)
	e.idle()
	for _, f := range flights {
		for _, g := range f.gates {
			// A server that did not pass a deadline on to the model
			// still holds the call (or the tool run): answer it, so that
			// what the server does with the answer shows, rather than a
			// stall.
			g.Release()
		}
		if f.interrupted {
			e.fake.ReleaseDrop(f.tok)
		}
	}
	if interrupted {
		// What the server does once let go, after its client left, is
		// what T10 judges: wait for it.
		e.idle()
		e.quiet()
	}
	e.attribute(ops, e.fake.CallsAfter(start), e.fake.RunsAfter(start))
	for i, f := range flights {
		switch {
		case !f.interrupted:
		case e.profile.Interruption == targets.Complete:
			// The server runs the turn on: an unknown outcome, not a stop.
			ops[i].Turn.Detached = true
		default:
			ops[i].Turn.Interrupted = true
			ops[i].Turn.Dropped, ops[i].Turn.Released = f.dropped, f.released
		}
	}
	for _, s := range p.Sends {
		if s.Token != "" {
			// A fault is for this step only: a server that later replays
			// this message (a bug the harness must report, not hang on)
			// gets a reply.
			e.fake.Forget(s.Token)
		}
	}
	return ops
}

// frontAnswered makes unknown the outcome of a turn that failed with a
// status from 500 up, behind a front, when the harness broke the front's
// link to a replica or killed a replica while the turn was in flight
// (lost): the front answers such a status for a replica it lost, which
// may have committed the turn, or may yet, whatever the front said.
// Neither the front nor the client can know (PROTOCOL.md, "What a
// server declares").
func frontAnswered(r *protocol.Response, lost bool) {
	if lost && r.Outcome == model.Fail && r.Status >= 500 {
		r.Outcome = model.Unknown
		r.Detail = fmt.Sprintf("status %d, from a front that lost its replica, the harness having broken its link or killed it: %s", r.Status, r.Detail)
	}
}

// restart carries out p's restart, the index-th op of step: the server is
// stopped, or killed, and started again on the same data, loading the
// agent from the references p says; the client then speaks to it wherever
// it now listens. The op's Response.Detail is "" for a server that came
// back, or what went wrong.
func (e *executor) restart(p plan.Plan, step, index int) history.Op {
	defer e.spent.since(spentRestarts, time.Now())
	op := history.Op{Step: step, Index: index, Action: p.Action, Restart: p.Restart, Response: protocol.Response{Outcome: model.OK}}
	r, ok := e.srv.(targets.Restarter)
	if !ok {
		op.Response.Outcome, op.Response.Detail = model.Fail, "the server cannot be restarted by the harness"
		return op
	}
	var refs []string
	if p.Restart.Sources != nil {
		refs = targets.SourceRefs(e.fake.URL(), e.profile.Agent, p.Restart.Sources)
	}
	restart := r.Restart
	if rc, ok := e.srv.(targets.ContextRestarter); ok && e.ctx != nil {
		// The run's or the shrink's time bound holds through a restart
		// of a server slow to start.
		restart = func(crash bool, refs []string) error { return rc.RestartContext(e.ctx, crash, refs) }
	}
	if i := p.Restart.Replica; i != nil {
		rr, ok := e.srv.(targets.Replicated)
		if !ok {
			op.Response.Outcome, op.Response.Detail = model.Fail, "the server does not run as replicas"
			return op
		}
		restart = func(crash bool, _ []string) error {
			return rr.RestartReplica(cmp.Or(e.ctx, context.Background()), *i, crash)
		}
	}
	if err := restart(p.Restart.Crash, refs); err != nil {
		e.cutRestart = e.ctx != nil && e.ctx.Err() != nil
		if errors.Is(err, targets.ErrHarness) {
			op.HarnessError = err.Error()
		}
		op.Response.Outcome, op.Response.Detail = model.Fail, "the server did not come back: "+err.Error()
		return op
	}
	e.client.Rebase(targets.URLs(e.srv))
	return op
}

// breakLink breaks the link of s's replica that s.Net names (behind a
// front, of the replica that serves s), and returns its heal and what
// became of the fault (history.Op.Net).
func (e *executor) breakLink(s plan.Send) (func() error, string) {
	lb, ok := e.srv.(targets.LinkBreaker)
	if !ok {
		return nil, "not applied: the server's links do not run through the harness"
	}
	replica := s.Replica
	if targets.Fronted(e.srv) {
		if replica, ok = e.fake.ServedBy(s.Token); !ok {
			return nil, "not applied: no model call showed which replica serves the turn"
		}
	}
	heal, err := lb.Break(replica, *s.Net)
	if err != nil {
		return nil, "not applied: " + err.Error()
	}
	return heal, history.NetBroken
}

// let does what s says with its held call: abort the request, time the
// call out at the server's deadline, or let it go on.
func (e *executor) let(s plan.Send, f *flight) {
	f.acted = true
	switch dc, ok := e.srv.(targets.DeadlineController); {
	case s.Abort:
		if e.profile.Interruption != targets.Complete {
			// From now on the model answers nothing of the turn: what the
			// server does about the disconnect, not how fast, is judged.
			e.fake.Drop(s.Token)
			f.dropped = e.tick()
		}
		f.cancel()
		f.interrupted, f.abortedAt = true, time.Now()
		if e.profile.Interruption == targets.Complete {
			// The server runs the turn on, the conversation held: let it,
			// or the turns queued behind it in a burst wait on the harness.
			f.released = e.tick()
			for _, g := range f.gates {
				g.Release()
			}
		}
	case s.Fault.Kind == faults.Hold && ok:
		// The model never answers: the server's deadline passes now. Only
		// a sequential step holds until the deadline, so no other call is
		// in flight to time out with it.
		dc.ExpireDeadlines()
	default:
		// A hold on a server without deadline control lasts until its own
		// timeout.
		if s.Fault.Kind == faults.Hold {
			f.waitingOut = time.Now()
		}
		f.gate.Release()
	}
}

// settle waits until every request in flights has come to rest: answered,
// held by the model, or (as the server reports it) queued behind another
// turn. A server that does not report its activity gets a quiet period.
func (e *executor) settle(flights []*flight, wake <-chan struct{}) {
	ar, reports := e.srv.(targets.ActivityReporter)
	defer e.spent.since(settlingKind(reports), time.Now())
	for {
		resting := 0
		for _, f := range flights {
			if f.finished() || f.held() {
				resting++
			}
		}
		if resting == len(flights) {
			return
		}
		if !reports {
			select {
			case <-wake:
				continue
			case <-time.After(quietPeriod):
				return
			}
		}
		_, waiting, changed := ar.Activity()
		if resting+waiting >= len(flights) {
			// Check again after the count: a request that came to rest in
			// between has poked wake, so nothing is missed.
			select {
			case <-wake:
				continue
			default:
				return
			}
		}
		select {
		case <-wake:
		case <-changed:
		}
	}
}

// waitChange waits for any request or, where the server reports it, the
// server's queue to change, at most limit.
func (e *executor) waitChange(wake <-chan struct{}, limit time.Duration) {
	var changed <-chan struct{}
	if ar, ok := e.srv.(targets.ActivityReporter); ok {
		_, _, changed = ar.Activity()
	}
	select {
	case <-wake:
	case <-changed:
	case <-time.After(limit):
	}
}

// stopping reports whether f is a dropped turn the harness still holds
// for: it has not been let go, and its server has not yet said it saw the
// disconnect (a DisconnectReporter) or, for one that does not say, given
// up on all the model holds of it.
func (e *executor) stopping(f *flight) bool {
	if !f.interrupted || f.released != 0 || e.profile.Interruption == targets.Complete {
		return false
	}
	if _, ok := e.srv.(targets.DisconnectReporter); ok {
		// Let go of only once it says so, whatever it gave up on first:
		// the same point, on every replay.
		return true
	}
	return e.fake.HoldingTurn(f.tok) > 0
}

// dropWait is how long to wait for a change: a moment, while a dropped
// turn's server may give up on what the model holds of it (the model
// does not announce it), or the client's time.
func (e *executor) dropWait(flights []*flight) time.Duration {
	if slices.ContainsFunc(flights, e.stopping) {
		return pollInterval
	}
	return targets.ClientTimeout
}

// releaseDropped lets go of what the model holds of each dropped turn of
// flights whose server is known to have seen its client go away (a
// DisconnectReporter said so), or has held it for the whole stopBound,
// and reports whether it let go of any. What the turn starts after that
// is what T10 judges, from this tick on. A server that gives up on it
// first is never let go of: it stopped, at whatever speed.
func (e *executor) releaseDropped(flights []*flight) bool {
	dr, reports := e.srv.(targets.DisconnectReporter)
	any := false
	for _, f := range flights {
		if !e.stopping(f) {
			continue
		}
		if !(reports && dr.DoneWith(f.tag)) && time.Since(f.abortedAt) < e.stopBound() {
			continue
		}
		f.released = e.tick()
		for _, g := range f.gates {
			g.Release()
		}
		e.fake.ReleaseDrop(f.tok)
		any = true
	}
	return any
}

// awaitStop waits until no dropped turn of flights is held for: each
// server gave up on what the model holds of its turn, or was let go of
// (releaseDropped).
func (e *executor) awaitStop(flights []*flight) {
	if !slices.ContainsFunc(flights, e.stopping) {
		return
	}
	defer e.spent.since(spentStopping, time.Now())
	for !e.releaseDropped(flights) && slices.ContainsFunc(flights, e.stopping) {
		if e.ctx != nil && e.ctx.Err() != nil {
			return
		}
		time.Sleep(pollInterval)
	}
}

// stopBound is how long the model holds what a dropped turn's server
// waits on, for a server that does not say when it saw the disconnect,
// before the harness lets go of it: longer than the server's own model
// timeout, at which a server that does not pass the disconnect on gives
// up by itself. It only ever decides when what the server does next is
// seen (PROTOCOL.md, "Time").
func (e *executor) stopBound() time.Duration {
	return e.profile.ModelTimeoutOrDefault() + stopMargin
}

// idle waits, where the server reports its activity, until it has finished
// every request, or is only waiting for what the fake model holds: an
// aborted turn's rollback is then done before the next step, which would
// otherwise race it. A server that does not report its activity is not
// waited for here (quiet is).
func (e *executor) idle() {
	ar, ok := e.srv.(targets.ActivityReporter)
	if !ok {
		return
	}
	defer e.spent.since(settlingKind(ok), time.Now())
	deadline := time.After(targets.ClientTimeout)
	for {
		working, _, changed := ar.Activity()
		if working == 0 || working <= e.fake.Holding() {
			return
		}
		select {
		case <-changed:
		case <-time.After(pollInterval): // the model's holds change unannounced
		case <-deadline:
			return
		}
	}
}

// settlingKind is where the time a step waits for the server to come
// to rest goes: a server that reports its activity is waited for, one
// that does not is given quiet periods, which a user may want to know
// cost their run.
func settlingKind(reports bool) string {
	if reports {
		return spentSettling
	}
	return spentQuiet
}

// stopMargin is what stopBound adds to the server's model timeout.
// pollInterval is how often the harness looks at what the model holds.
const (
	stopMargin   = time.Second
	pollInterval = 2 * time.Millisecond
)

// quiet waits until no model call or tool run has arrived for a quiet
// period (at most targets.ClientTimeout): what a server that does not report its
// activity does once let go then falls in this step.
func (e *executor) quiet() {
	if _, ok := e.srv.(targets.ActivityReporter); ok {
		return // idle has waited for it
	}
	defer e.spent.since(spentQuiet, time.Now())
	deadline := time.After(targets.ClientTimeout)
	last, since := e.fake.CallCount()+e.fake.RunCount(), time.Now()
	for time.Since(since) < quietPeriod {
		select {
		case <-deadline:
			return
		case <-time.After(pollInterval):
		}
		if n := e.fake.CallCount() + e.fake.RunCount(); n != last {
			last, since = n, time.Now()
		}
	}
}

// laterPoint is where, past its first model call, the model holds a
// turn for the harness to act on: the point its client drops it at, or
// the call of its tool loop held until the server's deadline.
func laterPoint(s plan.Send) (faults.Point, bool) {
	switch {
	case s.Abort && s.AbortAt != nil && *s.AbortAt != (faults.Point{}):
		return *s.AbortAt, true
	case !s.Abort && s.Fault.Kind == faults.Hold && s.Fault.Round > 0:
		return faults.Point{Round: s.Fault.Round}, true
	}
	return faults.Point{}, false
}

// attribute fills in each op's model.Turn: its outcome, and the calls that
// belong to it. A call belongs to the turn whose token is the call's last
// user token. Any other call made during the step is, for a request
// without a usable message sent on its own, what that request set off
// (T3), and otherwise an auxiliary call (a title, a summary), which must
// still mix no conversations (T5): it goes with the step's first request.
func (e *executor) attribute(ops []history.Op, calls []model.Call, runs []model.ToolRun) {
	for i := range ops {
		op := &ops[i]
		op.Turn.Conv = op.Send.Conv
		op.Turn.User = op.Send.Token
		op.Turn.Usable = op.Send.Token != ""
		op.Turn.Outcome = op.Response.Outcome
		op.Turn.Status = op.Response.Status
		op.Turn.Reply = op.Response.Reply
		op.Turn.TimedOut = op.Response.TimedOut
		op.Turn.Open = op.Response.Open
	}
	for _, c := range calls {
		owner := 0
		for i := range ops {
			if ops[i].Send.Token != "" && ops[i].Send.Token == c.Turn {
				owner = i
				break
			}
		}
		ops[owner].Turn.Calls = append(ops[owner].Turn.Calls, c)
	}
	// A tool run belongs to the turn whose tool call it runs; the model
	// names the turn in the call's id.
	for _, r := range runs {
		user, _, ok := model.ToolTurn(r.ID)
		for i := range ops {
			if ok && ops[i].Send.Token != "" && ops[i].Send.Token == user {
				ops[i].Turn.Runs = append(ops[i].Turn.Runs, r)
				break
			}
		}
	}
}

// Spent says where the executor's wall time went so far, by what it
// waited on.
func (e *executor) Spent() map[string]time.Duration { return e.spent }
