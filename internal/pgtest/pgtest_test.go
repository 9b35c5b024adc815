package pgtest_test

import (
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/pgtest"
	"github.com/turncheck/turncheck/internal/procs"
)

// TestMain also checks that Main leaves no PostgreSQL process and no
// directory of it behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(leftovers{pgtest.Main(m)}) }

type leftovers struct{ r interface{ Run() int } }

func (l leftovers) Run() int {
	code := l.r.Run()
	kids, err := procs.Children()
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "pgtest-*"))
	if err != nil || len(kids) > 0 || len(dirs) > 0 {
		println("pgtest: left behind:", len(kids), "processes", len(dirs), "directories", err)
		return 1
	}
	return code
}

// TestStartGivesEachTestItsOwnSchema: two schemas on one server, each
// writable, neither seeing the other's tables, on a server that syncs.
func TestStartGivesEachTestItsOwnSchema(t *testing.T) {
	a, b := open(t, pgtest.Start(t)), open(t, pgtest.Start(t))
	_, err := a.Exec(`CREATE TABLE t (x int)`)
	require.NoError(t, err)
	_, err = b.Exec(`CREATE TABLE t (x int)`)
	require.NoError(t, err, "the second schema has no table t of the first")
	var fsync string
	require.NoError(t, a.QueryRow(`SHOW fsync`).Scan(&fsync))
	assert.Equal(t, "on", fsync)
}

func open(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}
