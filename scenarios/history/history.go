// Package history records what a run did: an Op is one request as it was
// planned, sent and answered, with the model calls that carry its token; a
// run's history is its ops, in order.
package history

import (
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/protocol"
)

// Op is one request of a run as its history records it: what was planned
// and sent, what the client learned, and what the model saw of it.
type Op struct {
	// Step numbers the plan it belongs to, from 1; Index is its place in
	// that plan's Sends (the client that sent it, in a burst).
	Step  int `json:"step"`
	Index int `json:"index"`
	// Action is the state-machine action that drew the plan.
	Action string    `json:"action"`
	Send   plan.Send `json:"send"`
	// Request is the request exactly as sent.
	Request  protocol.Request  `json:"request"`
	Response protocol.Response `json:"response"`
	// Turn is the operation as the reference model reads it: outcome,
	// attributed model calls, and when it was sent and answered on the
	// run's timeline.
	Turn model.Turn `json:"turn"`
	// Restart is set for the op of a restart plan, which sends nothing:
	// Response.Detail then says how the restart went.
	Restart *plan.Restart `json:"restart,omitempty"`
	// Net says what became of the send's network fault (plan.Send.Net):
	// NetBroken once the link was broken while the model held the turn,
	// what went wrong if it could not be, "" if the turn never reached
	// the model (or has no such fault).
	Net string `json:"net,omitempty"`
	// Served is, behind a front (which picks the replica a request goes
	// to), the replica that served the turn, as its model calls showed;
	// nil where none reached the model, or the harness picked.
	Served *int `json:"served,omitempty"`
	// HarnessError says what the harness itself failed to do for the op
	// (targets.ErrHarness: a proxy of its own that could not listen again
	// after a restart), "" if nothing: not the server's doing, and so
	// never judged; the run stops with it as an error.
	HarnessError string `json:"harnessError,omitempty"`
}

// NetBroken is Op.Net for a network fault that held from the turn's
// first model call to the request's end; NetNotHealed follows it where
// the link could not be healed after, with why.
const (
	NetBroken    = "broken while the turn was in flight"
	NetNotHealed = "; not healed: "
)
