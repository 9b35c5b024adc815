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
	"regexp"
	"slices"
	"sync/atomic"
	"time"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/goroutines"
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
	// aux are the instructions of the server's auxiliary calls, its lab's.
	aux *AuxInstructions
	// lab is the session's: its starts are tried, counted and noted
	// there.
	lab *Lab
	// notStarted is set once a restart a step drew did not start in any
	// of its tries: the start finding, which ends the run.
	notStarted *NotStarted
	// killed is when each conversation last had a turn in flight under a
	// kill of its server (a crash mid-turn), for the profile's takeover
	// bound (inTakeover).
	killed map[model.ConversationRef]time.Time
}

// killedUnder notes that the server is killed now under the turns of
// sends.
func (e *executor) killedUnder(sends []plan.Send) {
	if e.killed == nil {
		e.killed = map[model.ConversationRef]time.Time{}
	}
	now := time.Now()
	for _, s := range sends {
		e.killed[s.Conv] = now
	}
}

// inTakeover reports whether a request on conv sent at sent falls within
// the profile's takeover bound after a kill under a turn of conv
// (model.Turn.InTakeover). Wall time only ever excuses.
func (e *executor) inTakeover(conv model.ConversationRef, sent time.Time) bool {
	at, ok := e.killed[conv]
	return ok && sent.Sub(at) < e.profile.TakeoverAfter
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
	spentStopping = "interrupted turns (dropped or cancelled) waiting for the server to let go of the model"
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
	// runsOn: the server runs the interrupted turn on to its end, an
	// unknown outcome (runsOn).
	runsOn bool
	// doneAt is when the harness first saw the server say it was done with
	// the dropped request (a DisconnectReporter, or told).
	doneAt time.Time
	// waits is the request's protocol.Request.Waits; goes its
	// protocol.Request.Goes, closed (gone set) when the harness lets it
	// go (settle).
	waits <-chan struct{}
	goes  chan struct{}
	gone  bool
	// told is set once the server said, in its answers to the client, that
	// it stopped the turn the client cancelled (protocol.Request.Stopped,
	// Response.SaysStopped).
	told atomic.Bool
	// released is when the harness let go of what the model held of this
	// dropped turn (0: the server gave up on all of it first), and
	// releasedAfter, where it let go because the server gave up on all of
	// it, when what the server gave up on arrived (model.Turn.ReleasedAfter).
	released      int64
	releasedAfter []int64
	// waitingOut is when the harness left a held call to the server's own
	// model timeout (zero if it did not), and ended when the request
	// ended: the time between is what that timeout cost the run.
	waitingOut, ended time.Time
}

// runsOn reports whether the server runs a turn on once its client left
// it as s says: under the interruption policy complete, whatever the
// client did; else where the client dropped the connection (an A2A
// task's, the only abort that names one apart from a cancel) and the
// server runs such a turn on (runsOnDisconnect).
func (e *executor) runsOn(s plan.Send) bool {
	return e.profile.Interruption == targets.Complete || s.DropsTask() && e.runsOnDisconnect()
}

// runsOnDisconnect reports whether the server runs a turn on once its
// client's connection closed: under complete, and an A2A agent that
// declares its tasks outlive their connection.
func (e *executor) runsOnDisconnect() bool {
	return e.profile.Interruption == targets.Complete || e.profile.Protocol == targets.A2A && e.profile.A2AAPI.DropRunsOn()
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

// parked reports whether the client holds the request back, waiting on
// another of the step (protocol.Request.Waits): at rest until that one
// moves.
func (f *flight) parked() bool { return f.waits != nil && !f.gone && !f.finished() }

// mayGo reports whether f is parked and what it waited on has moved.
func (f *flight) mayGo() bool {
	if !f.parked() {
		return false
	}
	select {
	case <-f.waits:
		return true
	default:
		return false
	}
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
// agent from the references p says, up to its tries (Lab.tryStart); the
// client then speaks to it wherever it now listens. The op's
// Response.Detail is "" for a server that came back, or what went wrong;
// its HarnessError says the harness could not carry the restart out as
// drawn (a setup error, never the server's doing). A server that did not
// start again is notStarted.
func (e *executor) restart(p plan.Plan, step, index int) history.Op {
	defer e.spent.since(spentRestarts, time.Now())
	op := history.Op{Step: step, Index: index, Action: p.Action, Restart: p.Restart, Response: protocol.Response{Outcome: model.OK}}
	r, ok := e.srv.(targets.Restarter)
	if !ok {
		op.HarnessError = "the step restarts a server the harness cannot restart: its target's Server has no Restart method (scenarios.Restarter)"
		op.Response.Outcome, op.Response.Detail = model.Fail, op.HarnessError
		return op
	}
	var refs []string
	if p.Restart.Sources != nil {
		refs = e.profile.SourceRefs(e.fake.URL(), p.Restart.Sources)
	}
	restart := restartIn(e.ctx, r)
	if i := p.Restart.Replica; i != nil {
		rr, ok := e.srv.(targets.Replicated)
		if !ok {
			op.HarnessError = "the step restarts a replica of a server that does not run as replicas"
			op.Response.Outcome, op.Response.Detail = model.Fail, op.HarnessError
			return op
		}
		restart = func(crash bool, _ []string) error {
			return rr.RestartReplica(cmp.Or(e.ctx, context.Background()), *i, crash)
		}
	}
	what := fmt.Sprintf("its restart drawn at step %d (%s)", step, p.Restart)
	if p.Action == recoverAction {
		what = fmt.Sprintf("its start again after it went down on its own at step %d (its crash a finding already, or skipped)", step)
	}
	if e.lab.NotStarted != nil {
		op.Response.Outcome, op.Response.Detail = model.Fail, "the server did not start again: "+e.lab.NotStarted.Error()
		e.notStarted = e.lab.NotStarted
		return op
	}
	tries, err := e.lab.tryStart(e.ctx, what, func() error { return restart(p.Restart.Crash, refs) }, func(err error) bool {
		// Two references refused in a usage error are the profile's
		// business (oneSource): no try can mend them.
		return restartFailed(err) && !(len(refs) > 1 && usageError.MatchString(err.Error()))
	})
	if err != nil {
		e.cutRestart = e.ctx != nil && e.ctx.Err() != nil
		switch {
		case errors.Is(err, targets.ErrHarness):
			op.HarnessError = err.Error()
		case len(refs) > 1 && !e.cutRestart:
			op.HarnessError = e.oneSource(restart, refs, err)
		}
		op.Response.Outcome, op.Response.Detail = model.Fail, "the server did not start again: "+err.Error()
		if op.HarnessError == "" && !e.cutRestart {
			e.notStarted = e.lab.notStarted(what, step, tries, err)
		}
		return op
	}
	e.client.Rebase(targets.URLs(e.srv))
	if refs != nil {
		e.client.Loaded(refs)
	}
	return op
}

// oneSource tells a server that cannot be started with two references to
// its agent from one that went down: a start with refs that failed (err)
// in words that read as a usage error ("accepts 1 arg(s), received 2") is
// tried again with the first of them alone. A server that comes back then
// was asked what its profile cannot express: a setup error that names the
// profile's field (said, and returned). Any other failure is the server's
// doing, a finding ("" returned).
func (e *executor) oneSource(restart func(crash bool, refs []string) error, refs []string, err error) string {
	if !usageError.MatchString(err.Error()) || restart(true, refs[:1]) != nil {
		return ""
	}
	e.client.Rebase(targets.URLs(e.srv))
	return fmt.Sprintf("the server did not start with two references to its agent, and did with one: it loads one agent source "+
		"at a time, which its profile does not say; set server.one_source: true in the profile (Profile.OneSource in Go) (its start with two: %v)", err)
}

// usageError matches what command lines say when given arguments they do
// not take (cobra's, Go's flag package's, clap's, argparse's).
var usageError = regexp.MustCompile(`(?i)\busage\b|accepts (at most |exactly )?\d+ arg|too many arguments|` +
	`unexpected argument|unknown (flag|command|shorthand)|flag provided but not defined|unrecognized arguments`)

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

// settle waits until every request in flights has come to rest: answered,
// held by the model, or (as the server reports it) queued behind another
// turn, or parked. A server that reports neither gets a quiet period.
func (e *executor) settle(flights []*flight, wake <-chan struct{}) {
	for {
		e.settleOnce(flights, wake)
		// A request held back that may go now goes, the first in send
		// order, once all the others are at rest; then the next, once
		// it too came to rest: one at a time, so that what reaches the
		// server first is the seed's to say, not a race.
		i := slices.IndexFunc(flights, (*flight).mayGo)
		if i < 0 {
			return
		}
		flights[i].gone = true
		close(flights[i].goes)
	}
}

// settleOnce is settle, with no request held back let go.
func (e *executor) settleOnce(flights []*flight, wake <-chan struct{}) {
	if pr, ok := e.srv.(targets.ParkReporter); ok {
		e.settleParked(pr, flights, wake)
		return
	}
	ar, reports := e.srv.(targets.ActivityReporter)
	// Only the quiet periods that ran out are quiet: the rest of the
	// wait is the requests' own work.
	start, quieted := time.Now(), false
	defer func() {
		waited := time.Since(start)
		if quieted {
			q := min(quietPeriod, waited)
			e.spent[spentQuiet] += q
			waited -= q
		}
		e.spent[spentSettling] += waited
	}()
	for {
		resting := 0
		for _, f := range flights {
			if f.finished() || f.held() || f.parked() {
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
				quieted = true
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

// settleParked waits until every request in flights is answered, held by
// the model, or parked in the server. Nothing announces that a goroutine
// parked, so the server is looked at whenever a while passes with no
// request answered or held, a short while at first, then further apart
// the longer nothing has changed, an eighth of that time at most: how
// soon it parks never decides whether it has, and a look, which stops the
// whole process and writes out every goroutine's stack, is spared a
// request on its way to the model, and one that waits seconds for a
// call the model holds until the server gives up (a look every
// pollInterval made such waits most of a check's CPU). A request asleep
// on a timer (a lock polled, a backoff) waits for what no look can see:
// once nothing has changed for a quiet period, it is taken to be at rest,
// as a server that reports nothing is.
func (e *executor) settleParked(pr targets.ParkReporter, flights []*flight, wake <-chan struct{}) {
	start, wait, changed := time.Now(), pollInterval/4, time.Now()
	quieted := false
	defer func() {
		if quieted {
			e.spent[spentQuiet] += quietPeriod
			start = start.Add(quietPeriod)
		}
		e.spent.since(spentSettling, start)
	}()
	for {
		var tags []string
		for _, f := range flights {
			if !f.finished() && !f.held() && !f.parked() {
				tags = append(tags, f.tag)
			}
		}
		if len(tags) == 0 {
			return
		}
		select {
		case <-wake:
			changed, wait = time.Now(), pollInterval/4
			continue
		case <-time.After(wait):
			wait = min(2*wait, max(pollInterval, time.Since(changed)/8))
		}
		switch least := slices.Min(pr.Parked(tags)); {
		case least == goroutines.Parked:
			return
		case least == goroutines.Asleep && time.Since(changed) >= quietPeriod:
			quieted = true
			return
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

// idle waits, where the server reports its activity, until it has finished
// every request, or is only waiting for what the fake model holds: an
// aborted turn's rollback is then done before the next step, which would
// otherwise race it. A server that does not report its activity is not
// waited for here (quiet is).
func (e *executor) idle() {
	working := workingOf(e.srv)
	if working == nil {
		return
	}
	defer e.spent.since(spentSettling, time.Now())
	deadline := time.After(targets.ClientTimeout)
	for {
		working, changed := working()
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

// workingOf is how srv says how many requests it is working on, nil if
// it does not.
func workingOf(srv targets.Server) func() (int, <-chan struct{}) {
	switch s := srv.(type) {
	case targets.ActivityReporter:
		return func() (int, <-chan struct{}) {
			working, _, changed := s.Activity()
			return working, changed
		}
	case targets.WorkReporter:
		return s.Working
	}
	return nil
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
	if workingOf(e.srv) != nil {
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
		op.Turn.Appends = e.profile.AppendsInput()
		op.Turn.Unstored = op.Send.NoStore
		op.Turn.Outcome = op.Response.Outcome
		op.Turn.Status = op.Response.Status
		if op.Response.NotFound() {
			// OpenAI's 400 previous_response_not_found is a 404 by another
			// name: what the server names is not found.
			op.Turn.Status = http.StatusNotFound
		}
		op.Turn.Reply = op.Response.Reply
		op.Turn.TimedOut = op.Response.TimedOut
		op.Turn.Open = op.Response.Open
		op.Turn.Replay, op.Turn.Replayed = op.Request.Replay, op.Request.Replay != nil
		op.Turn.ReplayForeign = op.Request.ReplayForeign
		op.Turn.Preempted = op.Response.Preempted
		op.Turn.Unsent = protocol.NotSent(op.Response.Cause)
		// Each protocol says how its refusals read (targets.Protocols).
		refusal := e.profile.Protocol.Info().Refusal
		op.Turn.AnyRefusal, op.Turn.RefusalSays = refusal != "", refusal
	}
	// A call of no request's goes with the first request that was sent.
	first := max(slices.IndexFunc(ops, func(op history.Op) bool { return !op.Turn.Unsent }), 0)
	for _, c := range calls {
		owner := first
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
		i := slices.IndexFunc(ops, func(op history.Op) bool { return ok && op.Send.Token != "" && op.Send.Token == user })
		if i >= 0 {
			ops[i].Turn.Runs = append(ops[i].Turn.Runs, r)
			continue
		}
		// A run of no turn of the step: one of an earlier step's, started
		// after that step ended. It goes with the step's first request,
		// whose turn the model judges it by (model.Turn.LateRuns).
		if ok && len(ops) > 0 {
			ops[first].Turn.LateRuns = append(ops[first].Turn.LateRuns, r)
		}
	}
}

// splitAuxiliary sets apart each turn's auxiliary calls, and learns their
// instructions (model.Turn.SplitAuxiliary), once the step has said how
// each turn ended: what an interrupted turn's first arrival was depends
// on it.
func (e *executor) splitAuxiliary(ops []history.Op) {
	for i := range ops {
		e.aux.add(ops[i].Turn.SplitAuxiliary(e.aux.has))
	}
}

// Spent says where the executor's wall time went so far, by what it
// waited on.
func (e *executor) Spent() map[string]time.Duration { return e.spent }
