package store

import (
	"context"
	"time"
)

// backoff paces the tries of a store operation that waiting may mend (the
// database takes no new connection, or the one a commit ran on broke):
// 10 ms after the first, doubling up to 500 ms, never past deadline.
type backoff struct {
	deadline time.Time
	pause    time.Duration
}

// Wait pauses before the next try and reports whether there is one: false
// once deadline has passed, or ctx ended while it waited.
func (b *backoff) wait(ctx context.Context) bool {
	left := time.Until(b.deadline)
	if left <= 0 {
		return false
	}
	b.pause = min(max(2*b.pause, 10*time.Millisecond), 500*time.Millisecond)
	select {
	case <-ctx.Done():
		return false
	case <-time.After(min(b.pause, left)):
		return true
	}
}
