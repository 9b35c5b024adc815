package sut

import (
	"context"
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
`

// openStore opens (creating if needed) the store in dir.
func openStore(dir string) (*store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	path, err := filepath.Abs(filepath.Join(dir, "conversations.db"))
	if err != nil {
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
	return &store{db: db}, nil
}

// load returns the messages of a conversation in order; none if it has
// never been committed.
func (s *store) load(ctx context.Context, k convKey) ([]openai.Message, error) {
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
// transaction. A conflicting seq means the conversation moved on under us,
// which per-conversation serialization rules out; it fails the commit.
func (s *store) appendMessages(k convKey, seq int, msgs []openai.Message) error {
	return s.writeMessages(`INSERT`, k, seq, msgs)
}

// overwriteMessages commits msgs as the messages from seq on, replacing any
// already there: the store of the mutants whose turns on one conversation
// run at once from the same base, where the later commit wins.
func (s *store) overwriteMessages(k convKey, seq int, msgs []openai.Message) error {
	return s.writeMessages(`INSERT OR REPLACE`, k, seq, msgs)
}

// writeMessages writes msgs from seq on, in one transaction, with the
// given insert verb.
func (s *store) writeMessages(insert string, k convKey, seq int, msgs []openai.Message) error {
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
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func (s *store) close() error { return s.db.Close() }
