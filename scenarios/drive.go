package scenarios

import (
	"context"
	"fmt"
	"reflect"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"pgregory.net/rapid"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/scenarios/traffic"
)

// runner drives the checks of one Check: each is one state-machine run,
// drawn by rapid from a seed of its own, on one of the run's labs, up to
// as many at once as there are labs. Whatever the interleaving of the
// checks, the result is the one a run of them in order gives: the checks
// after the first failing one are dropped (stopped if they still run),
// and the counts are those of the checks up to it.
type runner struct {
	labs []*execute.Lab
	// stats are the counts of the checks that count, once drive is done;
	// shrinking adds to them.
	stats    *report.Stats
	progress func(report.Stats)
	start    time.Time
	// ctx, if not nil, interrupts the run when it ends.
	ctx context.Context
	// steps is the rapid.steps a check draws with (holdSteps).
	steps int

	// mu guards live, the counts of every check ended so far, in the
	// order they ended: what progress shows while checks still run.
	mu   sync.Mutex
	live *report.Stats
}

// checkRun is what one check came to.
type checkRun struct {
	// n is the check's number in the run, from 1; i its place among the
	// checks this drive ran.
	n, i  int
	lab   *execute.Lab
	stats *report.Stats
	// failing is the check's violation, with its steps.
	failing *failingRun
	foundIn time.Duration
	// took is how long the check ran, from its start to its failure:
	// what a replay of it costs, about.
	took time.Duration
	// broke is what stopped the check when it was no violation: the
	// harness failed (a panic), said in words.
	broke string
	// setupErr says the server did not start, or stopped answering;
	// teardownErr that it did not stop cleanly.
	setupErr, teardownErr error
	// interrupted says the check was cut short: by the run's context, or
	// because an earlier check failed and it no longer counts.
	interrupted bool
}

// failingRun is a run that broke an invariant: its plans, what they came
// to, and the violation.
type failingRun struct {
	plans     []plan.Plan
	history   []history.Op
	violation *model.Violation
}

// withEarlier is run with, before its steps, those of the earlier checks
// on the shared server whose messages its violating step showed
// (execute.Session.Earlier): a leak between checks, which a saved
// failure, replayed on a fresh server, shows again only after them. Its
// history numbers its own steps after theirs.
func withEarlier(sess *execute.Session, run *failingRun) *failingRun {
	if len(run.history) == 0 {
		return run
	}
	last := run.history[len(run.history)-1].Step
	earlier := sess.Earlier(slices.DeleteFunc(slices.Clone(run.history), func(op history.Op) bool { return op.Step != last }))
	if len(earlier) == 0 {
		return run
	}
	ops := slices.Clone(run.history)
	for i := range ops {
		ops[i].Step += len(earlier)
	}
	return &failingRun{plans: slices.Concat(earlier, run.plans), history: ops, violation: run.violation}
}

// ended reports whether the check ends the run: a failure, a harness
// failure, or a server that could not be used.
func (c *checkRun) ended() bool {
	return c.failing != nil || c.broke != "" || c.setupErr != nil
}

// drive runs the checks numbered nums (from 1, in order), the n-th from
// checkSeed(seed, n), and returns those that count, in order: all of them,
// or those up to the first that ended the run.
func (r *runner) drive(nums []int, seed uint64) []*checkRun {
	var (
		next  atomic.Int64
		stop  atomic.Int64 // the index of the lowest check that ended the run, or len(nums)
		mu    sync.Mutex
		runs  = make([]*checkRun, len(nums))
		halts = map[int]context.CancelFunc{}
		wg    sync.WaitGroup
	)
	stop.Store(int64(len(nums)))
	for _, l := range r.labs {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= int(stop.Load()) || r.interrupted() {
					return
				}
				ctx, halt := context.WithCancel(r.context())
				mu.Lock()
				halts[i] = halt
				mu.Unlock()
				c := r.runCheck(ctx, l, nums[i], checkSeed(seed, nums[i]))
				c.i = i
				mu.Lock()
				delete(halts, i)
				runs[i] = c
				if c.ended() && int64(i) < stop.Load() {
					stop.Store(int64(i))
					for k, h := range halts {
						if k > i {
							h() // a later check no longer counts
						}
					}
				}
				mu.Unlock()
				halt()
				r.ended(c)
			}
		})
	}
	wg.Wait()
	var out []*checkRun
	for i := 0; i < len(nums) && i <= int(stop.Load()); i++ {
		if runs[i] == nil {
			break // interrupted before it started
		}
		out = append(out, runs[i])
	}
	return out
}

// ended counts a check that ended, for progress.
func (r *runner) ended(c *checkRun) {
	if r.progress == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.live.Add(*c.stats)
	r.progress(*r.live)
}

// shrinking counts a shrink replay of what, for progress, on the counts
// of every check that ran, the ones after the failing check too: the
// progress line never counts back when a shrink starts. what is "" once
// the shrink is over.
func (r *runner) shrinking(what string) {
	if r.progress == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if what == "" {
		r.live.Shrinking = ""
		return
	}
	r.live.ShrinkRuns++
	r.live.Shrinking = what
	r.progress(*r.live)
}

func (r *runner) context() context.Context {
	if r.ctx == nil {
		return context.Background()
	}
	return r.ctx
}

func (r *runner) interrupted() bool { return r.ctx != nil && r.ctx.Err() != nil }

// runCheck runs check n from seed in l, on a goroutine of its own: an
// interruption ends it with runtime.Goexit, which rapid cannot stop early
// otherwise, and which still runs every deferred cleanup on the way out.
func (r *runner) runCheck(ctx context.Context, l *execute.Lab, n int, seed uint64) *checkRun {
	c := &checkRun{n: n, lab: l, stats: report.NewStats()}
	c.stats.Checks = 1
	done := make(chan struct{})
	go func() {
		defer close(done)
		// A Custom generator's example is rapid's way to run a property
		// once from a given seed, outside rapid.Check: the checks of a run
		// can then run at once, each drawing exactly as it would alone.
		rapid.Custom(func(t *rapid.T) struct{} {
			// rapid takes a property that draws nothing for a broken
			// generator, and runs it again, up to 1000 times: one that
			// stops before its first step (a server that did not start)
			// has drawn this.
			_ = rapid.Bool().Draw(t, "check")
			defer func() {
				if p := recover(); p != nil {
					c.stopped(t, p)
				}
			}()
			r.property(t, ctx, l, c)
			return struct{}{}
		}).Example(int(seed))
	}()
	<-done
	return c
}

// stopped records why a check stopped with panic p: a failed step (a
// violation, already recorded, or a dead server), an invalid draw (no
// check at all), or a harness that panicked.
func (c *checkRun) stopped(t *rapid.T, p any) {
	switch {
	case t.Failed():
		if c.failing == nil && c.setupErr == nil {
			c.broke = fmt.Sprint(p)
		}
	case reflect.TypeOf(p).PkgPath() == reflect.TypeOf((*rapid.T)(nil)).Elem().PkgPath():
		// rapid gave up drawing a valid run: the check drew nothing.
	default:
		c.broke = fmt.Sprintf("panic: %v\n%s", p, debug.Stack())
	}
}

// property is one check: a fresh session of l, then steps drawn by rapid.
func (r *runner) property(t *rapid.T, ctx context.Context, l *execute.Lab, c *checkRun) {
	stopIfDone := func(*rapid.T) {
		if ctx.Err() != nil {
			c.interrupted = true
			runtime.Goexit()
		}
	}
	stopIfDone(t)
	began := time.Now()
	sess, err := l.Session(ctx)
	if err != nil {
		// No step ran: no check to count.
		c.setupErr, c.stats.Checks = err, 0
		t.Fatalf("setup: %v", err)
	}
	sess.Check = c.n
	t.Cleanup(func() { c.teardownErr = sess.Close() })
	m := traffic.New(sess, c.stats, func(v *model.Violation, plans []plan.Plan, ops []history.Op) {
		c.failing, c.foundIn, c.took = withEarlier(sess, &failingRun{plans: plans, history: ops, violation: v}), time.Since(r.start), time.Since(began)
	}, func(err error) { c.setupErr = err })
	t.Cleanup(func() {
		s := c.stats
		report.AddCounts(s.Invariants, m.Ref.Checked())
		s.Evictions += m.Ref.Evictions()
		report.AddCounts(s.SetAside, sess.Skipped)
		report.AddCounts(s.Consequences, sess.Consequences)
		report.AddCounts(s.SameCause, sess.SameCause)
		s.KeepFolded(sess.Folded)
		if sess.Up > 0 {
			s.Invariants[model.Crash] += sess.Up
		}
		if sess.Answered > 0 {
			s.Invariants[model.Wire] += sess.Answered
		}
		for k, d := range sess.Exec.Spent() {
			s.TimeMS[k] += d.Milliseconds()
		}
	})
	actions := m.Actions()
	// rapid reads its steps flag once, as Repeat starts, and calls the
	// check action right after: the flag is this check's from just before
	// Repeat to that first call, so that runs with other steps may run
	// checks at once. The deferred release is for a Repeat that never
	// called it.
	release := holdSteps(r.steps)
	defer release()
	actions[""] = func(t *rapid.T) { // between steps
		release()
		stopIfDone(t)
	}
	t.Repeat(actions)
	if v := sess.End(); v != nil {
		// The server died once it had answered the last step: the
		// check's steps are the finding's.
		c.failing, c.foundIn, c.took = &failingRun{plans: slices.Clone(sess.Plans), history: slices.Clone(sess.History), violation: v}, time.Since(r.start), time.Since(began)
		t.Fatalf("%s", v.Error())
	}
}

// Parallel is how many checks target allows at once, given the n asked
// for (0: one per core): one for a server whose fake model must listen at
// a fixed address, or whose front sends to fixed addresses, since only
// one can, and at most a Subprocess's MaxParallel.
func Parallel(target targets.Target, n int) int {
	if ma, ok := target.(targets.ModelAddresser); ok && ma.ModelAddr() != "" {
		return 1
	}
	if s, ok := target.(targets.Subprocess); ok && s.Front != nil {
		return 1
	}
	if n <= 0 {
		n = runtime.NumCPU()
	}
	if s, ok := target.(targets.Subprocess); ok && s.MaxParallel > 0 {
		n = min(n, s.MaxParallel)
	}
	return max(n, 1)
}
