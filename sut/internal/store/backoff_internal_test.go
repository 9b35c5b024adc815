package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestBackoff: a store operation waits 10 ms before its second try,
// doubling up to 500 ms; there is no try after its deadline, nor once its
// context has ended.
func TestBackoff(t *testing.T) {
	b := backoff{deadline: time.Now().Add(time.Hour)}
	var pauses []time.Duration
	for range 7 {
		assert.True(t, b.wait(context.Background()), "a try is left")
		pauses = append(pauses, b.pause/time.Millisecond)
	}
	assert.Equal(t, []time.Duration{10, 20, 40, 80, 160, 320, 500}, pauses)

	past := backoff{deadline: time.Now().Add(-time.Second)}
	assert.False(t, past.wait(context.Background()), "past its deadline")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b = backoff{deadline: time.Now().Add(time.Hour)}
	assert.False(t, b.wait(ctx), "its context ended")
}
