// Package store keeps conversations: the durable store (SQLite, or
// PostgreSQL shared by replicas), the bounded cache over it, the
// write-behind queue of the ack-before-durable mutant, and the locks that
// run the turns of one conversation one after another.
package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/turncheck/turncheck/internal/openai"

	_ "modernc.org/sqlite" // registers the "sqlite" driver (pure Go, no cgo)
)

// Store is the durable home of every committed conversation: SQLite in WAL
// mode, or PostgreSQL with synchronous_commit on (pgstore.go), so a commit
// that returned survives the server's restart and its kill -9. SQLite's
// synchronous=NORMAL, its own advice for WAL, is enough for that: a
// commit is in the WAL file, written through to the operating system,
// when it returns; only the machine's own crash could take the last
// commits, which no check does. FULL would add an fsync to every commit.
type Store struct {
	db *sql.DB
	// d is the SQL dialect of db.
	d dialect
	// Secret keys the scopes of API keys (scope.go).
	Secret []byte
	// Shared, for PostgreSQL alone, takes the conversation locks that
	// hold across every process on the database; nil for SQLite, whose
	// store one process alone opens.
	Shared *Leases
	// CommitWithin bounds a commit on PostgreSQL, tries again included
	// (writeMessages): the server's RequestTimeout.
	CommitWithin time.Duration
}

// dbtx is what the store's statements run on: the pool, or the
// connection a turn took its conversation's lease on (WithLease).
type dbtx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// heldLease is the context key of the lease a turn holds.
type heldLease struct{}

// WithLease is ctx carrying l, the lease the turn holds its conversation
// by (Leases.Lock): the store's reads made under ctx run on the
// connection l was taken on, while it holds it, and its commits check
// that l is still the turn's (Lease.fence). A nil l leaves ctx as it is.
func WithLease(ctx context.Context, l *Lease) context.Context {
	if l == nil {
		return ctx
	}
	return context.WithValue(ctx, heldLease{}, l)
}

// leaseOf is the lease ctx carries (WithLease), or nil.
func leaseOf(ctx context.Context) *Lease {
	l, _ := ctx.Value(heldLease{}).(*Lease)
	return l
}

// leaseEpoch is the epoch of the lease ctx carries, 0 for none.
func leaseEpoch(ctx context.Context) int64 {
	if l := leaseOf(ctx); l != nil {
		return l.epoch
	}
	return 0
}

// on is what a statement made under ctx runs on: the connection the
// lease ctx carries was taken on, while it holds it, or the pool.
func (s *Store) on(ctx context.Context) dbtx {
	if l := leaseOf(ctx); l != nil && l.conn != nil {
		return l.conn
	}
	return s.db
}

// The tables are dialect.schema's. A message's tool_calls are the JSON
// array of the tool calls an assistant message asks for ('' for none),
// its tool_call_id the call a tool result answers ('' for none), and
// hidden is 1 once compaction took it out of what the model is sent. A data dir from before them gets them with those
// defaults (migrate): its messages are what they were.
//
// The sources table records the agent source key a conversation was started
// under, written with its first messages. A data dir from before it gets the
// table empty: its conversations are unbound, as they were. The meta table
// holds the store's scope secret (scope.go), made when the store is first
// opened, by this version or a later one. The sessions table lists the
// sessions of the sessions API, each from its creation on, before it has
// any message; a data dir from before it gets it empty.

// The store holds every conversation in the clear: its directory is made
// 0700 and its files 0600. SQLite gives its -wal and -shm files the mode of
// the database file, so making that one first is enough. A store from
// before, made 0644, is tightened when opened; a directory that already
// exists is left as it is, as it may be one the user shares on purpose.
const (
	dirMode  = 0o700
	fileMode = 0o600
)

// OpenStore opens (creating if needed) the store in dir.
func OpenStore(dir string) (*Store, error) {
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
		RawQuery: "_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=busy_timeout(5000)"}
	db, err := sql.Open("sqlite", dsn.String())
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	// One connection: SQLite has one writer anyway, and a single connection
	// keeps the pragmas above in force for every statement.
	db.SetMaxOpenConns(1)
	return initStore(db, sqliteDialect, path)
}

// initStore makes db the store: its schema created and migrated, its
// secret loaded. It closes db if it fails; where names the store in
// errors.
func initStore(db *sql.DB, d dialect, where string) (*Store, error) {
	s := &Store{db: db, d: d}
	err := s.prepareSchema()
	if err == nil {
		s.Secret, err = s.loadSecret()
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store %s: %w", where, err)
	}
	return s, nil
}

// prepareSchema creates the tables a store lacks and migrates those from
// before, in one transaction: a store is never found half made.
func (s *Store) prepareSchema() error {
	tx, err := s.db.Begin()
	if err != nil {
		return err
	}
	stmts := s.d.schema()
	if s.d.lockSchema != "" {
		stmts = append([]string{s.d.lockSchema}, stmts...)
	}
	for _, stmt := range stmts {
		if _, err := tx.Exec(stmt); err != nil {
			return errors.Join(err, tx.Rollback())
		}
	}
	if err := s.migrate(tx); err != nil {
		return errors.Join(err, tx.Rollback())
	}
	return tx.Commit()
}

// addedColumns are the columns of the messages table that came after its
// first version, with the declaration that gives the rows from before
// their meaning: no tool calls, no tool call id, not hidden.
var addedColumns = []struct{ name, decl string }{
	{"tool_calls", "TEXT NOT NULL DEFAULT ''"},
	{"tool_call_id", "TEXT NOT NULL DEFAULT ''"},
	{"hidden", "INTEGER NOT NULL DEFAULT 0"},
}

// migrate adds to the messages table of a data dir from before them the
// columns it lacks, in tx.
func (s *Store) migrate(tx *sql.Tx) error {
	rows, err := tx.Query(s.d.columns)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			_ = rows.Close()
			return fmt.Errorf("migrate: %w", err)
		}
		have[name] = true
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for _, c := range addedColumns {
		if have[c.name] {
			continue
		}
		if _, err := tx.Exec(`ALTER TABLE messages ADD COLUMN ` + c.name + ` ` + c.decl); err != nil {
			return fmt.Errorf("migrate: add column %s: %w", c.name, err)
		}
	}
	return nil
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
// none (a new store, or one from before the secret). Replicas on one
// database all read the one that the first of them made.
func (s *Store) loadSecret() ([]byte, error) {
	// Ignored on conflict: a secret once made is never replaced.
	if _, err := s.db.Exec(s.d.insert(conflictIgnored, "meta", 1, "name", "value"), "scope_secret", []byte(rand.Text())); err != nil {
		return nil, fmt.Errorf("scope secret: %w", err)
	}
	var secret []byte
	if err := s.db.QueryRow(`SELECT value FROM meta WHERE name = 'scope_secret'`).Scan(&secret); err != nil {
		return nil, fmt.Errorf("scope secret: %w", err)
	}
	return secret, nil
}

// Rescope moves every conversation stored under a scope in moves (old to
// new) to its new scope, in one transaction.
func (s *Store) Rescope(moves map[string]string) error {
	if len(moves) == 0 {
		return nil
	}
	tx, err := s.db.Begin()
	if err != nil {
		return fmt.Errorf("rescope: %w", err)
	}
	for old, next := range moves {
		for _, table := range []string{"messages", "sources", "sessions"} {
			if _, err := tx.Exec(s.d.q(`UPDATE `+table+` SET scope = ? WHERE scope = ?`), next, old); err != nil {
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
// if it has never been committed) and its source key ("" if unbound), read
// in one statement, one round trip: the source's row comes first, as seq
// -1 with the source in the place of a role (of the same type on both
// stores, where content is not).
func (s *Store) load(ctx context.Context, k Key) (*Conversation, error) {
	rows, err := s.on(ctx).QueryContext(ctx, s.d.q(`SELECT -1, source, '', '', '', 0 FROM sources WHERE scope = ? AND conversation = ?
		UNION ALL SELECT seq, role, content, tool_calls, tool_call_id, hidden FROM messages WHERE scope = ? AND conversation = ?
		ORDER BY 1`), k.Scope, k.ID, k.Scope, k.ID)
	if err != nil {
		return nil, fmt.Errorf("load conversation: %w", err)
	}
	defer rows.Close()
	c := &Conversation{}
	for rows.Next() {
		m := &Message{}
		var seq int64
		var content, calls string
		if err := rows.Scan(&seq, &m.Role, &content, &calls, &m.ToolCallID, &m.Hidden); err != nil {
			return nil, fmt.Errorf("load conversation: %w", err)
		}
		if seq < 0 {
			c.Source = m.Role
			continue
		}
		m.Content = openai.Content(content)
		if calls != "" {
			if err := json.Unmarshal([]byte(calls), &m.ToolCalls); err != nil {
				return nil, fmt.Errorf("load conversation: message %d: tool calls: %w", len(c.Messages), err)
			}
		}
		c.Messages = append(c.Messages, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load conversation: %w", err)
	}
	return c, nil
}

// appendMessages commits ch in one transaction: its messages from ch.seq
// on, its hidden marks, and the conversation's source key when ch.seq is 0
// and it has one. A conflicting seq means the conversation moved on under
// us, which per-conversation serialization rules out; it fails the commit.
// Under a lease (WithLease) it commits only while the lease is the
// turn's (ErrLeaseLost). It is not ended by ctx.
func (s *Store) appendMessages(ctx context.Context, k Key, ch change) error {
	return s.writeMessages(ctx, conflictFails, k, ch)
}

// overwriteMessages commits ch, its messages replacing any already at
// their places: the store of the mutants whose turns on one conversation
// run at once from the same base, where the later commit wins.
func (s *Store) overwriteMessages(ctx context.Context, k Key, ch change) error {
	return s.writeMessages(ctx, conflictReplaces, k, ch)
}

// writeMessages writes ch, doing what conflict says with a taken place, in
// one transaction: a conversation is never found with its messages and
// without its source, nor with a turn's messages and without the marks
// that turn set.
//
// The commit is not tied to the request's context: once a turn is
// decided, a client that goes away must not leave it half-written. On
// PostgreSQL, a commit that fails for want of a connection (the one it
// ran on broke, or the database takes no new one) is tried again, for at
// most commitWithin: after the model answered, a turn is failed only by
// what waiting cannot mend. Trying again is safe: the messages' places
// are unique and the lease is checked, so a commit over a conversation
// that moved on fails; only a commit that may have landed before its
// connection broke is then reported failed, as a failed turn may be
// there or not. A turn's commit takes its connection in the turns' line
// (Leases.borrow), where it took its lease.
func (s *Store) writeMessages(ctx context.Context, conflict onConflict, k Key, ch change) error {
	if s.Shared == nil {
		return s.writeOnce(context.Background(), s.on(ctx), nil, conflict, k, ch)
	}
	lease := leaseOf(ctx)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.CommitWithin)
	defer cancel()
	deadline, _ := wctx.Deadline()
	b := backoff{deadline: deadline}
	for {
		var err error
		if lease != nil {
			var conn *sql.Conn
			if conn, err = lease.a.borrow(wctx, deadline, true); err == nil {
				if len(ch.msgs) <= insertBatch {
					err = s.commitLeased(wctx, conn, lease, conflict, k, ch)
				} else {
					err = s.writeOnce(wctx, conn, lease, conflict, k, ch)
				}
				lease.a.giveBack(conn, err)
			}
		} else {
			err = s.writeOnce(wctx, s.db, nil, conflict, k, ch)
		}
		if err == nil || !lostConnection(err) {
			return err
		}
		if !b.wait(wctx) || wctx.Err() != nil {
			return err // why it failed, not that its time ran out
		}
	}
}

// lostConnection reports whether a statement failed for want of a
// connection to run on, not for what it said: PostgreSQL refused a new
// one (storeFull), the one it ran on broke, or the database ended its
// session (a FATAL error: terminated by an administrator, the server
// shutting down). Any other error the database answered a statement with
// is neither.
func lostConnection(err error) bool {
	if errors.Is(err, ErrLeaseLost) {
		return false
	}
	if StoreFull(err) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC" || strings.HasPrefix(pgErr.Code, "08")
	}
	return !errors.Is(err, context.DeadlineExceeded)
}

// commitLeased is writeOnce under lease on PostgreSQL, for a change of at
// most insertBatch messages, in one statement and one round trip: the
// lease's check and its giving back (Lease.fence), the messages, the
// hidden marks and the source key, each a part of one WITH, all written
// only if the lease is still the turn's. One statement is one
// transaction: it lands whole or not at all.
func (s *Store) commitLeased(ctx context.Context, conn *sql.Conn, lease *Lease, conflict onConflict, k Key, ch change) error {
	args := []any{k.Scope, k.ID, lease.epoch}
	arg := func(v any, cast string) string {
		args = append(args, v)
		return fmt.Sprintf("$%d::%s", len(args), cast)
	}
	var q strings.Builder
	q.WriteString(`WITH f AS (UPDATE leases SET holder = 0 WHERE scope = $1 AND conversation = $2 AND epoch = $3 RETURNING 1)`)
	if len(ch.msgs) > 0 {
		rows := make([]string, len(ch.msgs))
		for i, m := range ch.msgs {
			calls, err := toolCallsText(m)
			if err != nil {
				return err
			}
			rows[i] = "(" + strings.Join([]string{arg(ch.seq+i, "integer"), arg(m.Role, "text"), arg([]byte(m.Content), "bytea"),
				arg([]byte(calls), "bytea"), arg([]byte(m.ToolCallID), "bytea"), arg(flag(m.Hidden), "integer")}, ", ") + ")"
		}
		cols := []string{"scope", "conversation", "seq", "role", "content", "tool_calls", "tool_call_id", "hidden"}
		fmt.Fprintf(&q, `, ins AS (INSERT INTO messages (%s) SELECT $1, $2, v.* FROM (VALUES %s) AS v WHERE EXISTS (SELECT 1 FROM f)%s RETURNING 1)`,
			strings.Join(cols, ", "), strings.Join(rows, ", "), s.d.upsert(conflict, 3, cols))
	}
	if len(ch.hide) > 0 {
		hide := make([]int64, len(ch.hide))
		for i, seq := range ch.hide {
			hide[i] = int64(seq)
		}
		fmt.Fprintf(&q, `, hid AS (UPDATE messages SET hidden = 1 WHERE scope = $1 AND conversation = $2 AND seq = ANY(%s) AND EXISTS (SELECT 1 FROM f) RETURNING 1)`,
			arg(hide, "bigint[]"))
	}
	if ch.seq == 0 && ch.source != "" {
		cols := []string{"scope", "conversation", "source"}
		fmt.Fprintf(&q, `, src AS (INSERT INTO sources (%s) SELECT $1, $2, %s WHERE EXISTS (SELECT 1 FROM f)%s RETURNING 1)`,
			strings.Join(cols, ", "), arg(ch.source, "text"), s.d.upsert(conflict, 2, cols))
	}
	q.WriteString(` SELECT count(*) FROM f`)
	var fenced int
	if err := conn.QueryRowContext(ctx, q.String(), args...).Scan(&fenced); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if fenced != 1 {
		return ErrLeaseLost
	}
	lease.committed()
	return nil
}

// toolCallsText is m's tool calls as the store keeps them: JSON, or ""
// for none.
func toolCallsText(m Message) (string, error) {
	if len(m.ToolCalls) == 0 {
		return "", nil
	}
	b, err := json.Marshal(m.ToolCalls)
	if err != nil {
		return "", fmt.Errorf("commit: %w", err)
	}
	return string(b), nil
}

// insertBatch is how many messages one INSERT writes at most: 8 values
// each stays well within the bound on a statement's parameters (SQLite's
// 32,766, PostgreSQL's 65,535).
const insertBatch = 500

// writeOnce is one try of writeMessages, on db, under lease if not nil.
func (s *Store) writeOnce(ctx context.Context, db dbtx, lease *Lease, conflict onConflict, k Key, ch change) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if lease != nil {
		if err := lease.fence(ctx, tx); err != nil {
			return errors.Join(err, tx.Rollback())
		}
	}
	// The messages go in batches of rows, each one statement: a turn's
	// user message and reply, and its tool rounds, in one round trip.
	for from := 0; from < len(ch.msgs); from += insertBatch {
		batch := ch.msgs[from:min(from+insertBatch, len(ch.msgs))]
		args := make([]any, 0, 8*len(batch))
		for i, m := range batch {
			calls, err := toolCallsText(m)
			if err != nil {
				return errors.Join(err, tx.Rollback())
			}
			args = append(args, k.Scope, k.ID, ch.seq+from+i, m.Role, s.d.textArg(string(m.Content)), s.d.textArg(calls),
				s.d.textArg(m.ToolCallID), flag(m.Hidden))
		}
		insert := s.d.insertRows(conflict, "messages", 3, len(batch),
			"scope", "conversation", "seq", "role", "content", "tool_calls", "tool_call_id", "hidden")
		if _, err := tx.ExecContext(ctx, insert, args...); err != nil {
			return errors.Join(fmt.Errorf("commit: %w", err), tx.Rollback())
		}
	}
	for _, seq := range ch.hide {
		if _, err := tx.Exec(s.d.q(`UPDATE messages SET hidden = 1 WHERE scope = ? AND conversation = ? AND seq = ?`),
			k.Scope, k.ID, seq); err != nil {
			return errors.Join(fmt.Errorf("commit: %w", err), tx.Rollback())
		}
	}
	if ch.seq == 0 && ch.source != "" {
		if _, err := tx.Exec(s.d.insert(conflict, "sources", 2, "scope", "conversation", "source"),
			k.Scope, k.ID, ch.source); err != nil {
			return errors.Join(fmt.Errorf("commit: %w", err), tx.Rollback())
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if lease != nil {
		lease.committed()
	}
	return nil
}

// forget deletes conversation k, messages and source: only the
// lost-on-evict mutant does, when the cache evicts it.
func (s *Store) forget(k Key) error {
	tx, err := s.db.Begin()
	if err != nil {
		return fmt.Errorf("forget: %w", err)
	}
	for _, table := range []string{"messages", "sources"} {
		if _, err := tx.Exec(s.d.q(`DELETE FROM `+table+` WHERE scope = ? AND conversation = ?`), k.Scope, k.ID); err != nil {
			return errors.Join(fmt.Errorf("forget: %w", err), tx.Rollback())
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("forget: %w", err)
	}
	return nil
}

// CreateSession records session k, durably: it exists from now on,
// with no message yet.
func (s *Store) CreateSession(k Key) error {
	if _, err := s.db.Exec(s.d.insert(conflictFails, "sessions", 2, "scope", "conversation"), k.Scope, k.ID); err != nil {
		return fmt.Errorf("create session: %w", err)
	}
	return nil
}

// SessionExists reports whether session k was created.
func (s *Store) SessionExists(ctx context.Context, k Key) (bool, error) {
	var one int
	err := s.db.QueryRowContext(ctx, s.d.q(`SELECT 1 FROM sessions WHERE scope = ? AND conversation = ?`), k.Scope, k.ID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("find session: %w", err)
	}
	return true, nil
}

// ScopeOf returns the scope of some conversation with id, whichever key
// it is stored under: only the response-cross-key mutant looks one up
// so.
func (s *Store) ScopeOf(ctx context.Context, id string) (string, bool, error) {
	var scope string
	err := s.db.QueryRowContext(ctx, s.d.q(`SELECT scope FROM messages WHERE conversation = ? LIMIT 1`), id).Scan(&scope)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("find conversation: %w", err)
	}
	return scope, true, nil
}

// flag is b as the store keeps it: 1 or 0.
func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Close closes the database, and ends the connection of life on
// PostgreSQL.
func (s *Store) Close() error {
	if s.Shared != nil {
		s.Shared.Close()
	}
	return s.db.Close()
}
