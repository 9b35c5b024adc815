package execute

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/pgtest"
	"github.com/turncheck/turncheck/internal/procs"
	"github.com/turncheck/turncheck/internal/testbin"
)

func TestMain(m *testing.M) {
	// A leaked goroutine fails the tests, and so does a server process
	// that outlived them; the replicas over PostgreSQL share one, started
	// while the first tests run.
	goleak.VerifyTestMain(procs.Checked(testbin.Main(pgtest.Main(m))))
}
