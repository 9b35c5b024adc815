package execute

import (
	"fmt"
	"sync"
	"time"
)

// Pace is what a run's server cost, as its labs measured it: a start, a
// restart or crash (the server stopped and started again) and a step of
// turns, each the mean of those seen so far. It is said in a run's
// summary, for a person planning a longer run; nothing a check draws or
// carries out depends on it, so that a seed is the same run on any
// machine (a slow server's restarts are rationed by count, by the share
// its profile declares: Ration).
type Pace struct {
	mu                   sync.Mutex
	start, restart, step mean
}

type mean struct {
	sum time.Duration
	n   int
}

func (m *mean) add(d time.Duration) { m.sum += d; m.n++ }

func (m mean) of() time.Duration {
	if m.n == 0 {
		return 0
	}
	return m.sum / time.Duration(m.n)
}

func (p *Pace) started(d time.Duration) { p.mu.Lock(); p.start.add(d); p.mu.Unlock() }

func (p *Pace) stepped(restart bool, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if restart {
		p.restart.add(d)
	} else {
		p.step.add(d)
	}
}

// Costs returns the mean start, restart and step measured so far (0 for
// one not measured yet).
func (p *Pace) Costs() (start, restart, step time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.start.of(), p.restart.of(), p.step.of()
}

// SlowCost is the cost of a start, restart or step from which a run's
// summary says its pace: a server that costs less is checked in minutes
// whatever is drawn.
const SlowCost = time.Second

// MaxRation is the most a restart is rationed: 1 draw in MaxRation.
const MaxRation = 64

// Ration returns k, a power of two up to MaxRation: a restart drawn is
// carried out 1 time in k, the other times a turn is, so that restarts
// and crashes are at most share of the steps drawn, counted. actions is
// how many actions a step is drawn from, each as often as the others, so
// that 1 step in actions draws a restart. It depends on nothing but its
// arguments, the profile's: never on what a start or a step cost.
func Ration(share float64, actions int) int {
	if share >= 1 || share <= 0 || actions < 1 {
		return 1
	}
	k := 1
	for k < MaxRation && 1/float64(actions*k) > share {
		k *= 2
	}
	return k
}

// String says the costs, for a run's summary.
func (p *Pace) String() string {
	start, restart, step := p.Costs()
	s := fmt.Sprintf("a start %s, a step %s", start.Round(time.Millisecond), step.Round(time.Millisecond))
	if restart > 0 {
		s += fmt.Sprintf(", a restart %s", restart.Round(time.Millisecond))
	}
	return s
}
