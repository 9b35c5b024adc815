package store

import (
	"strconv"
	"strings"
)

// dialect is what the store's SQL says differently in SQLite and in
// PostgreSQL: the rest of the store is written once, in the SQL both
// speak, with '?' placeholders.
type dialect struct {
	// name is the database's, for errors.
	name string
	// numbered marks placeholders written $1, $2, ... instead of '?'.
	numbered bool
	// tableSuffix ends every CREATE TABLE: SQLite's WITHOUT ROWID keys
	// a table by its primary key alone.
	tableSuffix string
	// blob is the type of raw bytes.
	blob string
	// text is the type of a message's text (its content, tool calls
	// and tool call id): PostgreSQL's TEXT refuses the NUL character,
	// which a message may hold, so there it is raw bytes.
	text string
	// columns lists the columns of the messages table, one a row.
	columns string
	// lockSchema, if not "", is run in the transaction that creates and
	// migrates the schema, before it: replicas that start at once on one
	// database must not create the same table twice.
	lockSchema string
}

var (
	sqliteDialect = dialect{
		name:        "sqlite",
		tableSuffix: " WITHOUT ROWID",
		blob:        "BLOB",
		text:        "TEXT",
		columns:     `SELECT name FROM pragma_table_info('messages')`,
	}
	postgresDialect = dialect{
		name:     "postgres",
		numbered: true,
		blob:     "BYTEA",
		text:     "BYTEA",
		columns:  `SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'messages'`,
		// Any constant key: it only orders the replicas' schema work.
		lockSchema: `SELECT pg_advisory_xact_lock(7411602210461870195)`,
	}
)

// q returns query in the dialect's placeholders. The store's queries hold
// no '?' but placeholders.
func (d dialect) q(query string) string {
	if !d.numbered {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// schema returns the statements that create the store's tables, in the
// dialect. PostgreSQL's has the conversations' leases (Leases) too: a
// SQLite store is one process's, whose locks are its own.
func (d dialect) schema() []string {
	var leases []string
	if d.numbered {
		leases = append(leases, `CREATE TABLE IF NOT EXISTS leases (
	scope        TEXT   NOT NULL,
	conversation TEXT   NOT NULL,
	holder       BIGINT NOT NULL,
	epoch        BIGINT NOT NULL,
	PRIMARY KEY (scope, conversation)
)`, `CREATE TABLE IF NOT EXISTS lease_holders (
	holder BIGINT      NOT NULL PRIMARY KEY,
	seen   TIMESTAMPTZ NOT NULL
)`)
	}
	return append(leases, []string{
		`CREATE TABLE IF NOT EXISTS messages (
	scope        TEXT    NOT NULL,
	conversation TEXT    NOT NULL,
	seq          INTEGER NOT NULL,
	role         TEXT    NOT NULL,
	content      ` + d.text + ` NOT NULL,
	tool_calls   ` + d.text + ` NOT NULL DEFAULT '',
	tool_call_id ` + d.text + ` NOT NULL DEFAULT '',
	hidden       INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (scope, conversation, seq)
)` + d.tableSuffix,
		`CREATE TABLE IF NOT EXISTS sources (
	scope        TEXT NOT NULL,
	conversation TEXT NOT NULL,
	source       TEXT NOT NULL,
	PRIMARY KEY (scope, conversation)
)` + d.tableSuffix,
		`CREATE TABLE IF NOT EXISTS sessions (
	scope        TEXT NOT NULL,
	conversation TEXT NOT NULL,
	PRIMARY KEY (scope, conversation)
)` + d.tableSuffix,
		`CREATE TABLE IF NOT EXISTS meta (
	name  TEXT NOT NULL PRIMARY KEY,
	value ` + d.blob + ` NOT NULL
)` + d.tableSuffix,
	}...)
}

// textArg is s as an argument for a column of type d.text.
func (d dialect) textArg(s string) any {
	if d.text == d.blob {
		return []byte(s)
	}
	return s
}

// onConflict is what an insert does with a row whose key is taken.
type onConflict int

const (
	// conflictFails fails the insert: the row's place was not free.
	conflictFails onConflict = iota
	// conflictIgnored keeps the row already there.
	conflictIgnored
	// conflictReplaces replaces the row already there.
	conflictReplaces
)

// insert returns an INSERT of one row of cols into table, whose primary
// key is the first keyCols of cols, doing on a taken key what conflict
// says: SQLite's INSERT OR IGNORE and INSERT OR REPLACE, PostgreSQL's
// ON CONFLICT clauses.
func (d dialect) insert(conflict onConflict, table string, keyCols int, cols ...string) string {
	return d.insertRows(conflict, table, keyCols, 1, cols...)
}

// insertRows is insert of rows rows at once, their values one after the
// other: one statement, one round trip to the database.
func (d dialect) insertRows(conflict onConflict, table string, keyCols, rows int, cols ...string) string {
	verb := "INSERT"
	if !d.numbered {
		switch conflict {
		case conflictIgnored:
			verb = "INSERT OR IGNORE"
		case conflictReplaces:
			verb = "INSERT OR REPLACE"
		}
	}
	row := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ")"
	q := verb + " INTO " + table + " (" + strings.Join(cols, ", ") + ") VALUES " +
		strings.TrimSuffix(strings.Repeat(row+", ", rows), ", ")
	if d.numbered {
		q += d.upsert(conflict, keyCols, cols)
	}
	return d.q(q)
}

// upsert is PostgreSQL's ON CONFLICT clause for conflict.
func (d dialect) upsert(conflict onConflict, keyCols int, cols []string) string {
	switch conflict {
	case conflictIgnored:
		return " ON CONFLICT DO NOTHING"
	case conflictReplaces:
		set := make([]string, 0, len(cols)-keyCols)
		for _, c := range cols[keyCols:] {
			set = append(set, c+" = EXCLUDED."+c)
		}
		return " ON CONFLICT (" + strings.Join(cols[:keyCols], ", ") + ") DO UPDATE SET " + strings.Join(set, ", ")
	}
	return ""
}
