// Package history records what a run did: an Op is one request as it was
// planned, sent and answered, with the model calls that carry its token; a
// run's history is its ops, in order.
package history

import (
	"regexp"
	"slices"

	"github.com/turncheck/turncheck/faults"
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
	// Action is the state-machine action that drew the plan, and
	// Earlier the plan's origin: an earlier check's step, run before the
	// failing check's (plan.Plan.Earlier), or zero for its own.
	Action  string      `json:"action"`
	Earlier plan.Origin `json:"earlier,omitzero"`
	Send    plan.Send   `json:"send"`
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

// ForeignFrom are the tags of the other checks whose messages op showed
// (model.OtherChecks), each once, in the order met: in a model call of
// its turn, in what an ACP session/load replayed before it, in an A2A
// task's history read back. They name the earlier checks whose steps a
// leak replays after.
func (op Op) ForeignFrom() []string {
	var out []string
	add := func(tags []string) {
		for _, t := range tags {
			if !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	add(op.Request.ReplayForeignFrom)
	for _, calls := range [2][]model.Call{op.Turn.Calls, op.Turn.Aux} {
		for _, c := range calls {
			add(c.ForeignFrom)
		}
	}
	add(op.Response.ForeignFrom)
	return out
}

// NetBroken is Op.Net for a network fault that held from the turn's
// first model call to the request's end; NetNotHealed follows it where
// the link could not be healed after, with why.
const (
	NetBroken    = "broken while the turn was in flight"
	NetNotHealed = "; not healed: "
)

// FaultReached reports whether op's fault took effect: a network fault
// whose link broke while the turn was in flight, a client abort made
// while the model held the turn at its point, a model fault on a turn
// that made the model call of its tool loop the fault hits.
func (op Op) FaultReached() bool {
	switch s := op.Send; {
	case s.Net != nil:
		return op.Net == NetBroken
	case s.Abort:
		return op.Turn.Interrupted || op.Turn.Detached
	case s.Fault.Kind != faults.None:
		for _, c := range op.Turn.Calls {
			if callRound(s.Token, c) >= s.Fault.Round {
				return true
			}
		}
	}
	return false
}

// callRound is the call of turn tok's tool loop c is: how many of the
// turn's tool rounds it carries results of (0 for the first call).
func callRound(tok model.Token, c model.Call) int {
	round := 0
	for _, e := range c.Tools {
		if e.Kind != model.ToolAnswered {
			continue
		}
		if user, r, ok := model.ToolTurn(e.ID); ok && user == tok {
			round = max(round, r)
		}
	}
	return round
}

// counts are the numbers in an action's name ("burst of 3"), which do not
// change what the action is.
var counts = regexp.MustCompile(`[0-9]+`)

// plainTurns are the actions that send one turn with a new user message,
// which differ only in where: a trigger does not tell them apart.
var plainTurns = []string{"new conversation", "continue", "one request", "same id, other key"}

// Drawn names what op carried out, in a vocabulary that is the same for
// every run and seed: its action ("action: invalid continuation: blank
// last user message"; a burst's size as N; one turn of a new user message
// "action: turn", whichever action sent it), and the fault that took
// effect on it, if any ("fault: model-error"). A run counts them
// (report.Stats.Drawn), and a baseline's finding keeps those that set it
// off as its trigger (Trigger): a finding is fixed only in a run that drew
// its trigger.
func (op Op) Drawn() []string {
	action := counts.ReplaceAllString(op.Action, "N")
	if slices.Contains(plainTurns, action) {
		action = "turn"
	}
	out := []string{"action: " + action}
	if k := op.Send.FaultKind(); k != "" && op.FaultReached() {
		out = append(out, "fault: "+k)
	}
	return out
}

// Trigger is what set off the failure whose steps are ops (Op.Drawn),
// each once, sorted: the action of the request that showed it (the last),
// every restart and crash, and every fault that took effect. The plain
// turns between them are left out: any run draws those, in any number.
func Trigger(ops []Op) []string {
	var out []string
	for i, op := range ops {
		drawn := op.Drawn()
		if i < len(ops)-1 && op.Restart == nil {
			drawn = drawn[1:] // its fault only
		}
		out = append(out, drawn...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Title is what the step that starts at ops[i] does, said from the steps
// before it in ops: the action that drew it, where that still fits. A
// shrunk failure keeps a step whose action no longer does: a "retry
// failed turn" whose failed attempt was shrunk away, or that ended
// otherwise on replay; a "same id, other key" with no other key's
// conversation left; a "continue" of a conversation no step before it
// started.
func Title(ops []Op, i int) string {
	op := ops[i]
	// Only its own check's steps: names repeat between checks.
	before := slices.DeleteFunc(slices.Clone(ops[:i]), func(o Op) bool { return o.Earlier != op.Earlier })
	onConv := slices.ContainsFunc(before, func(o Op) bool { return o.Send.Conv == op.Send.Conv && o.Restart == nil })
	switch op.Action {
	case "retry failed turn":
		if slices.ContainsFunc(before, func(o Op) bool { return o.Send.Token == op.Send.Token && o.Turn.Outcome == model.Fail }) {
			return op.Action
		}
		for _, o := range slices.Backward(before) {
			if o.Send.Token == op.Send.Token && o.Send.Token != "" {
				return "the same message again, after a turn that ended " + o.Turn.Outcome.String()
			}
		}
	case "same id, other key":
		if slices.ContainsFunc(before, func(o Op) bool {
			return o.Send.Conv.ID == op.Send.Conv.ID && o.Send.Conv.Key != op.Send.Conv.Key && o.Restart == nil
		}) {
			return op.Action
		}
	case "continue":
		if onConv {
			return op.Action
		}
	default:
		return op.Action
	}
	if onConv {
		return "continue"
	}
	return "new conversation"
}
