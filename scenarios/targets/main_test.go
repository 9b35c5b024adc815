package targets

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/procs"
)

func TestMain(m *testing.M) {
	// A leaked goroutine fails the tests, and so does a server process
	// that outlived them.
	goleak.VerifyTestMain(procs.Checked(m))
}
