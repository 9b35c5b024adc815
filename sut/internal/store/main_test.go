package store

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/pgtest"
)

// TestMain runs the package's tests beside one PostgreSQL (pgtest), and
// fails them on a leaked goroutine.
func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.Main(m)) }

// openPostgres opens a store in the PostgreSQL schema at url, as a
// replica does (four connections, commits tried for 5 s), closed when t
// ends.
func openPostgres(t *testing.T, url string) *Store {
	t.Helper()
	s, err := OpenPostgres(url, 4)
	if err != nil {
		t.Fatal(err)
	}
	s.CommitWithin = 5 * time.Second
	t.Cleanup(func() { _ = s.Close() })
	return s
}
