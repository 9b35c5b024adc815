package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
)

// A store on PostgreSQL is shared by every replica of the server that
// names it: each commit is durable when it returns (synchronous_commit
// on, whatever the server's default), one conversation's turns run one
// after another across all of them (advisoryLocks), and each replica's
// cache is checked against the store under the lock (conversations.fresh).

// IsPostgresURL reports whether store names a PostgreSQL database.
func IsPostgresURL(store string) bool {
	return strings.HasPrefix(store, "postgres://") || strings.HasPrefix(store, "postgresql://")
}

// OpenPostgres opens the store in the PostgreSQL database at url, with at
// most maxConns connections open at once (at least 2). A turn does all it
// does in the store (its lock, its load, its commit) on one connection,
// which it holds from its lock to its release (advisoryLocks.lock): it
// never waits for a second one while it holds a lock on the first. Turns
// may hold all of them but one (connBudget), which is left to what runs
// on the pool (a session's creation, a chained response's load and
// commit), so that those never wait for a model call to end.
func OpenPostgres(url string, maxConns int) (*Store, error) {
	if maxConns < 2 {
		return nil, fmt.Errorf("max store conns %d: want at least 2, one for turns and one for the rest", maxConns)
	}
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
	db.SetMaxOpenConns(maxConns)
	// Every connection may stay open while in use now and then (a new
	// one costs PostgreSQL a new backend), but one unused for a while is
	// given back: the database's connections are shared by every replica.
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxIdleTime(pgIdleTime)
	st, err := initStore(db, postgresDialect, where)
	if err != nil {
		return nil, err
	}
	var schema string
	if err := db.QueryRow(`SELECT current_schema()`).Scan(&schema); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store %s: %w", where, err)
	}
	st.Shared = &AdvisoryLocks{db: db, schema: schema, budget: newConnBudget(maxConns - 1), dialing: newConnBudget(1)}
	return st, nil
}

// ConnRoom is how many connections PostgreSQL lets the store's role open
// at once: max_connections, less the slots kept for superusers (and, from
// PostgreSQL 16, for roles with pg_use_reserved_connections) unless the
// role is a superuser, and at most the role's CONNECTION LIMIT. ok is
// false where the store is no PostgreSQL one, or the database did not
// say.
func (s *Store) ConnRoom(ctx context.Context) (room int, ok bool) {
	if s.Shared == nil {
		return 0, false
	}
	var reserved, limit int
	var super bool
	err := s.Shared.db.QueryRowContext(ctx, `SELECT current_setting('max_connections')::int,
		current_setting('superuser_reserved_connections')::int + COALESCE(NULLIF(current_setting('reserved_connections', true), '')::int, 0),
		rolconnlimit, rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&room, &reserved, &limit, &super)
	if err != nil {
		return 0, false
	}
	if !super {
		room -= reserved
	}
	if limit >= 0 {
		room = min(room, limit)
	}
	return room, true
}

// pgIdleTime is how long an unused connection to PostgreSQL stays open.
const pgIdleTime = time.Minute

// DefaultMaxStoreConns is the default of Config.MaxStoreConns for a server
// that works on at most maxRequests turns at once: a connection for every
// 20 turns, and at least 8 (or one a turn and one more, where fewer turns
// are allowed). A turn holds its connection for its model call, so the
// turns past them wait their turn for one, first come first served. At
// the default MaxRequests that is 26, and three replicas fit in the 97
// connections an ordinary role gets of PostgreSQL's default 100, with
// room for the operator's own.
func DefaultMaxStoreConns(maxRequests int) int {
	return max((maxRequests+19)/20, min(maxRequests+1, 8))
}

// errStoreBusy: no connection to the store came free, or the database
// took no new one, before the turn's wait for it ended. The turn is
// refused before any model call (503, Retry-After).
var errStoreBusy = errors.New("every connection to the store is in use")

// RefusedBy names who refused a turn a connection (err, StoreFull):
// "postgresql", where the database took no new one, or "store_pool",
// where the server's own connections were all held by turns.
func RefusedBy(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return "postgresql"
	}
	return "store_pool"
}

// StoreFull reports whether err is PostgreSQL refusing a connection for
// want of room (too many clients, the slots left reserved, a server
// starting or stopping): it may take one a moment later, and a turn
// refused for it is refused for load, not for a fault.
func StoreFull(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return errors.Is(err, errStoreBusy)
	}
	switch pgErr.Code {
	case "53300", // too_many_connections, and the reserved slots
		"53000", // insufficient_resources
		"57P03": // cannot_connect_now
		return true
	}
	return false
}

// connBudget hands out the connections that turns may hold, first come
// first served: database/sql hands a freed connection to a random waiter,
// which under load leaves some turns waiting far longer than others.
type connBudget struct {
	mu    sync.Mutex
	free  int
	queue []chan struct{} // the waiters, in the order they came; closed when served
}

func newConnBudget(n int) *connBudget { return &connBudget{free: n} }

// take takes a connection's place, waiting in line until one is free,
// ctx ends (ctx's error) or deadline passes (errStoreBusy).
func (b *connBudget) take(ctx context.Context, deadline time.Time) error {
	b.mu.Lock()
	if b.free > 0 && len(b.queue) == 0 {
		b.free--
		b.mu.Unlock()
		return nil
	}
	granted := make(chan struct{})
	b.queue = append(b.queue, granted)
	b.mu.Unlock()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var err error
	select {
	case <-granted:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = errStoreBusy
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-granted:
		// Served while giving up: the place is ours, so pass it on.
		b.giveLocked()
	default:
		b.queue = slices.DeleteFunc(b.queue, func(q chan struct{}) bool { return q == granted })
	}
	return err
}

// give gives a place back, to the first waiter if any.
func (b *connBudget) give() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.giveLocked()
}

func (b *connBudget) giveLocked() {
	if len(b.queue) == 0 {
		b.free++
		return
	}
	close(b.queue[0])
	b.queue = slices.Delete(b.queue, 0, 1)
}

// AdvisoryLocks are conversation locks that hold across processes: a
// PostgreSQL session-level advisory lock, keyed by the conversation
// (advisoryLocks.key) and taken on a connection that the turn keeps until it
// releases the lock. A process that dies loses its connections, and
// PostgreSQL releases their locks with them.
type AdvisoryLocks struct {
	db *sql.DB
	// schema is the store's schema: advisory locks are the database's,
	// and stores in other schemas of it are other servers.
	schema string
	// budget bounds the connections turns hold, one a turn.
	budget *connBudget
	// dialing is the line the turns of this process wait in for a new
	// connection to the database (connect): one tries at a time, in the
	// order they came, at one pace, so that no turn that came later gets
	// in before one that has waited, and every replica tries as often.
	dialing *connBudget
	// Refused, if set, hears of each time PostgreSQL refused a new
	// connection for want of room (StoreFull), though a later try may
	// have got one: set once, before any turn.
	Refused func(err error)
}

// key is k's advisory lock key: a 64-bit FNV-1a hash of the store's
// schema and k's scope and id, the same in every process. Two
// conversations that share one only wait for each other.
func (a *AdvisoryLocks) key(k Key) int64 {
	h := fnv.New64a()
	for _, part := range []string{a.schema, k.Scope, k.ID} {
		_, _ = h.Write([]byte(part))
		_, _ = h.Write([]byte{0})
	}
	return int64(h.Sum64())
}

// unlockTimeout bounds giving a lock back: past it the connection is
// dropped, which gives it back too.
const unlockTimeout = 5 * time.Second

// Lock takes k's advisory lock, on a connection that it returns: the
// turn's, for everything it does in the store until unlock. It first
// waits in line for a connection (connBudget), then for the database to
// take it (storeFull), both within maxWait, or fails with errStoreBusy. A
// lock held elsewhere then fails at once with errConversationBusy under
// Reject; under Serialize the request waits, counted on gauge as
// waiting, until it gets it, ctx ends (ctx's error) or what is left of
// maxWait passes (errWaitTimedOut).
func (a *AdvisoryLocks) Lock(ctx context.Context, k Key, policy config.Concurrency, maxWait time.Duration, gauge *admission.Gauge) (_ *sql.Conn, unlock func(), err error) {
	deadline := time.Now().Add(maxWait)
	if err := a.budget.take(ctx, deadline); err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			a.budget.give()
		}
	}()
	conn, err := a.connect(ctx, deadline)
	if err != nil {
		return nil, nil, err
	}
	key := a.key(k)
	var got bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&got); err != nil {
		return nil, nil, errors.Join(err, drop(conn))
	}
	if !got {
		if policy == config.Reject {
			return nil, nil, errors.Join(ErrConversationBusy, conn.Close())
		}
		gauge.Add(0, 1)
		err := wait(ctx, conn, key, time.Until(deadline))
		gauge.Add(0, -1)
		if err != nil {
			return nil, nil, err
		}
	}
	var once sync.Once
	return conn, func() { once.Do(func() { release(conn, key); a.budget.give() }) }, nil
}

// connect returns a connection of the pool, trying again while the
// database refuses new ones for want of room (storeFull) until deadline;
// past it the error is errStoreBusy, with the database's. It gives up
// only once deadline has passed, never before: a turn on a busy
// conversation is refused only after the wait the server declares.
//
// The turns of this process try one at a time, in the order they came
// (dialing), each again every dialPace while the database is full: an
// exponential backoff of each turn's own would let a turn that came
// later, still trying often, take the connection freed before one that
// has waited long, and a replica whose turns had waited longest would
// starve beside the others.
func (a *AdvisoryLocks) connect(ctx context.Context, deadline time.Time) (*sql.Conn, error) {
	if err := a.dialing.take(ctx, deadline); err != nil {
		return nil, err
	}
	defer a.dialing.give()
	for {
		conn, err := a.db.Conn(ctx)
		if err == nil || !StoreFull(err) {
			return conn, err
		}
		if a.Refused != nil {
			a.Refused(err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, errors.Join(errStoreBusy, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(min(dialPace, left)):
		}
	}
}

// dialPace is how often the turn first in line tries the database again
// while it takes no new connection: often enough that a connection freed
// is taken at once, seldom enough that a few replicas' tries cost the
// database little (each refused one is a backend started and ended).
const dialPace = 20 * time.Millisecond

// Wait blocks on conn until it holds lock key, for at most maxWait
// (PostgreSQL's lock_timeout, which leaves the connection usable). On
// any other failure the connection is dropped, as it may hold the lock
// all the same (granted just as ctx ended); either way, on failure conn
// is closed.
func wait(ctx context.Context, conn *sql.Conn, key int64, maxWait time.Duration) error {
	if maxWait <= 0 {
		return errors.Join(ErrWaitTimedOut, conn.Close())
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
			return errors.Join(ErrWaitTimedOut, drop(conn))
		}
		return errors.Join(ErrWaitTimedOut, conn.Close())
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

// Release gives lock key back and returns conn to the pool, or drops conn
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
