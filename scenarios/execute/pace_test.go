package execute

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestRation: a restart is rationed by count, so that restarts and
// crashes are at most the share asked of the steps drawn, by powers of
// two, up to MaxRation; never with the whole run for restarts.
func TestRation(t *testing.T) {
	for _, c := range []struct {
		name    string
		share   float64
		actions int
		want    int
	}{
		// 1 step in 7 draws a restart: 14%.
		{"a share above the draws'", 0.25, 7, 1},
		{"half the draws'", 0.08, 7, 2},
		// 1/(7*16) = 0.9%, 1/(7*8) = 1.8%.
		{"a slow server's", 0.01, 7, 16},
		{"fewer actions, more rationing", 0.01, 4, 32},
		{"at most MaxRation", 0.0001, 7, MaxRation},
		{"no rationing asked", 1, 7, 1},
		{"no share", 0, 7, 1},
	} {
		assert.Equal(t, c.want, Ration(c.share, c.actions), c.name)
	}
}

// TestPaceIsSaid: the pace a run measured is the mean of what it saw,
// said for a person.
func TestPaceIsSaid(t *testing.T) {
	p := &Pace{}
	p.started(10 * time.Second)
	p.stepped(false, time.Second)
	p.stepped(false, 3*time.Second)
	_, restart, step := p.Costs()
	assert.Equal(t, 2*time.Second, step, "a mean of the steps")
	assert.Zero(t, restart, "no restart measured")
	assert.Equal(t, "a start 10s, a step 2s", p.String())
	p.stepped(true, 4*time.Second)
	assert.Equal(t, "a start 10s, a step 2s, a restart 4s", p.String())
}
