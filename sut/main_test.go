package sut_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/pgtest"
)

// TestMain fails the package if any test leaves a goroutine behind: every
// server, fake model and HTTP client a test starts must be closed by it.
// The PostgreSQL server of the replica tests, if they started it, is
// stopped before.
func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.Main(m)) }
