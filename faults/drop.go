package faults

import "github.com/turncheck/turncheck/model"

// A turn whose client went away is judged by what its server does, never
// by how fast it does it (PROTOCOL.md, T10 and "Time"). From the moment
// the harness drops the client (Drop), the model answers nothing of the
// turn: each call or lookup of it that arrives is held, unanswered, as
// the one the client dropped it at is, until the server gives up on it or
// the harness lets the turn go (ReleaseDrop). A server that stops gives
// up on what it waits for, at whatever speed the machine allows, and
// starts nothing more. One that starts a call or lookup of the turn after
// the drop, with nothing answered since, gave up on what it waited for and
// carried the turn on.

// drop is what the model holds of a turn whose client went away.
type drop struct {
	// released: the harness let the turn go; later arrivals are answered.
	released bool
	// gates hold the arrivals since the drop.
	gates []*Gate
}

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

// dropGateLocked is the gate a call or lookup of tok that arrives now is
// held at because its client went away, nil if it is not to be held;
// m.mu is held.
func (m *Model) dropGateLocked(tok model.Token) *Gate {
	d := m.dropped[tok]
	if d == nil || d.released || tok == "" {
		return nil
	}
	g := newGate(tok)
	d.gates = append(d.gates, g)
	m.holding[g] = true
	return g
}

// HoldingTurn is how many calls and lookups of tok's turn the model holds
// now, at its gates or since Drop.
func (m *Model) HoldingTurn(tok model.Token) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for g := range m.holding {
		if g.tok != tok {
			continue
		}
		select {
		case <-g.release:
		default:
			n++
		}
	}
	return n
}
