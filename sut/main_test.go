package sut_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/pgtest"
	"github.com/turncheck/turncheck/internal/tmpfs"
)

// TestMain fails the package if any test leaves a goroutine behind: every
// server, fake model and HTTP client a test starts must be closed by it.
// The PostgreSQL server of the replica tests, if they started it, is
// stopped before.
//
// Run with TURNCHECK_SUT_ACP_CHILD set, the test binary is instead an ACP
// server on its stdin and stdout (acp_test.go): the real subprocess the
// ACP tests drive.
func TestMain(m *testing.M) {
	tmpfs.Use() // its servers' data dirs in memory
	if spec := os.Getenv(acpChildEnv); spec != "" {
		os.Exit(serveACPChild(spec))
	}
	goleak.VerifyTestMain(pgtest.Main(m))
}
