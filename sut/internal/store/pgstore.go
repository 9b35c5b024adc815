package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"slices"
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
// after another across all of them (Leases), and each replica's
// cache is checked against the store under the lock (conversations.fresh).

// IsPostgresURL reports whether store names a PostgreSQL database.
func IsPostgresURL(store string) bool {
	return strings.HasPrefix(store, "postgres://") || strings.HasPrefix(store, "postgresql://")
}

// OpenPostgres opens the store in the PostgreSQL database at url, with at
// most maxConns connections open at once (at least 2) for its work, and
// one more it holds all its life, which says it is alive (Leases). A
// turn holds a connection only for what it does in the store: taking
// its conversation's lease and loading it, on one; its commit, on
// another; giving the lease back. None is held while it is at its
// model. Turns may hold all of them but one (connBudget), which is left
// to what runs on the pool (a session's creation, a chained response's
// load and commit), so that those never wait in the turns' line.
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
	db := stdlib.OpenDB(*cfg, stdlib.OptionShouldPing(func(_ context.Context, p stdlib.ShouldPingParams) bool {
		return shouldPing(p.Conn.PgConn().Conn(), p.IdleDuration)
	}))
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
	if st.Shared, err = newLeases(db, cfg, maxConns-1); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store %s: %w", where, err)
	}
	return st, nil
}

// shouldPing reports whether the pooled connection c, idle for idle, is
// pinged before its reuse. When the network to the store breaks, the
// pooled connections die with it, and without a ping each would fail the
// request it is next lent to, once the store is back. But a ping is a
// round trip, and a turn borrows a connection twice: pinging each reuse
// cost a turn two round trips of its five. So a connection is pinged only
// where it was idle a second (pgx's own rule), or where its socket is not
// quiet: closed, reset, or with bytes waiting, as a broken link leaves
// the connections it killed.
func shouldPing(c net.Conn, idle time.Duration) bool {
	return idle > time.Second || !quiet(c)
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
// are allowed). A turn holds one only while it is in the store, never at
// its model; turns past them wait their turn for one, first come first
// served. At the default MaxRequests that is 26, and three replicas, each
// with its connection of life too, fit in the 97 connections an ordinary
// role gets of PostgreSQL's default 100, with room for the operator's
// own.
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
	mu   sync.Mutex
	free int
	// queue is the waiters, each closed when served: those ahead
	// (takeAhead) first, then the others, each in the order they came.
	queue []chan struct{}
	// ahead is how many of queue's first waiters are ahead.
	ahead int
}

func newConnBudget(n int) *connBudget { return &connBudget{free: n} }

// take takes a connection's place, waiting in line until one is free,
// ctx ends (ctx's error) or deadline passes (errStoreBusy).
func (b *connBudget) take(ctx context.Context, deadline time.Time) error {
	return b.wait(ctx, deadline, false)
}

// takeAhead is take for a turn already at work (its commit, its lease
// given back), which waits ahead of every waiter that is not, after
// those ahead already: a turn that has had its model's answer is
// finished before new turns are started, so that no commit waits out a
// crowd of them.
func (b *connBudget) takeAhead(ctx context.Context, deadline time.Time) error {
	return b.wait(ctx, deadline, true)
}

func (b *connBudget) wait(ctx context.Context, deadline time.Time, ahead bool) error {
	b.mu.Lock()
	if b.free > 0 && len(b.queue) == 0 {
		b.free--
		b.mu.Unlock()
		return nil
	}
	granted := make(chan struct{})
	if ahead {
		b.queue = slices.Insert(b.queue, b.ahead, granted)
		b.ahead++
	} else {
		b.queue = append(b.queue, granted)
	}
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
		i := slices.Index(b.queue, granted)
		b.queue = slices.Delete(b.queue, i, i+1)
		if i < b.ahead {
			b.ahead--
		}
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
	b.ahead = max(b.ahead-1, 0)
}

// unlockTimeout bounds giving a lease back, and opening a connection of
// life.
const unlockTimeout = 5 * time.Second

// driverBadConn, returned from a connection's Raw, makes the pool drop
// it instead of keeping it: it broke.
var driverBadConn = driver.ErrBadConn

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
func (a *Leases) connect(ctx context.Context, deadline time.Time, ahead bool) (*sql.Conn, error) {
	if err := a.dialing.wait(ctx, deadline, ahead); err != nil {
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
// is taken within a tenth of a second, seldom enough that a few
// replicas' tries cost the database little. Each refused one is a backend
// started, authenticated and ended: about 23 ms of PostgreSQL 15's CPU on
// a 2-core VM, where a try every 20 ms (as it was) kept most of a core
// busy for every replica with a turn waiting.
const dialPace = 100 * time.Millisecond
