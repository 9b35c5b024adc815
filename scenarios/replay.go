package scenarios

import (
	"context"
	"errors"
	"fmt"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/report"
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
	l.SkipKinds = f.SkippedKinds
	history, v, err := l.Replay(context.Background(), f.Plans)
	return history, v, errors.Join(err, l.Close())
}
