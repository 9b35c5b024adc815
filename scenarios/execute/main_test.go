package execute

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/pgtest"
	"github.com/turncheck/turncheck/internal/procs"
	"github.com/turncheck/turncheck/internal/tmpfs"
)

func TestMain(m *testing.M) {
	tmpfs.Use() // its servers' data dirs in memory
	// Its tests mostly wait on their servers' stalls and timeouts.
	procs.WaitBound(3)
	// A leaked goroutine fails the tests, and so does a server process
	// that outlived them; the replicas over PostgreSQL share one, started
	// while the first tests run.
	goleak.VerifyTestMain(procs.Checked(pgtest.Main(m)))
}
