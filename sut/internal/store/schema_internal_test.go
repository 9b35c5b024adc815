package store

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestASQLiteStoreIsStampedWithItsSchema: a SQLite store says in its
// header which schema it holds; an open that finds the current one runs
// none of the schema's statements (a restart's whole store cost was
// parsing them), and one that finds an older stamp makes and migrates the
// schema, then stamps it.
func TestASQLiteStoreIsStampedWithItsSchema(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "conversations.db")
	reopen := func() {
		t.Helper()
		s, err := OpenStore(dir)
		require.NoError(t, err)
		require.NoError(t, s.Close())
	}
	// raw runs stmt on the store's file, and reads what query gives.
	raw := func(stmt, query string) (n int) {
		t.Helper()
		db, err := sql.Open("sqlite", path)
		require.NoError(t, err)
		defer db.Close()
		if stmt != "" {
			_, err = db.Exec(stmt)
			require.NoError(t, err)
		}
		require.NoError(t, db.QueryRow(query).Scan(&n))
		return n
	}
	const version = `PRAGMA user_version`
	const sessions = `SELECT count(*) FROM sqlite_schema WHERE name = 'sessions'`

	reopen()
	assert.Equal(t, schemaVersion, raw("", version), "a new store is stamped")

	// Stamped current: its statements do not run, so a table taken out
	// behind its back stays out.
	assert.Equal(t, 0, raw(`DROP TABLE sessions`, sessions))
	reopen()
	assert.Equal(t, 0, raw("", sessions), "the schema's statements ran on a store stamped current")

	// An older stamp: made and migrated again, then stamped.
	raw(`PRAGMA user_version = 0`, version)
	reopen()
	assert.Equal(t, 1, raw("", sessions))
	assert.Equal(t, schemaVersion, raw("", version))
}
