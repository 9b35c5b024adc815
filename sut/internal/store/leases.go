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
// A holder is alive while its beats land: every beatEvery it writes the
// database's time into its row of lease_holders, on one connection it
// keeps open all its life (its connection of life), opened again when it
// breaks. Another process takes over a lease only once its holder's
// latest beat is takeAfter old on the database's clock: the holder died,
// or has not reached the database for that long. A process that dies
// leaves its leases to be taken takeAfter after its last beat; one that
// stops gives them all back at once (Close).
//
// A holder stops its own turns first: once its latest beat that landed
// was sent fenceAfter ago, it ends every turn at work under its leases
// (Lease.Context), well before anybody may take them, and takes no new
// lease until a beat lands again. A process cut off from the database
// (a network fault, the database restarting) thus never runs a model
// call beside another process's turn on the same conversation, however
// soon the database notices it gone. What may still come late, a commit,
// is fenced: every taking adds one to the epoch, and a commit checks, in
// its own transaction and with the lease's row locked, that the epoch is
// still the one its turn took (ErrLeaseLost), and gives the lease back in
// that same transaction. So only the last holder of a conversation ever
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
	// holder is this process's number in lease_holders.
	holder int64
	// landed is when the latest beat that landed was sent, by this
	// process's clock; fence fires fenceAfter after it.
	landed time.Time
	fence  *time.Timer
	// fenced is set from fence's firing until a beat lands: every lease
	// taken meanwhile is lost at once.
	fenced bool
	// held is the leases of the turns at work, which a fence ends.
	held map[*Lease]struct{}
	// stop ends the beats (Close); done is closed when they have ended.
	stop context.CancelFunc
	done chan struct{}
}

// The beats' pace and bounds. A holder fences its turns fenceAfter after
// the send of its latest beat that landed; another process takes its
// leases takeAfter after that beat landed, by the database's clock, which
// is later still: the margin between them is the longest a fenced turn
// may take to drop its model call (a process starved of CPU included).
const (
	beatEvery  = 250 * time.Millisecond
	fenceAfter = 1500 * time.Millisecond
	takeAfter  = 3 * time.Second
)

// ErrLeaseLost: a turn's hold on its conversation lapsed while it ran:
// its commit found the conversation taken since by another process, or
// its own process ended it, its beats not landing (Lease.Context). The
// turn commits nothing.
var ErrLeaseLost = errors.New("this turn's hold on its conversation lapsed; nothing was committed")

// LifeName is the application_name of a connection of life, as
// pg_stat_activity shows it.
const LifeName = "turncheck serve: connection of life"

// newLeases returns the leases of the store on db, having opened its
// connection of life with cfg and landed its first beat: turns may hold
// at most turnConns connections at once.
func newLeases(db *sql.DB, cfg *pgx.ConnConfig, turnConns int) (*Leases, error) {
	ctx, stop := context.WithCancel(context.Background())
	cfg = cfg.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = LifeName
	a := &Leases{db: db, cfg: cfg, budget: newConnBudget(turnConns), dialing: newConnBudget(1),
		// A positive number of 62 bits: never met again, and no other
		// process's.
		holder: rand.Int64N(1<<62-1) + 1,
		held:   map[*Lease]struct{}{}, stop: stop, done: make(chan struct{})}
	a.fence = time.AfterFunc(time.Hour, a.fenceAll)
	a.fence.Stop()
	conn, err := a.live(ctx)
	if err == nil {
		err = a.beat(ctx, conn)
	}
	if err != nil {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
		stop()
		return nil, err
	}
	go a.beating(ctx, conn)
	return a, nil
}

// live opens a connection of life, within fenceAfter: a dial that hangs
// (the network to the database down) is given up and tried again on
// the next beat, so that a process comes back as soon as the network
// does.
func (a *Leases) live(ctx context.Context) (*pgx.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, fenceAfter)
	defer cancel()
	conn, err := pgx.ConnectConfig(dctx, a.cfg)
	if err != nil {
		return nil, fmt.Errorf("connection of life: %w", err)
	}
	return conn, nil
}

// beat writes the database's time into this process's row of
// lease_holders, and on success moves the fence to fenceAfter from the
// beat's send.
func (a *Leases) beat(ctx context.Context, conn *pgx.Conn) error {
	a.mu.Lock()
	holder := a.holder
	a.mu.Unlock()
	sent := time.Now()
	bctx, cancel := context.WithTimeout(ctx, fenceAfter)
	defer cancel()
	if _, err := conn.Exec(bctx, `INSERT INTO lease_holders (holder, seen) VALUES ($1, now())
		ON CONFLICT (holder) DO UPDATE SET seen = now()`, holder); err != nil {
		return fmt.Errorf("connection of life: beat: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if holder == a.holder && sent.After(a.landed) {
		a.landed, a.fenced = sent, false
		a.fence.Reset(fenceAfter - time.Since(sent))
	}
	return nil
}

// beating beats every beatEvery on the connection of life, opening
// another when it breaks, until ctx ends.
func (a *Leases) beating(ctx context.Context, conn *pgx.Conn) {
	defer close(a.done)
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	tick := time.NewTicker(beatEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if conn == nil {
			var err error
			if conn, err = a.live(ctx); err != nil {
				continue
			}
		}
		if err := a.beat(ctx, conn); err != nil && ctx.Err() == nil {
			// Broken, or too slow to say alive: a new one.
			_ = conn.Close(context.Background())
			conn = nil
		}
	}
}

// fenceAll ends every turn at work under this process's leases, and
// every lease taken until a beat lands again: no beat landed for
// fenceAfter, and from takeAfter on another process may take them.
func (a *Leases) fenceAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if time.Since(a.landed) < fenceAfter {
		return // a beat landed as the timer fired
	}
	a.fenced = true
	for l := range a.held {
		l.lose(errFenced)
	}
}

// errFenced is why a turn at work was ended by its own process, and a
// lease not taken: its hold on its conversations lapsed (no beat of its
// landed for fenceAfter, or a lease could not be given back).
var errFenced = fmt.Errorf("%w (this server could not reach its store for a while)", ErrLeaseLost)

// hold counts l among the leases a fence ends, and ends it at once if
// this process is fenced now.
func (a *Leases) hold(l *Lease) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.held[l] = struct{}{}
	if a.fenced {
		l.lose(errFenced)
	}
}

// unhold forgets l, given back.
func (a *Leases) unhold(l *Lease) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.held, l)
}

// number is this process's holder number.
func (a *Leases) number() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.holder
}

// Close ends the beats and gives back every lease of this process at
// once, by deleting its row of lease_holders: the server's turns have
// ended by then.
func (a *Leases) Close() {
	a.stop()
	<-a.done
	a.fence.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	_, _ = a.db.ExecContext(ctx, `DELETE FROM lease_holders WHERE holder = $1`, a.number())
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
	// ctx ends when the lease is lost to a fence (Context).
	ctx  context.Context
	lose context.CancelCauseFunc
}

// Context ends when this process stops the lease's turn for want of
// beats (the leases' doc comment says why); its cause is then
// ErrLeaseLost. The turn's model calls and tool runs are to end with it.
func (l *Lease) Context() context.Context { return l.ctx }

// Lapsed reports whether l was lost to a fence; false for no lease.
func (l *Lease) Lapsed() bool {
	return l != nil && errors.Is(context.Cause(l.ctx), ErrLeaseLost)
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
// (ErrWaitTimedOut). While this process's beats do not land it takes no
// lease, under either policy: it waits for a beat as for a busy
// conversation, and fails with ErrLeaseLost at the end of maxWait.
func (a *Leases) Lock(ctx context.Context, k Key, policy config.Concurrency, maxWait time.Duration, gauge *admission.Gauge) (_ *Lease, unlock func(), err error) {
	deadline := time.Now().Add(maxWait)
	waiting := false
	defer func() {
		if waiting {
			gauge.Add(0, -1)
		}
	}()
	for {
		l, err := a.tryLock(ctx, k, deadline)
		if err == nil {
			var once sync.Once
			return l, func() { once.Do(l.release) }, nil
		}
		busy := errors.Is(err, ErrConversationBusy)
		if !busy && !errors.Is(err, errFenced) || busy && policy == config.Reject {
			return nil, nil, err
		}
		if !waiting {
			waiting = true
			gauge.Add(0, 1)
		}
		left := time.Until(deadline)
		if left <= 0 {
			if busy {
				return nil, nil, ErrWaitTimedOut
			}
			return nil, nil, err
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(min(leasePace, left)):
		}
	}
}

// tryLock takes k's lease once, with a connection borrowed within
// deadline, or fails: ErrConversationBusy where a live holder has it,
// errFenced while this process's beats do not land (it takes nothing
// then, and waits for one as for a busy conversation).
func (a *Leases) tryLock(ctx context.Context, k Key, deadline time.Time) (*Lease, error) {
	if a.isFenced() {
		return nil, errFenced
	}
	conn, err := a.borrow(ctx, deadline, false)
	if err != nil {
		return nil, err
	}
	epoch, err := a.take(ctx, conn, k)
	if err != nil {
		a.giveBack(conn, err)
		return nil, err
	}
	l := &Lease{a: a, k: k, epoch: epoch, conn: conn}
	l.ctx, l.lose = context.WithCancelCause(context.Background())
	a.hold(l)
	return l, nil
}

// leasePace is how often a turn waiting for a lease another process
// holds asks again: the lease holds no connection to be woken on, and a
// turn of a few hundred milliseconds should not wait much past its end.
const leasePace = 10 * time.Millisecond

// take takes k's lease on conn for this process's holder: a lease given
// back (holder 0), one whose holder's latest beat is takeAfter old, one
// never taken, or one of this process's own, which no other turn of it
// holds (Locks.Lock takes the conversation's lock in the process first):
// one a take whose outcome was not known left. It returns the lease's new
// epoch, or ErrConversationBusy where a live holder has it.
func (a *Leases) take(ctx context.Context, conn *sql.Conn, k Key) (int64, error) {
	holder := a.number()
	// Not ended by ctx: a statement cut short may have taken the lease
	// all the same.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
	defer cancel()
	var epoch int64
	err := conn.QueryRowContext(tctx, `INSERT INTO leases AS l (scope, conversation, holder, epoch) VALUES ($1, $2, $3, 1)
		ON CONFLICT (scope, conversation) DO UPDATE SET holder = EXCLUDED.holder, epoch = l.epoch + 1
		WHERE l.holder = 0 OR l.holder = EXCLUDED.holder OR NOT EXISTS (
			SELECT 1 FROM lease_holders h WHERE h.holder = l.holder AND h.seen > now() - $4 * interval '1 millisecond')
		RETURNING epoch`, k.Scope, k.ID, holder, takeAfter.Milliseconds()).Scan(&epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, ErrConversationBusy
	}
	if err != nil {
		// Whether it was taken is not known (the connection broke, or
		// the statement timed out): it is given back, if it was.
		a.letGo(k, holder)
		return 0, fmt.Errorf("take conversation: %w", err)
	}
	return epoch, nil
}

// letGo gives k's lease back if holder, this process, holds it, after a
// take whose outcome is not known; the conversation's lock in this
// process is still held, so no turn of it holds the lease. Where that
// fails too, the process takes a new number (endLife): the lease is
// then anybody's takeAfter on.
func (a *Leases) letGo(k Key, holder int64) {
	ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
	defer cancel()
	conn, err := a.borrow(ctx, time.Now().Add(unlockTimeout), true)
	if err == nil {
		_, err = conn.ExecContext(ctx, `UPDATE leases SET holder = 0 WHERE scope = $1 AND conversation = $2 AND holder = $3`,
			k.Scope, k.ID, holder)
		a.giveBack(conn, err)
	}
	if err != nil {
		a.endLife()
	}
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

// release gives the lease back, if it is still the turn's. Where that
// fails, the lease would stay this process's for as long as it lives:
// the process takes a new number instead (endLife).
func (l *Lease) release() {
	// Its context is left as it is: ending it would end the turn,
	// which may still be answering its client.
	defer l.a.unhold(l)
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

// endLife lets go of every lease under this process's number for good,
// where one could not be given back: the process takes a new number,
// whose beats start with the next, and ends every turn at work under
// the old one now, long before the old number's leases are anybody's
// (takeAfter after its last beat).
func (a *Leases) endLife() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.holder = rand.Int64N(1<<62-1) + 1
	a.landed, a.fenced = time.Time{}, true
	for l := range a.held {
		l.lose(errFenced)
	}
}

// isFenced reports whether this process takes no lease now: no beat
// landed for fenceAfter.
func (a *Leases) isFenced() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fenced
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
