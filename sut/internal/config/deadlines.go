package config

import (
	"context"
	"sync"
	"time"
)

// Deadlines starts the deadline of every model call. The default uses the
// clock; a test can stand in ManualDeadlines to decide when a held call
// times out, at a known point rather than after a timer.
type Deadlines interface {
	// WithTimeout returns a context that ends when parent does, or when d
	// has passed; then its cause (context.Cause) is
	// context.DeadlineExceeded.
	WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc)
}

// ClockDeadlines starts deadlines on the clock: the default Deadlines.
type ClockDeadlines struct{}

// WithTimeout is context.WithTimeout.
func (ClockDeadlines) WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, d)
}

// ManualDeadlines are deadlines that pass only when Expire says so, whatever
// their duration. The zero value is ready to use.
type ManualDeadlines struct {
	mu      sync.Mutex
	pending map[*manualDeadline]struct{}
}

type manualDeadline struct{ cancel context.CancelCauseFunc }

// WithTimeout returns a context that ends when parent does or at the next
// Expire; d is ignored.
func (m *ManualDeadlines) WithTimeout(parent context.Context, _ time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	d := &manualDeadline{cancel: cancel}
	m.mu.Lock()
	if m.pending == nil {
		m.pending = map[*manualDeadline]struct{}{}
	}
	m.pending[d] = struct{}{}
	m.mu.Unlock()
	return ctx, func() {
		m.mu.Lock()
		delete(m.pending, d)
		m.mu.Unlock()
		cancel(context.Canceled)
	}
}

// Expire makes every deadline started and not yet cancelled pass now, and
// returns how many there were.
func (m *ManualDeadlines) Expire() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.pending)
	for d := range m.pending {
		d.cancel(context.DeadlineExceeded)
	}
	clear(m.pending)
	return n
}
