package stall

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestForStaysInItsBound: a pause is never negative nor past its bound,
// and off is 0.
func TestForStaysInItsBound(t *testing.T) {
	assert.Zero(t, For(0))
	assert.Zero(t, For(-time.Second))
	seen := map[time.Duration]bool{}
	for range 1000 {
		p := For(3)
		assert.True(t, p >= 0 && p <= 3, "For(3) = %d", p)
		seen[p] = true
	}
	// Both ends are drawn: the bound is inclusive.
	assert.Len(t, seen, 4, "For(3) drew %v in 1000 tries", seen)
}

// TestSleepEndsWithItsContextOrStop: a pause of up to an hour ends at once
// when its context has ended or its stop is closed, so that a stalled
// process stops as fast as one that is not.
func TestSleepEndsWithItsContextOrStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	stopped := make(chan struct{})
	close(stopped)
	for name, sleep := range map[string]func(){
		"context": func() { Sleep(ctx, time.Hour, nil) },
		"stop":    func() { Sleep(context.Background(), time.Hour, stopped) },
		"off":     func() { Sleep(context.Background(), 0, nil) },
	} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			sleep()
		}()
		select {
		case <-done:
		case <-time.After(time.Minute): // a safety net only: it returns at once
			t.Fatalf("%s: Sleep did not return", name)
		}
	}
}
