package sut

import (
	"bytes"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEvictionOrder: past the cap, a newcomer takes the place of a
// connection that has not sent its request head within headWindow, then
// of one idle between requests, then of one whose head is in (its body
// still coming), and only then of one still within its headWindow; never
// of one running a turn; within a class, the oldest. The cap being hit is
// logged once per capLogEvery, with what it cost.
func TestEvictionOrder(t *testing.T) {
	var log bytes.Buffer
	tr := newConnTracker(4, slog.New(slog.NewTextHandler(&log, nil)))
	admit := func() *trackedConn {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		tc := tr.admit(a)
		require.NotNil(t, tc)
		return tc
	}
	evicted := func() *trackedConn {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.victimLocked()
	}
	// Oldest first: a turn, a request being read, an idle one, a header
	// slowloris past its window.
	turn, reading, idle, stalled := admit(), admit(), admit(), admit()
	turn.enter()
	require.True(t, turn.work())
	reading.enter()
	idle.enter()
	idle.leave()
	tr.mu.Lock()
	stalled.admitted = time.Now().Add(-2 * headWindow)
	tr.mu.Unlock()

	assert.Same(t, stalled, evicted(), "no request head within its window: the first to go")
	fresh := admit() // within its window
	assert.Same(t, idle, evicted(), "then an idle one, before a newcomer that may yet send its head")
	fresh2 := admit()
	assert.Same(t, reading, evicted(), "then a request being read")
	admit()
	assert.Same(t, fresh, evicted(), "and a newcomer within its window only when nothing else is left")
	for _, tc := range []*trackedConn{fresh, fresh2} {
		tc.enter()
		require.True(t, tc.work())
	}
	last := evicted()
	last.enter()
	require.True(t, last.work())
	assert.Nil(t, evicted(), "a turn runs on every connection")
	a, b := net.Pipe()
	defer func() { _ = a.Close(); _ = b.Close() }()
	assert.Nil(t, tr.admit(a), "the newcomer is refused")
	tr.stop()
	tr.refusals.Wait()

	assert.Equal(t, int64(3), tr.evicted.Load())
	assert.Equal(t, int64(1), tr.refused.Load())
	assert.Equal(t, 1, bytes.Count(log.Bytes(), []byte("connection cap reached")), "logged once in capLogEvery: %s", log.String())
}
