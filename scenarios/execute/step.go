package execute

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/protocol"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// step is one plan being carried out: its requests in flight and what
// became of each. A step sends (send), drives what the model holds in the
// order the plan says (drive: a crash, a broken link, a later point, an
// abort or a deadline, each in a method of its own), then lets go of what
// is still held and records the history (end).
type step struct {
	e       *executor
	p       plan.Plan
	start   int64 // the clock when the step began
	ops     []history.Op
	flights []*flight
	// wake is poked when a request ends or arrives where the model holds
	// it.
	wake chan struct{}
	wg   sync.WaitGroup
	// crashed is the restart of a plan that crashes the server with a
	// turn in flight; it comes after the turns in the history.
	crashed *history.Op
	// heal undoes the network fault of the send at index broken, once its
	// link is broken.
	heal   func() error
	broken int
}

// execute sends p's requests and returns what each came to, with the model
// calls attributed to each by the token of its last user message.
func (e *executor) execute(p plan.Plan) []history.Op {
	e.steps++
	if p.Restart != nil && len(p.Sends) == 0 {
		return []history.Op{e.restart(p, e.steps, 0)}
	}
	s := &step{e: e, p: p, start: e.clock.Load(), ops: make([]history.Op, len(p.Sends)),
		flights: make([]*flight, len(p.Sends)), wake: make(chan struct{}, 1), broken: -1}
	s.script()
	s.send()
	s.drive()
	s.wg.Wait()
	s.end()
	if p.Restart != nil {
		if s.crashed == nil {
			// The turn ended before its call was held (refused, say): the
			// crash comes after it.
			op := e.restart(p, e.steps, len(p.Sends))
			s.crashed = &op
		}
		s.ops = append(s.ops, *s.crashed)
	}
	return s.ops
}

// poke says something changed: a request ended, or arrived where the
// model holds it.
func (s *step) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// watch marks f arrived when the model holds it at its gate.
func (s *step) watch(f *flight) {
	g := f.gate
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-g.Arrived():
			f.arrived.Store(true)
			s.poke()
		case <-f.done:
		}
	}()
}

// script makes a flight of each send, and tells the model what to do with
// its turn and where to hold it.
func (s *step) script() {
	e := s.e
	_, reportsGone := e.srv.(targets.DisconnectReporter)
	_, reportsParked := e.srv.(targets.ParkReporter)
	for i, send := range s.p.Sends {
		f := &flight{done: make(chan struct{}), tok: send.Token}
		if reportsGone || reportsParked {
			f.tag = fmt.Sprintf("%d-%d", e.steps, i)
		}
		s.flights[i] = f
		if send.Token == "" {
			continue
		}
		e.fake.ScriptReply(send.Token, faults.Reply{Rounds: send.Rounds, Fault: send.Fault})
		f.gate = e.fake.Gate(send.Token)
		f.gates = []*faults.Gate{f.gate}
		if later, ok := laterPoint(send); ok {
			f.later = e.fake.HoldAt(send.Token, later)
			f.gates = append(f.gates, f.later)
		}
	}
}

// send sends each request in turn, each once those before it have come to
// rest.
func (s *step) send() {
	e := s.e
	for i, send := range s.p.Sends {
		f := s.flights[i]
		send = e.client.Resolve(send)
		base := cmp.Or(e.ctx, context.Background())
		ctx, cancel := context.WithCancel(base)
		f.cancel = cancel
		req := e.client.NewRequest(ctx, send)
		req.Tag = f.tag
		req.Stopped = func() { f.told.Store(true) }
		if req.Waits != nil {
			f.waits, f.goes = req.Waits, make(chan struct{})
			req.Goes = f.goes
			go func() {
				// What it waits on moving is a change to settle for.
				select {
				case <-f.waits:
					s.poke()
				case <-f.done:
				}
			}()
		}
		op := &s.ops[i]
		*op = history.Op{Step: e.steps, Index: i, Action: s.p.Action, Send: send, Request: req}
		op.Turn.Invoke = e.tick()
		op.Turn.InTakeover = e.inTakeover(send.Conv, time.Now())
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			sent := time.Now()
			op.Response = e.client.Send(ctx, req)
			if sent := op.Response.Sent; sent != nil {
				// Held back until it could go, and completed then.
				op.Request, op.Response.Sent = *sent, nil
			}
			if op.Response.Cause == protocol.CauseAborted && base.Err() != nil {
				// Not an abort the plan drew: the run ended with it open.
				op.Response.Cause = protocol.CauseRunEnded
			}
			op.Turn.Return = e.tick()
			if op.Response.SaysStopped() {
				f.told.Store(true)
			}
			// Wall time only ever excuses: a refusal after this long may
			// be a bounded wait ending (T4).
			op.Turn.WaitedOut = time.Since(sent) >= e.profile.QueueTimeoutOrDefault()
			f.ended = time.Now()
			close(f.done)
			s.poke() // after done: a wake-up must find the change it announces
		}()
		if f.gate != nil {
			s.watch(f)
		}
		e.settle(s.flights[:i+1], s.wake)
	}
}

// drive acts on each held request, in the order the plan releases them,
// until every one of them has ended.
func (s *step) drive() {
	for {
		s.e.settle(s.flights, s.wake)
		next := -1
		all := true
		for _, i := range s.p.Release {
			if !s.flights[i].finished() {
				all = false
			}
			if next < 0 && s.flights[i].held() {
				next = i
			}
		}
		switch {
		case all:
			return
		case next < 0:
			// Nothing is held: a request is on its way (to the model, or
			// out of a queue); wait for it to come to rest. A dropped
			// turn whose server still waits on what the model holds of
			// it keeps the others queued: its calls are let go once the
			// server is known to have seen the disconnect, or at the
			// bound (releaseDropped).
			if !s.e.releaseDropped(s.flights) {
				s.e.waitChange(s.wake, s.e.dropWait(s.flights))
			}
		case s.p.Restart != nil && s.crashed == nil:
			s.crash(next)
		default:
			s.act(next)
		}
	}
}

// crash kills the server while the model holds the turn of send i: the
// server dies with the turn in flight, and the client never learns its
// outcome.
func (s *step) crash(i int) {
	s.flights[i].acted = true
	if s.p.Restart.Crash {
		s.e.killedUnder(s.p.Sends)
	}
	op := s.e.restart(s.p, s.e.steps, len(s.p.Sends))
	s.crashed = &op
}

// act does what the plan says with the held request of send i: breaks its
// link, takes it on to a later point, or lets it (an abort, a deadline,
// an answer).
func (s *step) act(i int) {
	send, f := s.p.Sends[i], s.flights[i]
	if send.Net != nil && s.ops[i].Net == "" {
		// The turn is in flight, its replica holding the conversation:
		// the link breaks now, and stays broken until the request ends.
		s.heal, s.ops[i].Net = s.e.breakLink(send)
		s.broken = i
	}
	if f.later != nil {
		// The turn goes on to the point where the client drops it, or
		// the server's deadline passes.
		f.gate.Release()
		f.gate, f.later = f.later, nil
		f.arrived.Store(false)
		s.watch(f)
		return
	}
	s.e.let(send, f)
}

// end heals what the step broke, reads what a front answered, lets go of
// what the model still holds, and records what each request came to.
func (s *step) end() {
	e := s.e
	if s.heal != nil {
		if err := s.heal(); err != nil {
			s.ops[s.broken].Net += history.NetNotHealed + err.Error()
		}
	}
	if targets.Fronted(e.srv) {
		s.fronted()
	}
	for _, f := range s.flights {
		f.cancel()
		if !f.waitingOut.IsZero() {
			e.spent[spentTimeouts] += f.ended.Sub(f.waitingOut)
		}
	}
	s.letGo()
	e.attribute(s.ops, e.fake.CallsAfter(s.start), e.fake.RunsAfter(s.start))
	for i, f := range s.flights {
		switch {
		case !f.interrupted && !s.ops[i].Response.Cancelled && s.ops[i].Response.TimedOut && e.profile.Protocol != targets.ACP:
			// The client's own time ran out, and it closed the connection
			// (an ACP client cancels its prompt instead, below): the
			// server saw its client go, at a point the harness did not
			// choose. It stops the turn as it stops any (T10), or, under
			// complete or as an A2A agent whose tasks outlive their
			// connection, runs it on; either way it may have committed the
			// turn before it saw the client go.
			if e.runsOnDisconnect() {
				s.ops[i].Turn.Detached = true
			} else {
				s.ops[i].Turn.Abandoned = true
			}
		case s.ops[i].Response.Preempted && e.profile.Supersede:
			// Superseded by another prompt of its session, as the agent
			// declares it does: an interruption the agent chose, judged by
			// the interruption policy (T10), with no stop to judge; also
			// where the harness was about to drop it, and the agent
			// answered first.
			s.ops[i].Turn.Preempted = false
			if e.profile.Interruption == targets.Complete {
				s.ops[i].Turn.Detached = true
			} else {
				s.ops[i].Turn.Interrupted = true
			}
		case !f.interrupted && !s.ops[i].Response.Cancelled:
			// A turn the client cancelled itself (ACP's session/cancel,
			// at the end of its time or with another prompt of the
			// session) is interrupted as one the plan dropped is, though
			// the model did not hold it for the cancel: from its cancel on
			// nothing of it was to stay, whatever the agent answered.
		case e.profile.Interruption == targets.Complete || (f.runsOn || s.ops[i].Response.RanOn) && !s.ops[i].Response.Cancelled:
			// The server runs the turn on: an unknown outcome, not a stop.
			s.ops[i].Turn.Detached = true
		default:
			s.ops[i].Turn.Interrupted = true
			s.ops[i].Turn.Dropped, s.ops[i].Turn.Released = f.dropped, f.released
			s.ops[i].Turn.ReleasedAfter = f.releasedAfter
			if !e.profile.Supersede {
				// Until its client left, it held its conversation: an
				// agent that supersedes lets the next prompt take over.
				s.ops[i].Turn.Held = f.dropped
			}
			if at, after, ok := e.fake.CarriedOn(f.tok); ok {
				s.ops[i].Turn.CarriedOn, s.ops[i].Turn.CarriedAfter = at, after
			}
		}
	}
	e.splitAuxiliary(s.ops)
	for _, send := range s.p.Sends {
		if send.Token != "" {
			// A fault is for this step only: a server that later replays
			// this message (a bug the harness must report, not hang on)
			// gets a reply.
			e.fake.Forget(send.Token)
		}
	}
}

// fronted reads what a front before the replicas answered for each
// request, and which replica served it.
func (s *step) fronted() {
	for i := range s.ops {
		op := &s.ops[i]
		lost := s.crashed != nil ||
			op.Send.Net != nil && op.Send.Net.Link == targets.ClientLink && strings.HasPrefix(op.Net, history.NetBroken)
		frontAnswered(&op.Response, lost)
		status := op.Response.Status
		op.Turn.Gateway = status == http.StatusBadGateway || status == http.StatusGatewayTimeout
		if r, ok := s.e.fake.ServedBy(op.Send.Token); ok && op.Send.Token != "" {
			op.Served = &r
		}
	}
}

// letGo lets go of everything the model still holds for the step, once
// the server is at rest. A dropped turn is let go of only once its server
// gave up on what the model holds of it, said it saw the disconnect, or
// had the whole bound: never after a grace a slow machine could outlast.
// What the server then does after its client left is what T10 judges:
// it is waited for.
func (s *step) letGo() {
	e := s.e
	e.awaitStop(s.flights)
	e.idle()
	for _, f := range s.flights {
		for _, g := range f.gates {
			// A server that did not pass a deadline on to the model
			// still holds the call (or the tool run): answer it, so that
			// what the server does with the answer shows, rather than a
			// stall.
			g.Release()
		}
		if f.interrupted && !f.runsOn {
			if f.released == 0 {
				// The server gave up on all the model held of the turn:
				// what it starts from now on, it starts after that, but
				// for the turn's own call on its way where what it gave
				// up on was only a call made beside the turn (a title).
				f.released, f.releasedAfter = e.tick(), e.fake.GaveUpOn(f.tok)
			}
			e.fake.ReleaseDrop(f.tok)
		}
	}
	if slices.ContainsFunc(s.flights, func(f *flight) bool { return f.interrupted }) {
		e.idle()
		e.quiet()
	}
}
