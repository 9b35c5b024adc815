package store

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/pgtest"
)

// TestMain runs the package's tests beside one PostgreSQL (pgtest), and
// fails them on a leaked goroutine.
func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.Main(m)) }
