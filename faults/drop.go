package faults

import (
	"slices"

	"github.com/turncheck/turncheck/model"
)

// A turn whose client went away is judged by what its server does, never
// by how fast it does it (PROTOCOL.md, T10 and "Time"). From the moment
// the harness drops the client (Drop), the model answers nothing of the
// turn: each call or lookup of it that arrives is held, unanswered, as
// the one the client dropped it at is, until the server gives up on it or
// the harness lets the turn go (ReleaseDrop). A server that stops gives
// up on what it waits for, at whatever speed the machine allows, and
// starts nothing more. One that starts a call or lookup of the turn after
// it gave up on one the model held, with nothing answered since, carried
// the turn on (CarriedOn). A call or lookup that arrives after the drop
// with the held ones still waited on is one the server had on its way
// (a round's lookups run at once, a title call): it is held, and judged
// by nothing but what follows. Which arrivals the server had given up on
// is kept with CarriedOn: one that gave up only on a call made beside the
// turn (a title) may have had the turn's own call on its way, and the
// harness learns which calls are such only once the turn is over
// (model.Turn.SplitAuxiliary).

// drop is what the model holds of a turn whose client went away.
type drop struct {
	// released: the harness let the turn go; later arrivals are answered.
	released bool
	// gates hold the arrivals since the drop.
	gates []*Gate
	// gaveUpOn are when the calls and lookups held for the turn that the
	// server gave up on arrived; carriedOn is when the first arrival after
	// a give-up came, 0 if none, and carriedAfter the give-ups before it.
	gaveUpOn     []int64
	carriedOn    int64
	carriedAfter []int64
}

// connKey is the context key of a request's connection (ConnContext).
type connKey struct{}

// Drop says the client of tok's turn went away: from now on, every call
// and lookup of tok that arrives is held, unanswered, until the server
// gives up on it or ReleaseDrop(tok). Gates already set for tok keep
// holding what they hold.
func (m *Model) Drop(tok model.Token) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dropped[tok] == nil {
		m.dropped[tok] = &drop{}
	}
}

// ReleaseDrop lets go of what the model holds of tok's turn since Drop,
// and answers what arrives of it from now on.
func (m *Model) ReleaseDrop(tok model.Token) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.releaseDropLocked(tok)
}

func (m *Model) releaseDropLocked(tok model.Token) {
	d := m.dropped[tok]
	if d == nil {
		return
	}
	d.released = true
	for _, g := range d.gates {
		g.Release()
	}
	d.gates = nil
}

// dropGateLocked is the gate a call or lookup of tok that arrives now, at
// at on the model's timeline, is held at because its client went away,
// nil if it is not to be held; m.mu is held. It notes an arrival after the
// server gave up on one the model held (CarriedOn): the request the
// server gave up on has its connection closed by then, so the give-up
// shows here even before the model's handler of it has seen it end.
func (m *Model) dropGateLocked(tok model.Token, at int64) *Gate {
	d := m.dropped[tok]
	if d == nil || d.released || tok == "" {
		return nil
	}
	if d.carriedOn == 0 {
		if gaveUp := append(slices.Clone(d.gaveUpOn), m.heldClosedLocked(tok)...); len(gaveUp) > 0 {
			slices.Sort(gaveUp)
			d.carriedOn, d.carriedAfter = at, slices.Compact(gaveUp)
		}
	}
	g := newGate(tok)
	g.at = at
	d.gates = append(d.gates, g)
	m.holding[g] = true
	return g
}

// heldClosedLocked is when the calls and lookups of tok the model holds
// whose connection the server closed arrived; m.mu is held.
func (m *Model) heldClosedLocked(tok model.Token) []int64 {
	var out []int64
	for g := range m.holding {
		if g.tok == tok && g.conn != nil && peerClosed(g.conn) {
			out = append(out, g.at)
		}
	}
	return out
}

// gaveUp notes that the server gave up on what g held.
func (m *Model) gaveUp(g *Gate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d := m.dropped[g.tok]; d != nil {
		d.gaveUpOn = append(d.gaveUpOn, g.at)
	}
}

// CarriedOn is when, on the model's timeline, the first call or lookup of
// tok's turn arrived after the server gave up on one the model held for it
// since Drop(tok), with nothing of the turn answered in between, and
// after, when the ones it had given up on by then arrived; ok is false if
// none did.
func (m *Model) CarriedOn(tok model.Token) (at int64, after []int64, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d := m.dropped[tok]; d != nil && d.carriedOn != 0 {
		return d.carriedOn, slices.Clone(d.carriedAfter), true
	}
	return 0, nil, false
}

// GaveUpOn is when the calls and lookups of tok's turn the model held for
// it since Drop(tok), and the server gave up on, arrived, in order.
func (m *Model) GaveUpOn(tok model.Token) []int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.dropped[tok]
	if d == nil {
		return nil
	}
	out := slices.Clone(d.gaveUpOn)
	slices.Sort(out)
	return slices.Compact(out)
}

// HoldingTurn is how many calls and lookups of tok's turn the model holds
// now, at its gates or since Drop.
func (m *Model) HoldingTurn(tok model.Token) int {
	return m.holdingOf(func(g *Gate) bool { return g.tok == tok })
}
