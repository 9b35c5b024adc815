package targets

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/procs"
	"github.com/turncheck/turncheck/internal/tmpfs"
)

func TestMain(m *testing.M) {
	tmpfs.Use() // its servers' data dirs in memory
	// A leaked goroutine fails the tests, and so does a server process
	// that outlived them.
	goleak.VerifyTestMain(procs.Checked(m))
}
