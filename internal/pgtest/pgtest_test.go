package pgtest

import (
	"database/sql"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/procs"
)

// TestMain also checks that Main leaves no PostgreSQL process and no
// directory of it behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(leftovers{Main(m)}) }

type leftovers struct{ r interface{ Run() int } }

func (l leftovers) Run() int {
	code := l.r.Run()
	kids, err := procs.Children()
	if err != nil || len(kids) > 0 {
		fmt.Fprintf(os.Stderr, "pgtest: processes left behind: %v %v\n", kids, err)
		return 1
	}
	if srv != nil {
		if _, err := os.Stat(srv.Dir()); !os.IsNotExist(err) {
			fmt.Fprintf(os.Stderr, "pgtest: %s left behind\n", srv.Dir())
			return 1
		}
	}
	return code
}

// TestStartGivesEachTestItsOwnSchema: two schemas on one server, each
// writable, neither seeing the other's tables, on a server that does not
// wait for the disk (the tests crash replicas, never PostgreSQL).
func TestStartGivesEachTestItsOwnSchema(t *testing.T) {
	a, b := open(t, Start(t)), open(t, Start(t))
	_, err := a.Exec(`CREATE TABLE t (x int)`)
	require.NoError(t, err)
	_, err = b.Exec(`CREATE TABLE t (x int)`)
	require.NoError(t, err, "the second schema has no table t of the first")
	var fsync string
	require.NoError(t, a.QueryRow(`SHOW fsync`).Scan(&fsync))
	assert.Equal(t, "off", fsync)
}

func open(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}
