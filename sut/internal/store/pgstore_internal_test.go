package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConnBudgetFirstComeFirstServed: the places turns hold connections
// in go to their waiters in the order they came (database/sql's own pool
// picks one at random), a waiter past its deadline is refused with
// errStoreBusy, one whose context ends with its error, and neither loses
// a place.
func TestConnBudgetFirstComeFirstServed(t *testing.T) {
	ctx := context.Background()
	far := time.Now().Add(time.Hour)
	b := newConnBudget(1)
	require.NoError(t, b.take(ctx, far))
	served := make(chan int, 3)
	for i := range 3 {
		go func() {
			if b.take(ctx, far) == nil {
				served <- i
			}
		}()
		for queued(b) != i+1 { // the next waiter comes after this one
			time.Sleep(time.Millisecond)
		}
	}
	for i := range 3 {
		b.give()
		assert.Equal(t, i, <-served, "served in the order they came")
	}
	assert.ErrorIs(t, b.take(ctx, time.Now()), errStoreBusy, "none free, and no time to wait")
	gone, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, b.take(gone, far), context.Canceled)
	b.give()
	require.NoError(t, b.take(ctx, time.Now()), "the place given back is free, not lost to those who gave up")
	assert.Equal(t, 0, queued(b))
}

// TestConnBudgetTurnsAtWorkGoFirst: turns that have had their model's
// answer and wait for a connection to commit on (takeAhead) are served
// before the turns not started yet, though those came before them; each
// kind is served in the order it came.
func TestConnBudgetTurnsAtWorkGoFirst(t *testing.T) {
	ctx := context.Background()
	far := time.Now().Add(time.Hour)
	b := newConnBudget(1)
	require.NoError(t, b.take(ctx, far))
	served := make(chan string, 4)
	for i, who := range []string{"new 1", "commit 1", "new 2", "commit 2"} {
		take := b.take
		if strings.HasPrefix(who, "commit") {
			take = b.takeAhead
		}
		go func() {
			if take(ctx, far) == nil {
				served <- who
			}
		}()
		for queued(b) != i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	for _, want := range []string{"commit 1", "commit 2", "new 1", "new 2"} {
		b.give()
		assert.Equal(t, want, <-served)
	}
}

// queued is how many wait in b's line.
func queued(b *connBudget) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// TestStoreFull: what PostgreSQL answers a connection it has no room
// for, and the server's own budget running out, are load (storeFull);
// other errors are not.
func TestStoreFull(t *testing.T) {
	for code, full := range map[string]bool{"53300": true, "57P03": true, "53000": true, "23505": false, "42P01": false} {
		assert.Equal(t, full, StoreFull(&pgconn.PgError{Code: code}), code)
		assert.Equal(t, full, StoreFull(errors.Join(errors.New("connect"), &pgconn.PgError{Code: code})), "wrapped %s", code)
	}
	assert.True(t, StoreFull(errStoreBusy))
	assert.False(t, StoreFull(errors.New("connection refused")))
}
