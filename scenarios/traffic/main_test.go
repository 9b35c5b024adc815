package traffic_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A leaked goroutine fails the tests: the servers and fake models the
	// checks start must be closed before the end.
	goleak.VerifyTestMain(m)
}
