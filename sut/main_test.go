package sut_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: every
// server, fake model and HTTP client a test starts must be closed by it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
