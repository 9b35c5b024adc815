package execute

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// pace is a Pace that measured one start, restart and step of each cost
// (0: none).
func pace(start, restart, step time.Duration) *Pace {
	p := &Pace{}
	if start > 0 {
		p.started(start)
	}
	if restart > 0 {
		p.stepped(true, restart)
	}
	if step > 0 {
		p.stepped(false, step)
	}
	return p
}

// TestRation: a restart is rationed so that restarts take about the share
// asked of the run's time, by powers of two, up to MaxRation; never while
// a cost is not measured, under RationFloor, or with the whole run for
// restarts.
func TestRation(t *testing.T) {
	for _, c := range []struct {
		name                 string
		start, restart, step time.Duration
		share                float64
		want                 int
	}{
		// 15 s a restart, 3 s a step, 7 actions: 1 in 2 would take 28%.
		{"a slow server", 15 * time.Second, 15 * time.Second, 3 * time.Second, 0.25, 4},
		{"the start stands for the restart before one", 15 * time.Second, 0, 3 * time.Second, 0.25, 4},
		// 1 in 7 steps a restart of 2.2 s, the 6 others 1 s each: 27%.
		{"restarts beside the other steps", 2200 * time.Millisecond, 2200 * time.Millisecond, time.Second, 0.25, 2},
		{"a bigger share", 15 * time.Second, 15 * time.Second, 3 * time.Second, 0.5, 1},
		{"no rationing asked", 15 * time.Second, 15 * time.Second, 3 * time.Second, 1, 1},
		{"a fast restart", 900 * time.Millisecond, 900 * time.Millisecond, time.Millisecond, 0.25, 1},
		{"no step measured", 15 * time.Second, 15 * time.Second, 0, 0.25, 1},
		{"at most MaxRation", time.Minute, time.Minute, time.Millisecond, 0.25, MaxRation},
	} {
		got := pace(c.start, c.restart, c.step).Ration(c.share, 7)
		assert.Equal(t, c.want, got, c.name)
	}
	p := pace(10*time.Second, 0, time.Second)
	p.stepped(false, 3*time.Second)
	_, _, step := p.Costs()
	assert.Equal(t, 2*time.Second, step, "a mean of the steps")
	assert.Equal(t, "a start 10s, a step 2s", p.String())
}
