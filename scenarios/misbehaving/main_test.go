//go:build unix

// Package misbehaving_test holds Conform, the engine of `turncheck
// conform`, to its promise against servers that misbehave: ones that
// crash, hang, answer garbage, never earn a pass, or leak one
// conversation into another. Within the run's bound it gives honest
// verdicts (nothing passed that was not shown, nothing failed that the
// server did not break, one finding for one root cause, after the first
// finding too) or an error that names the problem. They are apart from
// scenarios' own tests so that neither package's test binary needs more
// than a share of go test's time bound on a loaded machine.
package misbehaving_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/crashtest"
	"github.com/turncheck/turncheck/internal/procs"
	"github.com/turncheck/turncheck/internal/tmpfs"
)

func TestMain(m *testing.M) {
	tmpfs.Use() // its servers' data dirs in memory
	// A re-executed test binary plays a misbehaving server instead.
	runHostileChild()
	crashtest.Main()
	procs.WaitBound(3)
	// A leaked goroutine fails the tests, and so does a server process
	// that outlived them.
	goleak.VerifyTestMain(procs.Checked(m))
}
