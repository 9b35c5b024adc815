package traffic

import (
	"slices"

	"pgregory.net/rapid"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
)

// A slow server affords few steps: its run spends them where they buy
// coverage. Its profile declares the share of the steps drawn that may
// restart or crash it (server.restart_share), and a restart drawn beyond
// it gives way to a turn, counted, never timed; each check of such a
// server also steers its draws towards the invariants it has not
// exercised yet, the way coverage-guided generation steers towards code
// not yet run. Every choice is a rapid draw, or follows from the
// profile and the check's own steps and answers: a seed draws the same
// steps on a quiet machine and on a loaded one. A server whose restarts
// are not rationed (the default, restart_share 1) draws as its seeds
// always have.

// budget is how a check spends a slow server's steps.
type budget struct {
	// known says slow and ration are set: at the check's first action,
	// from its profile, then fixed for the check; slow says restarts are
	// rationed, and draws steered.
	known bool
	slow  bool
	// ration: a restart drawn is carried out 1 time in ration.
	ration int
	// steered says the action running now was steered to: a restart so
	// drawn is not rationed.
	steered bool
	// restarts counts the restarts of the check carried out.
	restarts int
}

// pace fixes the check's budget from its profile, and says the pace
// measured so far in its summary where the server is slow: the pace is
// said, never acted on. actions is how many actions a step is drawn
// from, and restarts says one of them restarts the server: only then is
// there anything to ration.
func (m *Machine) pace(actions int, restarts bool) {
	if start, restart, step := m.Pace().Costs(); max(start, restart, step) >= execute.SlowCost {
		m.stats.Pace = m.Pace().String()
	}
	if m.budget.known {
		return
	}
	m.budget.known = true
	share := m.Profile.RestartShareOrDefault()
	m.budget.ration = 1
	if restarts {
		m.budget.ration = execute.Ration(share, actions)
	}
	// Restarts rationed, a check's own draws no longer reach all it could:
	// it steers them.
	m.budget.slow = m.budget.ration > 1
	if m.budget.slow {
		m.stats.RestartShare = share
	}
	m.stats.Ration = max(m.stats.Ration, m.budget.ration)
}

// rationed draws whether a restart drawn gives way to a turn.
func (m *Machine) rationed(t *rapid.T) bool {
	if m.budget.steered || m.budget.ration <= 1 {
		return false
	}
	if rapid.IntRange(0, m.budget.ration-1).Draw(t, "restart rationed") == 0 {
		return false
	}
	m.stats.Rationed++
	return true
}

// wanted are the actions that would exercise an invariant the check has
// not exercised yet and can run now, in a fixed order.
func (m *Machine) wanted(actions map[string]func(*rapid.T)) []string {
	done := m.Ref.Checked()
	live := m.live()
	var out []string
	want := func(name string, inv model.Invariant, can bool) {
		if _, ok := actions[name]; ok && can && done[inv] == 0 {
			out = append(out, name)
		}
	}
	want("retry failed turn", model.T2, slices.ContainsFunc(live, func(c *conv) bool { return len(c.failed) > 0 }))
	want("invalid continuation", model.T3, slices.ContainsFunc(live, func(c *conv) bool { return !c.inConv }))
	want("burst", model.T4, true)
	// T5 is judged on a call made while another conversation exists.
	want("new conversation", model.T5, len(live) < 2)
	want("same id, other key", model.T5, len(live) > 0)
	// One restart a check, while the durability it shows is not judged.
	want("restart", model.T7, m.committed && m.budget.restarts == 0)
	return out
}

// steer draws, on a slow server, whether the action drawn, name, gives
// way to one that exercises what the check has not: the drawn one keeps
// its turn 1 time in len(wanted)+1. It returns the action to run.
func (m *Machine) steer(t *rapid.T, name string, actions map[string]func(*rapid.T)) func(*rapid.T) {
	m.budget.steered = false
	if !m.budget.slow {
		return actions[name]
	}
	wanted := m.wanted(actions)
	if len(wanted) == 0 || slices.Contains(wanted, name) {
		return actions[name]
	}
	i := rapid.IntRange(0, len(wanted)).Draw(t, "steer")
	if i == len(wanted) {
		return actions[name]
	}
	m.stats.Steered++
	m.budget.steered = true
	return actions[wanted[i]]
}
