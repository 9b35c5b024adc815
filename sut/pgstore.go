package sut

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// A store on PostgreSQL is shared by every replica of the server that
// names it: each commit is durable when it returns (synchronous_commit
// on, whatever the server's default), one conversation's turns run one
// after another across all of them (advisoryLocks), and each replica's
// cache is checked against the store under the lock (conversations.fresh).

// isPostgresURL reports whether store names a PostgreSQL database.
func isPostgresURL(store string) bool {
	return strings.HasPrefix(store, "postgres://") || strings.HasPrefix(store, "postgresql://")
}

// pgIdleConns is how many connections a replica keeps open while unused:
// each turn holds one for its lock, and a lock on a fresh connection
// costs PostgreSQL a new backend.
const pgIdleConns = 32

// openPostgres opens the store in the PostgreSQL database at url. The
// number of connections is not capped: a turn holds one for its lock
// while its load and its commit take others, so a cap could leave every
// connection to lock holders waiting for one more; MaxRequests bounds
// the turns, and so the connections, at about two a turn.
func openPostgres(url string) (*store, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		// pgx's error hides a password the URL may hold.
		return nil, fmt.Errorf("store URL: %w", err)
	}
	// An acknowledged turn survives a crash of the database server too.
	cfg.RuntimeParams["synchronous_commit"] = "on"
	where := fmt.Sprintf("postgres://%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
	// A connection is pinged before every reuse, not only after a second
	// idle (pgx's default): when the network to the store breaks, every
	// pooled connection dies with it, and without the ping each would
	// fail one request after the store is back.
	db := stdlib.OpenDB(*cfg, stdlib.OptionShouldPing(func(context.Context, stdlib.ShouldPingParams) bool { return true }))
	db.SetMaxIdleConns(pgIdleConns)
	st, err := initStore(db, postgresDialect, where)
	if err != nil {
		return nil, err
	}
	var schema string
	if err := db.QueryRow(`SELECT current_schema()`).Scan(&schema); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store %s: %w", where, err)
	}
	st.shared = &advisoryLocks{db: db, schema: schema}
	return st, nil
}

// advisoryLocks are conversation locks that hold across processes: a
// PostgreSQL session-level advisory lock, keyed by the conversation
// (advisoryLocks.key) and taken on a connection that the turn keeps until it
// releases the lock. A process that dies loses its connections, and
// PostgreSQL releases their locks with them.
type advisoryLocks struct {
	db *sql.DB
	// schema is the store's schema: advisory locks are the database's,
	// and stores in other schemas of it are other servers.
	schema string
}

// key is k's advisory lock key: a 64-bit FNV-1a hash of the store's
// schema and k's scope and id, the same in every process. Two
// conversations that share one only wait for each other.
func (a *advisoryLocks) key(k convKey) int64 {
	h := fnv.New64a()
	for _, part := range []string{a.schema, k.scope, k.id} {
		_, _ = h.Write([]byte(part))
		_, _ = h.Write([]byte{0})
	}
	return int64(h.Sum64())
}

// unlockTimeout bounds giving a lock back: past it the connection is
// dropped, which gives it back too.
const unlockTimeout = 5 * time.Second

// lock takes k's advisory lock. A lock held elsewhere fails at once with
// errConversationBusy under Reject; under Serialize the request waits,
// counted on gauge as waiting, until it gets it, ctx ends (ctx's error)
// or maxWait passes (errWaitTimedOut).
func (a *advisoryLocks) lock(ctx context.Context, k convKey, policy Concurrency, maxWait time.Duration, gauge *Gauge) (unlock func(), err error) {
	conn, err := a.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	key := a.key(k)
	var got bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got); err != nil {
		return nil, errors.Join(err, drop(conn))
	}
	if !got {
		if policy == Reject {
			return nil, errors.Join(errConversationBusy, conn.Close())
		}
		gauge.add(0, 1)
		err := wait(ctx, conn, key, maxWait)
		gauge.add(0, -1)
		if err != nil {
			return nil, err
		}
	}
	var once sync.Once
	return func() { once.Do(func() { release(conn, key) }) }, nil
}

// wait blocks on conn until it holds lock key, for at most maxWait
// (PostgreSQL's lock_timeout, which leaves the connection usable). On
// any other failure the connection is dropped, as it may hold the lock
// all the same (granted just as ctx ended); either way, on failure conn
// is closed.
func wait(ctx context.Context, conn *sql.Conn, key int64, maxWait time.Duration) error {
	if maxWait <= 0 {
		return errors.Join(errWaitTimedOut, conn.Close())
	}
	timeout := strconv.FormatInt(max(maxWait.Milliseconds(), 1), 10) + "ms"
	if _, err := conn.ExecContext(ctx, `SELECT set_config('lock_timeout', $1, false)`, timeout); err != nil {
		return errors.Join(err, drop(conn))
	}
	_, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, key)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available
		if _, err := conn.ExecContext(ctx, `RESET lock_timeout`); err != nil {
			return errors.Join(errWaitTimedOut, drop(conn))
		}
		return errors.Join(errWaitTimedOut, conn.Close())
	case err != nil:
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return errors.Join(err, drop(conn))
	}
	if _, err := conn.ExecContext(ctx, `RESET lock_timeout`); err != nil {
		return errors.Join(err, drop(conn))
	}
	return nil
}

// release gives lock key back and returns conn to the pool, or drops conn
// (which gives the lock back too) if the unlock fails.
func release(conn *sql.Conn, key int64) {
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	var released bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_advisory_unlock($1)`, key).Scan(&released); err != nil || !released {
		_ = drop(conn)
		return
	}
	_ = conn.Close()
}

// drop closes conn's database connection instead of returning it to the
// pool: PostgreSQL then releases whatever locks its session held.
func drop(conn *sql.Conn) error {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	return conn.Close()
}
