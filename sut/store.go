package sut

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	"github.com/turncheck/turncheck/internal/openai"

	_ "modernc.org/sqlite" // registers the "sqlite" driver (pure Go, no cgo)
)

// store is the durable home of every committed conversation: SQLite in WAL
// mode with synchronous=FULL, so a commit that returned survives a crash.
type store struct {
	db *sql.DB
	// secret keys the scopes of API keys (scope.go).
	secret []byte
}

const schema = `
CREATE TABLE IF NOT EXISTS messages (
	scope        TEXT    NOT NULL,
	conversation TEXT    NOT NULL,
	seq          INTEGER NOT NULL,
	role         TEXT    NOT NULL,
	content      TEXT    NOT NULL,
	PRIMARY KEY (scope, conversation, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sources (
	scope        TEXT NOT NULL,
	conversation TEXT NOT NULL,
	source       TEXT NOT NULL,
	PRIMARY KEY (scope, conversation)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
	name  TEXT NOT NULL PRIMARY KEY,
	value BLOB NOT NULL
) WITHOUT ROWID;
`

// The sources table records the agent source key a conversation was started
// under, written with its first messages. A data dir from before it gets the
// table empty: its conversations are unbound, as they were. The meta table
// holds the store's scope secret (scope.go), made when the store is first
// opened, by this version or a later one.

// The store holds every conversation in the clear: its directory is made
// 0700 and its files 0600. SQLite gives its -wal and -shm files the mode of
// the database file, so making that one first is enough. A store from
// before, made 0644, is tightened when opened; a directory that already
// exists is left as it is, as it may be one the user shares on purpose.
const (
	dirMode  = 0o700
	fileMode = 0o600
)

// openStore opens (creating if needed) the store in dir.
func openStore(dir string) (*store, error) {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	path, err := filepath.Abs(filepath.Join(dir, "conversations.db"))
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if err := makePrivate(path); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	// A URI, so that '?', '#' or '%' in the path stay part of it.
	dsn := url.URL{Scheme: "file", OmitHost: true, Path: path,
		RawQuery: "_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(5000)"}
	db, err := sql.Open("sqlite", dsn.String())
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	// One connection: SQLite has one writer anyway, and a single connection
	// keeps the pragmas above in force for every statement.
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(schema); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	secret, err := loadSecret(db)
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return &store{db: db, secret: secret}, nil
}

// makePrivate creates the database file at path readable by its owner
// only, or makes it so, with its -wal and -shm files, if it exists.
func makePrivate(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, fileMode)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&^fileMode != 0 {
			if err := os.Chmod(p, fileMode); err != nil {
				return err
			}
		}
	}
	return nil
}

// loadSecret returns the store's scope secret, making it if the store has
// none (a new store, or one from before the secret).
func loadSecret(db *sql.DB) ([]byte, error) {
	// INSERT OR IGNORE: a secret once made is never replaced.
	if _, err := db.Exec(`INSERT OR IGNORE INTO meta (name, value) VALUES ('scope_secret', ?)`, rand.Text()); err != nil {
		return nil, fmt.Errorf("scope secret: %w", err)
	}
	var secret []byte
	if err := db.QueryRow(`SELECT value FROM meta WHERE name = 'scope_secret'`).Scan(&secret); err != nil {
		return nil, fmt.Errorf("scope secret: %w", err)
	}
	return secret, nil
}

// rescope moves every conversation stored under a scope in moves (old to
// new) to its new scope, in one transaction.
func (s *store) rescope(moves map[string]string) error {
	if len(moves) == 0 {
		return nil
	}
	tx, err := s.db.Begin()
	if err != nil {
		return fmt.Errorf("rescope: %w", err)
	}
	for old, next := range moves {
		for _, table := range []string{"messages", "sources"} {
			if _, err := tx.Exec(`UPDATE `+table+` SET scope = ? WHERE scope = ?`, next, old); err != nil {
				return errors.Join(fmt.Errorf("rescope: %w", err), tx.Rollback())
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("rescope: %w", err)
	}
	return nil
}

// load returns the committed conversation k: its messages in order (none
// if it has never been committed) and its source key ("" if unbound).
func (s *store) load(ctx context.Context, k convKey) (*conversation, error) {
	msgs, err := s.loadMessages(ctx, k)
	if err != nil {
		return nil, err
	}
	var source string
	err = s.db.QueryRowContext(ctx, `SELECT source FROM sources WHERE scope = ? AND conversation = ?`, k.scope, k.id).Scan(&source)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("load conversation: %w", err)
	}
	return &conversation{messages: msgs, source: source}, nil
}

func (s *store) loadMessages(ctx context.Context, k convKey) ([]openai.Message, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT role, content FROM messages WHERE scope = ? AND conversation = ? ORDER BY seq`, k.scope, k.id)
	if err != nil {
		return nil, fmt.Errorf("load conversation: %w", err)
	}
	defer rows.Close()
	var out []openai.Message
	for rows.Next() {
		var m openai.Message
		var content string
		if err := rows.Scan(&m.Role, &content); err != nil {
			return nil, fmt.Errorf("load conversation: %w", err)
		}
		m.Content = openai.Content(content)
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load conversation: %w", err)
	}
	return out, nil
}

// appendMessages commits msgs as the messages from seq on, in one
// transaction, with the conversation's source key when seq is 0 and it has
// one. A conflicting seq means the conversation moved on under us, which
// per-conversation serialization rules out; it fails the commit.
func (s *store) appendMessages(k convKey, seq int, msgs []openai.Message, source string) error {
	return s.writeMessages(`INSERT`, k, seq, msgs, source)
}

// overwriteMessages commits msgs as the messages from seq on, replacing any
// already there: the store of the mutants whose turns on one conversation
// run at once from the same base, where the later commit wins.
func (s *store) overwriteMessages(k convKey, seq int, msgs []openai.Message, source string) error {
	return s.writeMessages(`INSERT OR REPLACE`, k, seq, msgs, source)
}

// writeMessages writes msgs from seq on, and the source key with the first
// messages, in one transaction, with the given insert verb: a conversation
// is never found with its messages and without its source.
func (s *store) writeMessages(insert string, k convKey, seq int, msgs []openai.Message, source string) error {
	// The commit is not tied to the request's context: once a turn is
	// decided, a client that goes away must not leave it half-written.
	tx, err := s.db.Begin()
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	for i, m := range msgs {
		if _, err := tx.Exec(insert+` INTO messages (scope, conversation, seq, role, content) VALUES (?, ?, ?, ?, ?)`,
			k.scope, k.id, seq+i, m.Role, string(m.Content)); err != nil {
			return errors.Join(fmt.Errorf("commit: %w", err), tx.Rollback())
		}
	}
	if seq == 0 && source != "" {
		if _, err := tx.Exec(insert+` INTO sources (scope, conversation, source) VALUES (?, ?, ?)`,
			k.scope, k.id, source); err != nil {
			return errors.Join(fmt.Errorf("commit: %w", err), tx.Rollback())
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// forget deletes conversation k, messages and source: only the
// lost-on-evict mutant does, when the cache evicts it.
func (s *store) forget(k convKey) error {
	tx, err := s.db.Begin()
	if err != nil {
		return fmt.Errorf("forget: %w", err)
	}
	for _, table := range []string{"messages", "sources"} {
		if _, err := tx.Exec(`DELETE FROM `+table+` WHERE scope = ? AND conversation = ?`, k.scope, k.id); err != nil {
			return errors.Join(fmt.Errorf("forget: %w", err), tx.Rollback())
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("forget: %w", err)
	}
	return nil
}

func (s *store) close() error { return s.db.Close() }
