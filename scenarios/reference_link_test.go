package scenarios_test

import (
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
)

// The tests inside package scenarios run the reference server through
// package reference, which only a test outside that package can import.
func init() {
	scenarios.ReferenceTarget = func(r scenarios.Reference) scenarios.Target {
		return reference.Target{Mutant: r.Mutant, Concurrency: r.Concurrency, Interruption: r.Interruption}
	}
}
