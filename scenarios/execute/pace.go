package execute

import (
	"fmt"
	"sync"
	"time"
)

// Pace is what a run's server costs, as its labs measure it: a start, a
// restart or crash (the server stopped and started again) and a step of
// turns, each the mean of those seen so far. A run spends its time by it:
// a restart that costs many turns is drawn less often (Ration), and a
// check that can afford few steps steers them towards what it has not
// exercised yet.
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

// RationFloor is the cost under which a restart is never rationed: a
// server that restarts that fast is checked in minutes whatever is drawn,
// and its draws stay as its seeds have always drawn them.
const RationFloor = time.Second

// MaxRation is the most a restart is rationed: 1 draw in MaxRation.
const MaxRation = 64

// Ration returns k, a power of two: a restart the machine draws is carried
// out 1 time in k, the other times a turn is, so that restarts and crashes
// take at most share of the run's time. actions is how many actions a
// step is drawn from, each as often as the others. A restart costs what
// the restarts measured so far did, or a start before the first; 1 while
// either it or a step is not measured yet, or under RationFloor.
func (p *Pace) Ration(share float64, actions int) int {
	start, restart, step := p.Costs()
	if restart == 0 {
		restart = start
	}
	if restart < RationFloor || step == 0 || share >= 1 || actions < 1 {
		return 1
	}
	k := 1
	for ; k < MaxRation; k *= 2 {
		// Of the steps, q are restarts: the time they take is the share.
		q := 1 / float64(actions*k)
		r := q * restart.Seconds()
		if r/(r+(1-q)*step.Seconds()) <= share {
			break
		}
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
