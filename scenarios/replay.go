package scenarios

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/shrink"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// StopNotes splits err, as Check, Conform or Replay return it, into what
// is only a note (a server that exited on SIGTERM with a failure status,
// after serving everything asked of it) and the rest, which is an error.
func StopNotes(err error) (notes []string, rest error) {
	if err == nil {
		return nil, nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var errs []error
		for _, e := range j.Unwrap() {
			n, r := StopNotes(e)
			notes = append(notes, n...)
			errs = append(errs, r)
		}
		return notes, errors.Join(errs...)
	}
	if se := (*faults.StopError)(nil); errors.As(err, &se) {
		return []string{"the server did not stop cleanly: " + err.Error()}, nil
	}
	return nil, err
}

// Replay executes plans, in order, against a fresh server of target, and
// validates every step as a check does, without rapid's search: the same
// plans give the same steps, and, against a server that behaves the same
// way under them, the same verdict. Violations of the skipped invariants
// set their conversations aside, as in the run that found the failure. It
// stops at the first other violation and returns the history up to it and
// the violation (nil if none). The error says the replay could not be
// carried out.
func Replay(target targets.Target, plans []plan.Plan, skip ...model.Invariant) ([]history.Op, *model.Violation, error) {
	return ReplayFailure(target, &report.Failure{Plans: plans, Skipped: skip})
}

// ReplayFailure is Replay of a saved failure's plans, with what its run
// had set aside: the invariants it skipped, and the kinds of wrong state
// already found, whose violations set their conversations aside again.
func ReplayFailure(target targets.Target, f *report.Failure) ([]history.Op, *model.Violation, error) {
	for i, p := range f.Plans {
		if err := p.Check(); err != nil {
			return nil, nil, fmt.Errorf("step %d: %w", i+1, err)
		}
	}
	l, err := execute.Open(target, f.Skipped)
	if err != nil {
		return nil, nil, err
	}
	l.SkipKinds, l.Aux = f.SkippedKinds, execute.NewAuxInstructions(f.AuxInstructions)
	history, v, err := l.Replay(context.Background(), f.Plans)
	return history, v, errors.Join(err, l.Close())
}

// Replays is what up to n replays of a saved failure came to, each in a
// fresh session: a server that does not report its activity may run a
// burst in another interleaving, route a request to another replica, or
// end a held call otherwise, from one replay to the next.
type Replays struct {
	// Saved is the failure replayed.
	Saved *report.Failure
	// Tries is how many replays ran: up to the first that broke the saved
	// invariant.
	Tries int
	// Reproduced says a replay broke the saved invariant (any invariant,
	// for a saved failure that names none). History and Violation are
	// then that replay's; else those of the first replay that broke
	// another invariant; else the last one's, Violation nil.
	Reproduced bool
	History    []history.Op
	Violation  *model.Violation
	// Misses are the replays that did not break the saved invariant, in
	// order.
	Misses []Miss
	// Notes are what only a note says (StopNotes), from every replay.
	Notes []string
}

// Miss is a replay of a saved failure that did not break its invariant.
type Miss struct {
	// Try numbers the replay, from 1.
	Try     int
	History []history.Op
	// Violation is the other invariant it broke, nil if none.
	Violation *model.Violation
}

// ReplayFailureTries replays a saved failure (ReplayFailure) up to tries
// times, each in a fresh session, and stops at the first replay that
// breaks the saved invariant. turncheck tries shrink.ReproduceTries times
// unless told otherwise: as many as the shrinker replays a failing run's
// steps before it calls the failure flaky. It stops early, with ctx's
// error and what ran so far, once ctx ends between two replays. The error
// says a replay could not be carried out.
func ReplayFailureTries(ctx context.Context, target targets.Target, f *report.Failure, tries int) (*Replays, error) {
	if tries < 1 {
		return nil, fmt.Errorf("tries: %d; want at least 1", tries)
	}
	r := &Replays{Saved: f}
	for r.Tries < tries {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		h, v, err := ReplayFailure(target, f)
		notes, err := StopNotes(err)
		r.Notes = append(r.Notes, notes...)
		if err != nil {
			return r, err
		}
		r.Tries++
		if v != nil && (f.Violation == nil || v.Invariant == f.Violation.Invariant) {
			r.Reproduced, r.History, r.Violation = true, h, v
			return r, nil
		}
		r.Misses = append(r.Misses, Miss{Try: r.Tries, History: h, Violation: v})
		if r.Violation == nil {
			r.History, r.Violation = h, v
		}
	}
	return r, nil
}

// Differed says, for the replays that did not break the saved invariant,
// what each broke instead, if anything, and how it went otherwise than
// the saved run (shrink.Differences); replays that went the same way are
// said once. Empty: every replay broke the saved invariant.
func (r *Replays) Differed() string {
	var b strings.Builder
	if len(r.Saved.History) == 0 {
		b.WriteString("The saved file holds no history of the failing run to compare the replays with.\n")
	}
	type group struct {
		tries []int
		lines []string
	}
	var groups []group
	for _, m := range r.Misses {
		var lines []string
		if v := m.Violation; v != nil {
			lines = append(lines, fmt.Sprintf("broke %s (%s) instead, on conversation %s", v.Invariant, v.Invariant.Title(), v.Conv))
		}
		if len(r.Saved.History) > 0 {
			d := shrink.Differences(r.Saved.History, m.History)
			if len(d) == 0 && m.Violation == nil {
				// Nothing the history shows went otherwise: what the
				// server sent the model did.
				d = []string{"came to the same outcomes, model calls, replicas and order as the failing run; it differed in what the model was asked"}
			}
			lines = append(lines, d...)
		}
		if n := len(groups); n > 0 && slices.Equal(groups[n-1].lines, lines) {
			groups[n-1].tries = append(groups[n-1].tries, m.Try)
			continue
		}
		groups = append(groups, group{[]int{m.Try}, lines})
	}
	if len(groups) > 0 {
		b.WriteString("What differed from the saved run:\n")
	}
	for _, g := range groups {
		fmt.Fprintf(&b, "%s:\n", strings.ToUpper(triesLabel(g.tries)[:1])+triesLabel(g.tries)[1:])
		for _, l := range g.lines {
			fmt.Fprintf(&b, "  - %s\n", l)
		}
	}
	return b.String()
}

// triesLabel names a group of tries: "try 2", "tries 1 and 3", "tries 1,
// 2 and 3".
func triesLabel(tries []int) string {
	if len(tries) == 1 {
		return fmt.Sprintf("try %d", tries[0])
	}
	s := make([]string, len(tries))
	for i, t := range tries {
		s[i] = fmt.Sprint(t)
	}
	return "tries " + strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// NotReproduced says, for replays none of which broke the saved
// invariant, how many ran, what the saved run broke, and what differed:
// no verdict on the server, which the steps did not show wrong again,
// but neither a pass of the saved failure. The caller says how to try
// more.
func (r *Replays) NotReproduced() string {
	saved := "the saved failure"
	if v := r.Saved.Violation; v != nil {
		saved = fmt.Sprintf("the saved failure, %s (%s),", v.Invariant, v.Invariant.Title())
	}
	what := "no invariant"
	if r.Violation != nil {
		what = "another invariant, not the saved one"
	}
	return fmt.Sprintf("NOT REPRODUCED: %s did not break again in %d %s of its %d step(s), each in a fresh session "+
		"(%s broke %s).\n"+
		"A server that does not report its activity may run a burst in another interleaving, route a request to another\n"+
		"replica, or end a held call otherwise, from one replay to the next; or the bug is fixed.\n%s",
		saved, r.Tries, plural(r.Tries, "try", "tries"), len(r.Saved.Plans), plural(r.Tries, "it", "they"), what, r.Differed())
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
