// Package stall makes a process slow on purpose, as a busy machine makes
// it: a random pause of up to a bound at the points where a slow machine
// would leave a goroutine waiting (before a model call is answered, before
// a commit, between the chunks of a stream). It shows that no verdict of
// the harness depends on how fast the machine is.
//
// The pauses are drawn from math/rand/v2, never from the plan's rapid
// draws: they model the machine, not the plan. Drawn from rapid they would
// change which plan a seed gives, and a replay or a shrink would no
// longer send the plan it saved; and a verdict that changed with them
// would be a verdict decided by the machine's speed, which is the defect
// they exist to find.
package stall

import (
	"context"
	"math/rand/v2"
	"time"
)

// For is a random duration in [0, d]; 0 when d is 0 or less.
func For(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

// Sleep pauses for For(d), or until ctx ends or stop (which may be nil)
// is closed: a process that is stopping is not held up by its own
// slowness. With d 0 it returns at once, without a timer: off, a stall
// point costs a comparison.
func Sleep(ctx context.Context, d time.Duration, stop <-chan struct{}) {
	p := For(d)
	if p == 0 {
		return
	}
	t := time.NewTimer(p)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-stop:
	}
}
