package sut_test

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// The store keeps its secrets: its modes, and keyed scopes (store.go,
// scope.go).

// openDB opens the store of data dir dir directly.
func openDB(t *testing.T, dir string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", OmitHost: true, Path: filepath.Join(dir, "conversations.db")}).String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// scopesIn returns the distinct scopes of the messages in dir's store.
func scopesIn(t *testing.T, dir string) []string {
	t.Helper()
	rows, err := openDB(t, dir).Query(`SELECT DISTINCT scope FROM messages ORDER BY scope`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// unsaltedScope is the scope of key in a store from before the secret.
func unsaltedScope(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

func TestStoreIsPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	e := newEnv(t, sut.Config{DataDir: dir})
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "data dir")
	for _, name := range []string{"conversations.db", "conversations.db-wal", "conversations.db-shm"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), name)
	}
}

// TestStoreFromBeforeIsTightened: a store made 0644 is made 0600 when
// opened; its directory, which may be shared on purpose, is left alone.
func TestStoreFromBeforeIsTightened(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	e := newEnv(t, sut.Config{DataDir: dir})
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	require.NoError(t, e.srv.Close())
	for _, name := range []string{"conversations.db", "conversations.db-wal", "conversations.db-shm"} {
		if err := os.Chmod(filepath.Join(dir, name), 0o644); err != nil && !os.IsNotExist(err) {
			require.NoError(t, err)
		}
	}
	e = newEnv(t, sut.Config{DataDir: dir})
	require.Equal(t, toks("u1", "a1", "u2"), e.ok(t, "", "c1", "tc-u2"))
	for _, name := range []string{"conversations.db", "conversations.db-wal", "conversations.db-shm"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), name)
	}
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), fi.Mode().Perm())
}

// TestScopesAreKeyedPerStore: a key's scope is neither its unsalted digest
// nor the same in two stores, and survives a restart.
func TestScopesAreKeyedPerStore(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	for _, dir := range []string{dirA, dirB} {
		e := newEnv(t, sut.Config{DataDir: dir, Keys: []string{"key-a"}})
		require.Equal(t, toks("u1"), e.ok(t, "key-a", "c1", "tc-u1"))
		require.NoError(t, e.srv.Close())
	}
	a, b := scopesIn(t, dirA), scopesIn(t, dirB)
	require.Len(t, a, 1)
	require.Len(t, b, 1)
	assert.NotEqual(t, a, b, "the same key must have unrelated scopes in two stores")
	assert.NotEqual(t, unsaltedScope("key-a"), a[0])
	assert.NotContains(t, a[0], "key-a")

	e := newEnv(t, sut.Config{DataDir: dirA, Keys: []string{"key-a"}})
	assert.Equal(t, toks("u1", "a1", "u2"), e.ok(t, "key-a", "c1", "tc-u2"), "the scope survives a restart")
	assert.Equal(t, a, scopesIn(t, dirA))
}

// TestStoreFromBeforeTheSecretOpens: a data dir written with unsalted
// scopes opens; a configured key's conversations move to its keyed scope
// and go on, and a key not configured keeps its rows until a start that
// has it.
func TestStoreFromBeforeTheSecretOpens(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	_, err := db.Exec(`CREATE TABLE messages (scope TEXT NOT NULL, conversation TEXT NOT NULL, seq INTEGER NOT NULL,
		role TEXT NOT NULL, content TEXT NOT NULL, PRIMARY KEY (scope, conversation, seq)) WITHOUT ROWID;
		CREATE TABLE sources (scope TEXT NOT NULL, conversation TEXT NOT NULL, source TEXT NOT NULL,
		PRIMARY KEY (scope, conversation)) WITHOUT ROWID;`)
	require.NoError(t, err)
	for _, row := range []struct{ scope, conv, content string }{
		{unsaltedScope("key-a"), "c1", "tc-u1 hi"},
		{unsaltedScope("key-b"), "c1", "tc-u2 hi"},
		{"", "c1", "tc-u3 hi"},
	} {
		_, err := db.Exec(`INSERT INTO messages VALUES (?, ?, 0, 'user', ?)`, row.scope, row.conv, row.content)
		require.NoError(t, err)
	}
	require.NoError(t, db.Close())

	e := newEnv(t, sut.Config{DataDir: dir, Keys: []string{"key-a"}})
	assert.Equal(t, toks("u1", "u4"), e.ok(t, "key-a", "c1", "tc-u4"))
	require.NoError(t, e.srv.Close())
	scopes := scopesIn(t, dir)
	assert.NotContains(t, scopes, unsaltedScope("key-a"), "key-a's unsalted digest must be gone")
	assert.Contains(t, scopes, unsaltedScope("key-b"), "key-b was not configured: its rows wait")

	e = newEnv(t, sut.Config{DataDir: dir, Keys: []string{"key-a", "key-b"}})
	assert.Equal(t, toks("u1", "u4", "a4", "u5"), e.ok(t, "key-a", "c1", "tc-u5"))
	assert.Equal(t, toks("u2", "u6"), e.ok(t, "key-b", "c1", "tc-u6"))
	require.NoError(t, e.srv.Close())
	for _, s := range scopesIn(t, dir) {
		assert.True(t, s == "" || !strings.Contains(s, unsaltedScope("key-b")), "scope %q", s)
	}
	assert.NotContains(t, scopesIn(t, dir), unsaltedScope("key-b"))

	// Without keys, the keyless conversation is the one there was.
	e = newEnv(t, sut.Config{DataDir: dir})
	assert.Equal(t, toks("u3", "u7"), e.ok(t, "", "c1", "tc-u7"))
}

// TestStoreFromBeforeToolsOpens: a data dir whose messages table has no
// tool columns gets them, with defaults that keep its messages as they
// were; tool rounds are then committed and loaded like any.
func TestStoreFromBeforeToolsOpens(t *testing.T) {
	dir := t.TempDir()
	db := openDB(t, dir)
	_, err := db.Exec(`CREATE TABLE messages (scope TEXT NOT NULL, conversation TEXT NOT NULL, seq INTEGER NOT NULL,
		role TEXT NOT NULL, content TEXT NOT NULL, PRIMARY KEY (scope, conversation, seq)) WITHOUT ROWID;
		CREATE TABLE sources (scope TEXT NOT NULL, conversation TEXT NOT NULL, source TEXT NOT NULL,
		PRIMARY KEY (scope, conversation)) WITHOUT ROWID;
		INSERT INTO messages VALUES ('', 'conv', 0, 'user', 'tc-u1'), ('', 'conv', 1, 'assistant', 'tc-a1');`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	e := newToolEnv(t, sut.Config{DataDir: dir})
	assert.Equal(t, lines("user tc-u1", "assistant tc-a1", "user tc-u2"), shape(e.history(t, "conv", "tc-u2")))
	e.model.script("tc-u3", ask(echo("c1", "a")))
	e.ok(t, "conv", "tc-u3", false)
	e.start(sut.Config{})
	assert.Equal(t, lines("user tc-u1", "assistant tc-a1", "user tc-u2", "assistant tc-a2",
		"user tc-u3", "calls c1", "tool c1: a", "assistant tc-a3", "user tc-u4"), shape(e.history(t, "conv", "tc-u4")))
	require.NoError(t, e.srv.Close())

	rows, err := openDB(t, dir).Query(`SELECT name FROM pragma_table_info('messages')`)
	require.NoError(t, err)
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		cols = append(cols, name)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{"scope", "conversation", "seq", "role", "content", "tool_calls", "tool_call_id", "hidden"}, cols)
}
