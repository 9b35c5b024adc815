package protocol

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/procs"
	"github.com/turncheck/turncheck/internal/tmpfs"
)

func TestMain(m *testing.M) {
	tmpfs.Use() // its servers' data dirs in memory
	if mode := os.Getenv(scriptEnv); mode != "" {
		// This test binary, started again by a test: a scripted ACP agent.
		os.Exit(scriptedAgent(mode, os.Stdin, os.Stdout))
	}
	// Its tests mostly wait out read bounds and agents of their own.
	procs.WaitBound(4)
	// A leaked goroutine fails the tests, and so does an agent process
	// that outlived them.
	goleak.VerifyTestMain(procs.Checked(m))
}
