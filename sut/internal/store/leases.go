package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
)

// Leases are conversation locks that hold across processes, and hold no
// connection to the database while a turn is at its model: a row of the
// leases table names the process that holds a conversation (its holder)
// and how many times the conversation was taken (its epoch).
//
// A holder is alive while it holds a session-level advisory lock of its
// own number on one connection it keeps open all its life (life). A
// process that dies loses that connection, and PostgreSQL the lock with
// it: its leases are then taken by the next turn that asks, at once, with
// no timeout to wait out. A process whose connection of life breaks
// (the database restarted, a network fault, an administrator ended it)
// holds its number again on a new one as soon as it can; meanwhile its
// leases are anybody's, and it goes on taking leases under its number,
// which the fence below keeps safe. Only where it let go of its leases
// on purpose (endLife) does it take a new number.
//
// A lease taken over so from a process that is still at work is fenced:
// every taking adds one to the epoch, and a commit checks, in its own
// transaction and with the lease's row locked, that the epoch is still
// the one its turn took (ErrLeaseLost), and gives the lease back in that
// same transaction. So only the last holder of a conversation ever
// commits to it.
type Leases struct {
	db *sql.DB
	// cfg dials the connection of life, which is not one of the pool's:
	// the pool's are handed out and given back, this one is held.
	cfg *pgx.ConnConfig
	// budget bounds the connections turns hold at once, one a turn, for
	// a statement or two (take, load, commit, give back).
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

	mu sync.Mutex
	// holder is this process's number, which its connection of life
	// holds the advisory lock of while it is open.
	holder int64
	// renew, set by endLife, gives the next connection of life a new
	// number: the leases under the old one are let go for good.
	renew bool
	// life is the connection of life; nil while it is being opened.
	life *pgx.Conn
	// stop ends the watch of the connection of life (Close); done is
	// closed when it has ended.
	stop context.CancelFunc
	done chan struct{}
}

// ErrLeaseLost: a turn's commit found its conversation taken since by
// another process, which found this one's connection of life gone. The
// turn commits nothing.
var ErrLeaseLost = errors.New("the conversation was taken over by another turn while this one ran; nothing was committed")

// newLeases returns the leases of the store on db, whose connection of
// life it dials with cfg, having taken a holder's number: turns may
// hold at most turnConns connections at once.
func newLeases(db *sql.DB, cfg *pgx.ConnConfig, turnConns int) (*Leases, error) {
	ctx, stop := context.WithCancel(context.Background())
	a := &Leases{db: db, cfg: cfg, budget: newConnBudget(turnConns), dialing: newConnBudget(1),
		stop: stop, done: make(chan struct{})}
	conn, err := a.live(ctx)
	if err != nil {
		stop()
		return nil, err
	}
	go a.watch(ctx, conn)
	return a, nil
}

// live opens a connection of life under this process's number, or a new
// one where it has none yet or is to renew it.
func (a *Leases) live(ctx context.Context) (*pgx.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, unlockTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(dctx, a.cfg)
	if err != nil {
		return nil, fmt.Errorf("connection of life: %w", err)
	}
	a.mu.Lock()
	holder, fresh := a.holder, a.holder == 0 || a.renew
	if fresh {
		// A positive number of 62 bits: never met again, and no other
		// process's.
		holder = rand.Int64N(1<<62-1) + 1
	}
	a.mu.Unlock()
	if _, err := conn.Exec(dctx, `SELECT pg_advisory_lock($1)`, holder); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("connection of life: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.renew && !fresh {
		// Let go of meanwhile (endLife): the old number is not to be
		// held again.
		_ = conn.Close(context.Background())
		return nil, errors.New("connection of life: its number was let go of")
	}
	a.holder, a.life, a.renew = holder, conn, false
	return conn, nil
}

// watch waits on the connection of life until it breaks, then opens
// another, trying again at a growing pace (at most lifePace) while the
// database takes none, until ctx ends.
func (a *Leases) watch(ctx context.Context, conn *pgx.Conn) {
	defer close(a.done)
	for {
		// Nothing is ever notified on it: the wait ends when the
		// connection breaks, or ctx does.
		_ = conn.PgConn().WaitForNotification(ctx)
		a.mu.Lock()
		a.life = nil
		a.mu.Unlock()
		_ = conn.Close(context.Background())
		pace := 10 * time.Millisecond
		for {
			if ctx.Err() != nil {
				return
			}
			next, err := a.live(ctx)
			if err == nil {
				conn = next
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(pace):
			}
			pace = min(2*pace, lifePace)
		}
	}
}

// lifePace is how long, at most, a process whose connection of life
// broke waits between tries to open another: its leases are anybody's
// until it does.
const lifePace = 250 * time.Millisecond

// number is this process's holder number. A turn takes its lease under
// it whether the connection of life is open or not: while it is not,
// another process may take the lease over, and the fence fails this
// turn's commit; a turn never waits for it.
func (a *Leases) number() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.holder
}

// Close ends the connection of life: every lease of this process is
// then anybody's.
func (a *Leases) Close() {
	a.stop()
	<-a.done
	a.mu.Lock()
	life := a.life
	a.life = nil
	a.mu.Unlock()
	if life != nil {
		_ = life.Close(context.Background())
	}
}

// A Lease is a conversation held by a turn of this process, until its
// unlock: its epoch is the one its commit checks (fence).
type Lease struct {
	a     *Leases
	k     Key
	epoch int64
	// conn is the connection the lease was taken on, held on through
	// the turn's load, so that taking and loading cost one connection
	// once: nil from Rest on.
	conn *sql.Conn
	// given is set once a commit under the lease gave it back (fence).
	given atomic.Bool
}

// Lock takes k's lease and returns it with the connection it was taken
// on, which the turn loads on and then gives back (Rest): no connection
// is held while the turn is at its model. It first waits in line for a
// connection (connBudget), then for the database to take it
// (StoreFull), both within maxWait, or fails with errStoreBusy. A lease
// held by a live process fails at once with ErrConversationBusy under
// Reject; under Serialize the request waits, counted on gauge as
// waiting, holding no connection, asking again every leasePace, until
// it gets it, ctx ends (ctx's error) or what is left of maxWait passes
// (ErrWaitTimedOut).
func (a *Leases) Lock(ctx context.Context, k Key, policy config.Concurrency, maxWait time.Duration, gauge *admission.Gauge) (_ *Lease, unlock func(), err error) {
	deadline := time.Now().Add(maxWait)
	waiting := false
	defer func() {
		if waiting {
			gauge.Add(0, -1)
		}
	}()
	for {
		conn, err := a.borrow(ctx, deadline, false)
		if err != nil {
			return nil, nil, err
		}
		epoch, err := a.take(ctx, conn, k)
		if err == nil {
			l := &Lease{a: a, k: k, epoch: epoch, conn: conn}
			var once sync.Once
			return l, func() { once.Do(l.release) }, nil
		}
		a.giveBack(conn, err)
		if !errors.Is(err, ErrConversationBusy) {
			return nil, nil, err
		}
		if policy == config.Reject {
			return nil, nil, err
		}
		if !waiting {
			waiting = true
			gauge.Add(0, 1)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, nil, ErrWaitTimedOut
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(min(leasePace, left)):
		}
	}
}

// leasePace is how often a turn waiting for a lease another process
// holds asks again: the lease holds no connection to be woken on, and a
// turn of a few hundred milliseconds should not wait much past its end.
const leasePace = 10 * time.Millisecond

// take takes k's lease on conn for this process's holder: a lease given
// back (holder 0), or one whose holder's connection of life is gone
// (its advisory lock is free, which pg_try_advisory_xact_lock_shared
// tells without holding it past the statement), or one never taken. It
// returns the lease's new epoch, or ErrConversationBusy where a live
// holder has it.
func (a *Leases) take(ctx context.Context, conn *sql.Conn, k Key) (int64, error) {
	holder := a.number()
	// Not ended by ctx: a statement cut short may have taken the lease
	// all the same, which nobody would then give back.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	var epoch int64
	err := conn.QueryRowContext(tctx, `INSERT INTO leases AS l (scope, conversation, holder, epoch) VALUES ($1, $2, $3, 1)
		ON CONFLICT (scope, conversation) DO UPDATE SET holder = EXCLUDED.holder, epoch = l.epoch + 1
		WHERE CASE WHEN l.holder = 0 THEN true ELSE pg_try_advisory_xact_lock_shared(l.holder) END
		RETURNING epoch`, k.Scope, k.ID, holder).Scan(&epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, ErrConversationBusy
	}
	if err != nil {
		// Whether it was taken is not known (the connection broke, or
		// the statement timed out): every lease of this process's
		// number is let go, so that this one is not held for ever.
		a.endLife()
		return 0, fmt.Errorf("take conversation: %w", err)
	}
	return epoch, nil
}

// borrow takes a place in line and a connection, within deadline: for
// a statement or two, given back with giveBack. A turn already at work
// (its commit, its lease given back) waits ahead of the turns not
// started yet (connBudget.takeAhead).
func (a *Leases) borrow(ctx context.Context, deadline time.Time, ahead bool) (*sql.Conn, error) {
	if err := a.budget.wait(ctx, deadline, ahead); err != nil {
		return nil, err
	}
	conn, err := a.connect(ctx, deadline, ahead)
	if err != nil {
		a.budget.give()
		return nil, err
	}
	return conn, nil
}

// giveBack returns conn to the pool, or drops it where what ran on it
// failed for want of it (lostConnection), and gives its place back.
func (a *Leases) giveBack(conn *sql.Conn, err error) {
	if err != nil && !errors.Is(err, ErrConversationBusy) && lostConnection(err) {
		_ = conn.Raw(func(any) error { return driverBadConn })
	}
	_ = conn.Close()
	a.budget.give()
}

// Rest gives back the connection the lease was taken on, once the turn
// has loaded on it: the turn holds none until its commit.
func (l *Lease) Rest() {
	if l == nil || l.conn == nil {
		return
	}
	l.a.giveBack(l.conn, nil)
	l.conn = nil
}

// release gives the lease back, if it is still this turn's. Where that
// fails, the lease would stay this process's for as long as it lives:
// the connection of life is ended instead, and every lease of this
// process with it (its turns at work are fenced, not let through).
func (l *Lease) release() {
	if l.given.Load() {
		l.Rest()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	conn := l.conn
	l.conn = nil
	if conn == nil {
		var err error
		if conn, err = l.a.borrow(ctx, time.Now().Add(unlockTimeout), true); err != nil {
			l.a.endLife()
			return
		}
	}
	_, err := conn.ExecContext(ctx, `UPDATE leases SET holder = 0 WHERE scope = $1 AND conversation = $2 AND epoch = $3`,
		l.k.Scope, l.k.ID, l.epoch)
	l.a.giveBack(conn, err)
	if err != nil {
		l.a.endLife()
	}
}

// endLife ends the connection of life, which watch then opens again
// under a new number: every lease under the old one is let go for good.
func (a *Leases) endLife() {
	a.mu.Lock()
	life := a.life
	a.renew = true
	a.mu.Unlock()
	if life != nil {
		// Closing the network connection under WaitForNotification
		// ends that wait, and watch takes it from there.
		_ = life.PgConn().Conn().Close()
	}
}

// fence checks, in tx, that l is still the turn's, and gives it back
// with tx: its row locked until tx ends, so no other process takes it
// between the check and the commit, and given back by the commit itself,
// which is the last the turn writes (committed says so, once tx is).
func (l *Lease) fence(ctx context.Context, tx *sql.Tx) error {
	res, err := tx.ExecContext(ctx, `UPDATE leases SET holder = 0 WHERE scope = $1 AND conversation = $2 AND epoch = $3`, l.k.Scope, l.k.ID, l.epoch)
	if err != nil {
		return fmt.Errorf("commit: check the lease: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return ErrLeaseLost
	}
	return nil
}

// committed marks l given back by a commit (fence) that landed: its
// release has nothing left to write.
func (l *Lease) committed() { l.given.Store(true) }
