package execute

import (
	"slices"
	"time"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// What the harness does with a request the model holds, in one place: how
// it lets it (an abort, a deadline, an answer), and how it lets go of a
// turn whose client it dropped (PROTOCOL.md, T10 and "Time").

// let does what s says with its held call: abort the request, time the
// call out at the server's deadline, or let it go on.
func (e *executor) let(s plan.Send, f *flight) {
	f.acted = true
	switch dc, ok := e.srv.(targets.DeadlineController); {
	case s.Abort:
		f.runsOn = e.runsOn(s)
		if !f.runsOn {
			// From now on the model answers nothing of the turn: what the
			// server does about the disconnect, not how fast, is judged.
			e.fake.Drop(s.Token)
			f.dropped = e.tick()
		}
		f.cancel()
		f.interrupted, f.abortedAt = true, time.Now()
		if f.runsOn {
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

// stopping reports whether f is a dropped turn the harness still holds
// for: it has not been let go, and its server has not yet said it saw the
// disconnect (a DisconnectReporter) or, for one that does not say, given
// up on all the model holds of it.
func (e *executor) stopping(f *flight) bool {
	if !f.interrupted || f.released != 0 || f.runsOn {
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
	released := false
	for _, f := range flights {
		if !e.stopping(f) {
			continue
		}
		// A server says it saw the disconnect (a DisconnectReporter), or
		// tells its client it stopped the turn (A2A's canceled, ACP's
		// cancelled): either way, what it still waits on is its own.
		done := reports && dr.DoneWith(f.tag) || f.told.Load()
		if done && f.doneAt.IsZero() {
			f.doneAt = time.Now()
		}
		switch {
		case done && (e.fake.HoldingTurn(f.tok) == 0 || time.Since(f.doneAt) >= answerAfterDone):
			// It saw the disconnect: what it still holds a moment later it
			// holds on a context the disconnect does not end.
		case time.Since(f.abortedAt) >= e.stopBound():
		default:
			continue
		}
		f.released = e.tick()
		for _, g := range f.gates {
			g.Release()
		}
		e.fake.ReleaseDrop(f.tok)
		released = true
	}
	return released
}

// awaitStop waits until no dropped turn of flights is held for: each
// server gave up on what the model holds of its turn, or was let go of
// (releaseDropped).
func (e *executor) awaitStop(flights []*flight) {
	if !slices.ContainsFunc(flights, e.stopping) {
		return
	}
	defer e.spent.since(spentStopping, time.Now())
	for slices.ContainsFunc(flights, e.stopping) {
		if e.ctx != nil && e.ctx.Err() != nil {
			return
		}
		if !e.releaseDropped(flights) {
			time.Sleep(pollInterval)
		}
	}
}

// answerAfterDone is how long after a server said it saw a disconnect the
// model still holds a call of the turn it has not given up on, before the
// harness answers it: a call made under the turn's context is given up on
// at once, and answering it before would race the server's own end of
// it, and make a replay differ. The server has seen the disconnect by
// then, so whatever it starts after is its own doing: this decides only
// when a bug shows, never a verdict on a server that stops.
const answerAfterDone = 300 * time.Millisecond

// stopBound is how long the model holds what a dropped turn's server
// waits on, for a server that does not say when it saw the disconnect,
// before the harness lets go of it: longer than the server's own model
// timeout, at which a server that does not pass the disconnect on gives
// up by itself. It only ever decides when what the server does next is
// seen (PROTOCOL.md, "Time").
func (e *executor) stopBound() time.Duration {
	return e.profile.ModelTimeoutOrDefault() + stopMargin
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
