package sut

import (
	"bytes"
	"log/slog"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEvictionOrder: past the cap, a newcomer takes the place of a
// connection that has sent no request head before one idle between
// requests, and of that before one whose head is in (its body still
// coming); never of one running a turn; within a class, the oldest. The
// cap being hit is logged once per capLogEvery, with what it cost.
func TestEvictionOrder(t *testing.T) {
	var log bytes.Buffer
	tr := newConnTracker(4, slog.New(slog.NewTextHandler(&log, nil)))
	pipe := func() net.Conn {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		return a
	}
	// Oldest first: a turn, a request being read, an idle one, a header
	// slowloris.
	turn, reading, idle, headless := tr.admit(pipe()), tr.admit(pipe()), tr.admit(pipe()), tr.admit(pipe())
	for _, tc := range []*trackedConn{turn, reading, idle, headless} {
		require.NotNil(t, tc)
	}
	turn.enter()
	require.True(t, turn.work())
	reading.enter()
	idle.enter()
	idle.leave()

	evicted := func() *trackedConn {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.victimLocked()
	}
	assert.Same(t, headless, evicted(), "no request head yet: the first to go")
	require.NotNil(t, tr.admit(pipe()))
	newcomer := evicted()
	assert.NotSame(t, reading, newcomer)
	assert.NotSame(t, turn, newcomer)
	newcomer.enter() // its head came in, and it was served: now idle too
	newcomer.leave()
	assert.Same(t, idle, evicted(), "then the oldest idle one")
	require.NotNil(t, tr.admit(pipe()))
	fresh := evicted() // the newest has sent nothing: it goes before the idle one
	fresh.enter()
	assert.Same(t, newcomer, evicted(), "the idle newcomer")
	require.NotNil(t, tr.admit(pipe()))
	last := evicted()
	last.enter()
	assert.Same(t, reading, evicted(), "a request being read goes only when nothing cheaper is left")
	require.True(t, reading.work())
	require.True(t, fresh.work())
	require.True(t, last.work())
	assert.Nil(t, evicted(), "a turn runs on every connection: the newcomer is refused")
	assert.Nil(t, tr.admit(pipe()))
	tr.stop()
	tr.refusals.Wait()

	assert.Equal(t, int64(3), tr.evicted.Load())
	assert.Equal(t, int64(1), tr.refused.Load())
	assert.Equal(t, 1, bytes.Count(log.Bytes(), []byte("connection cap reached")), "logged once in capLogEvery: %s", log.String())
}
