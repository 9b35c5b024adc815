package fronttest

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A leaked goroutine fails the tests.
	goleak.VerifyTestMain(m)
}
