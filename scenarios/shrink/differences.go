package shrink

import (
	"fmt"
	"slices"
	"strings"

	"github.com/turncheck/turncheck/scenarios/history"
)

// Differences lists the ways a replay of a failing run's steps went
// otherwise than the failing run, the first of each kind, in the failing
// run's order: that it ended sooner; a request that came to another
// outcome or status, reached the model another number of times, ended
// another way while the model held it (dropped by its client, detached,
// unanswered, ...), was served by another replica, or whose network fault
// came to something else; a burst whose requests were answered in
// another order. A person reads there what the server does not do the
// same way twice: each kind is one a server that does not report its
// activity may vary. Empty: none of these differed.
func Differences(failing, replay []history.Op) []string {
	byPlace := map[[2]int]history.Op{}
	for _, op := range replay {
		byPlace[[2]int{op.Step, op.Index}] = op
	}
	var out []string
	seen := map[string]bool{}
	add := func(kind, line string) {
		if !seen[kind] {
			seen[kind] = true
			out = append(out, line)
		}
	}
	for _, a := range failing {
		b, ok := byPlace[[2]int{a.Step, a.Index}]
		if !ok {
			add("ended", fmt.Sprintf("the replay ended before step %d", a.Step))
			continue
		}
		where := place(a)
		if a.Response.Outcome != b.Response.Outcome || a.Response.Status != b.Response.Status {
			add("outcome", fmt.Sprintf("%s: the failing run got %s, the replay %s", where, answer(a), answer(b)))
		}
		if len(a.Turn.Calls) != len(b.Turn.Calls) {
			add("calls", fmt.Sprintf("%s: the request reached the model %d time(s) in the failing run, %d in the replay",
				where, len(a.Turn.Calls), len(b.Turn.Calls)))
		}
		if x, y := howEnded(a), howEnded(b); x != y {
			add("held", fmt.Sprintf("%s: the turn %s in the failing run, %s in the replay", where, x, y))
		}
		if x, y := servedBy(a), servedBy(b); x != y {
			add("served", fmt.Sprintf("%s: served by %s in the failing run, by %s in the replay", where, x, y))
		}
		if a.Net != b.Net {
			add("net", fmt.Sprintf("%s: its network fault was %q in the failing run, %q in the replay", where, a.Net, b.Net))
		}
	}
	for step := range stepsOf(failing) {
		if x, y := returnOrder(failing, step), returnOrder(replay, step); len(y) > 0 && !slices.Equal(x, y) {
			add("order", fmt.Sprintf("at step %d: its requests were answered in the order %v in the failing run, %v in the replay",
				step, x, y))
		}
	}
	return out
}

// place names an op for a person: its step, and, for a request, its
// place in the step, conversation and new message.
func place(op history.Op) string {
	if op.Restart != nil {
		return fmt.Sprintf("at step %d (%s)", op.Step, op.Restart)
	}
	what := string(op.Send.Token)
	if what == "" {
		what = "no new user message"
	}
	return fmt.Sprintf("at step %d, request %d (%s, %s)", op.Step, op.Index+1, op.Send.Conv.ID, what)
}

// howEnded says how an op's turn ended beside its outcome: what a turn
// the model held may come to on one run and not on the next.
func howEnded(op history.Op) string {
	t := op.Turn
	var how []string
	for _, c := range []struct {
		set  bool
		what string
	}{
		{t.Interrupted, "was dropped by its client while the model held it"},
		{t.Abandoned, "was left by its client when the client's time ran out"},
		{t.Detached, "ran on after its client left"},
		{t.TimedOut, "got no answer within the client's time"},
		{t.Open, "was left open by the server"},
		{t.WaitedOut, "was answered only after the model timeout"},
		{t.InTakeover, "was sent within the takeover bound after a kill under its conversation"},
		{t.Gateway, "got a front's gateway status"},
	} {
		if c.set {
			how = append(how, c.what)
		}
	}
	if len(how) == 0 {
		return "ended plainly"
	}
	return strings.Join(how, ", ")
}

// servedBy names the replica that served op, as its model calls showed.
func servedBy(op history.Op) string {
	if op.Served == nil {
		return "no replica seen"
	}
	return fmt.Sprintf("replica %d", *op.Served)
}
