package report

import (
	"time"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
)

// Result is what a Check found.
type Result struct {
	Stats
	// Seed is the seed the run started from.
	Seed uint64
	// Elapsed is the run's wall time, shrinking included.
	Elapsed time.Duration
	// Failure is nil when no invariant was broken.
	Failure *Failure
}

// Failure is a broken invariant, shrunk to a short sequence of steps. It
// is data: the plans replay it, the history shows it, and every report is
// rendered from it.
type Failure struct {
	// Violation is the broken invariant, as seen in the shrunk run; nil if
	// the failure was not a violation (a panic in the harness).
	Violation *model.Violation `json:"violation"`
	// Plans are the shrunk run's steps, as drawn, and History what each of
	// their requests came to.
	Plans   []plan.Plan  `json:"plans"`
	History []history.Op `json:"history"`
	// Seed replays the failing run as the first check of a Check.
	Seed uint64 `json:"seed"`
	// Check is the number of the check that failed, from 1, in the whole
	// run (its shards share the numbers).
	Check int `json:"check,omitempty"`
	// FoundAfter is how many checks of the run ran until the violation,
	// that one included, and FoundIn how long that took: both count from
	// the run's start, so that in a Conform a later finding counts the
	// checks, and the shrinking, of the findings before it too.
	FoundAfter int           `json:"foundAfterChecks"`
	FoundIn    time.Duration `json:"-"` // foundInMs in JSON
	// ShrinkRuns is how many candidate runs the shrinker replayed, and
	// ShrunkIn how long shrinking took.
	ShrinkRuns int           `json:"shrinkRuns"`
	ShrunkIn   time.Duration `json:"-"` // shrunkInMs in JSON
	// Shrink says how far shrinking got: Shrunk (the search ran to its
	// end, no smaller candidate broke the invariant on any of the tries
	// it needed, and the steps broke it again when confirmed),
	// PartlyShrunk (short of that, but smaller than the failing run) or
	// NotShrunk (the failing run's own steps, or the failure did not
	// reproduce). ShrinkNote says what it rests on: how many candidates
	// were tried how often, and what kept it from Shrunk.
	Shrink     ShrinkState `json:"shrink,omitempty"`
	ShrinkNote string      `json:"shrinkNote,omitempty"`
	// Report is the failure rendered for a person, as it was found: kept
	// in the JSON, so that verdicts read back (merged shards) say it too.
	Report string `json:"report,omitempty"`
	// Flaky reports that the failure did not reproduce when its steps were
	// replayed: the server is not deterministic under the same steps. The
	// plans and history are then the original failing run's.
	Flaky bool `json:"flaky,omitempty"`
	// Skipped are the invariants whose violations the run set aside
	// (Options.Skip): a replay sets them aside too, or it could stop at one
	// of them before it reaches this failure.
	Skipped []model.Invariant `json:"skipped,omitempty"`
	// SkippedKinds are the kinds of wrong state the run had found before
	// (model.Kind), set aside as Skipped is.
	SkippedKinds []model.Kind `json:"skippedKinds,omitempty"`
	// AuxInstructions are the instructions of the server's auxiliary
	// model calls the run had learned (model.Turn.SplitAuxiliary): a
	// replay sets apart what the run set apart.
	AuxInstructions []uint32 `json:"auxInstructions,omitempty"`
}

// ShrinkState is how far a failure's shrinking got.
type ShrinkState string

// The shrink states.
const (
	Shrunk       ShrinkState = "shrunk"
	PartlyShrunk ShrinkState = "partly shrunk"
	NotShrunk    ShrinkState = "not shrunk"
)
