package execute

import (
	"context"
	"fmt"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// FreshServers reports whether l's sessions share one server that a
// fresh one can stand in for: a run on a shared server may break an
// invariant only because of what earlier sessions left in it, and a saved
// failure replays on a fresh one (a replay opens a lab of its own), so
// what is saved must break it there too. A Remote's server is the only
// one there is: a replay meets it again.
func (l *Lab) FreshServers() bool {
	_, remote := l.Target.(targets.Remote)
	return l.reuses() && !remote
}

// FreshReplay replays plans as Replay does, on a server started for the
// replay: where l's sessions share one server, that one is stopped first
// (a server may hold a fixed port only one instance can), and the one
// started here is stopped after it: the next session of the run starts
// another under the run's bound. The start is cut short when ctx ends. Elsewhere every session starts a
// server of its own, and it is Replay.
func (l *Lab) FreshReplay(ctx context.Context, plans []plan.Plan) (ops []history.Op, v *model.Violation, err error) {
	if !l.reuses() {
		return l.Replay(ctx, plans)
	}
	if l.shared != nil {
		old := l.shared
		// Whatever happens next, the stopped server is no longer the
		// run's: the next session starts another if this one fails to.
		l.shared = nil
		// One that went down (a crash found) says so as it stops: no
		// news.
		if err := old.Close(); err != nil && !l.down {
			return nil, nil, fmt.Errorf("stop the server under test: %w", err)
		}
		l.down = false
	}
	if err := l.startShared(ctx, "its start for a replay of a failure's steps"); err != nil {
		return nil, nil, err
	}
	srv := l.shared
	defer func() {
		// Started under the replay's bound, which its restarts would
		// still hold to: the next session starts one under the run's.
		l.shared = nil
		if cerr := srv.Close(); cerr != nil && err == nil && !l.down {
			err = fmt.Errorf("stop the server under test: %w", cerr)
		}
		l.down = false
	}()
	ops, v, _, err = l.replay(ctx, plans)
	return ops, v, err
}
