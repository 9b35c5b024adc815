// Package scenarios runs turncheck's rapid state machine against a server
// under test. A check flows through one package per stage, as etcd's
// robustness tests do, each importing only the ones before it:
//
//   - targets start the servers and say what they declare (profiles);
//   - traffic is the state machine whose actions draw plans (package
//     plan: turns, continuations, retries, bursts of turns sent at once,
//     restarts, and what goes wrong with each);
//   - execute sends them through a protocol (package protocol, the only
//     code that knows the wire) and records a history (package history:
//     each request's invocation and completion on one timeline, its
//     outcome, and the model calls that carry its token);
//   - the history is validated by the reference model in package model
//     and, for bursts, by porcupine's linearizability checker (package
//     validate);
//   - a failure is shrunk (package shrink) and reported (package report).
//
// Conform runs it against the whole contract and gives a verdict per
// invariant, exploring on after a failure; Check stops at the first broken
// invariant and returns a Result, for the CLI and for tests that expect a
// failure; Run runs Conform inside a Go test, one subtest per invariant, in
// the spirit of testing/fstest.TestFS, for servers that import this
// package. Targets start the servers: the in-repo reference server
// (package scenarios/reference, which alone imports it), a Handler, a
// Subprocess from a command line, a Remote server already running, or any
// of them from a YAML profile (LoadProfile).
package scenarios

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/shrink"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// Options bound a Check.
type Options struct {
	// Checks is how many state-machine runs to try; 0 means 100.
	Checks int
	// Steps is the average number of steps per run; 0 means 30.
	Steps int
	// Seed starts the run; the same seed replays the same runs. 0 draws one.
	Seed uint64
	// ShrinkTime bounds the minimisation of a failure in wall-clock time:
	// no replay starts after it, and the one in flight is cut, though
	// stopping its server may take the server's stop grace more; 0 counts
	// it in replays: shrink.ShrinkReplays replays of the
	// failing run at the speed it ran, within 30s and 10m, and at most
	// what the time Context leaves the run leaves beside the checks still
	// to run, at the pace of those so far (shrink.ReplayBound).
	ShrinkTime time.Duration
	// Progress, if set, is called after every state-machine run.
	Progress func(report.Stats)
	// Context, if set, stops the run when it ends: the requests in flight
	// are aborted, servers are stopped, and Check returns ErrInterrupted.
	Context context.Context
	// Skip lists invariants known to be broken: a violation of one sets
	// its conversations aside and the run goes on, so that a server with
	// a known bug can still be checked for the others.
	Skip []model.Invariant
	// Found, if set, is called by Conform with each failure as soon as it
	// is shrunk, before the run goes on, and what the run did so far: a
	// person sees a finding when it is made, not when the run ends.
	Found func(*report.Failure, report.Stats)
	// Known, if set, says whether a failure as it was found (its
	// violation, its steps unshrunk) is a known one, a baseline's: such a
	// failure is not shrunk, so that a run spends its time on what is new.
	Known func(*report.Failure) bool
	// FailFast ends a Conform at its first failure.
	FailFast bool
	// Shard, if its N is not 0, runs only shard K (from 1) of N of the
	// checks: check n of the run, from its own seed as in the whole run,
	// is shard ((n-1) mod N)+1's. The shards of one run, run anywhere,
	// together run its checks, and report.Merge joins their verdicts.
	Shard Shard
	// checks are the numbers of the checks left to run, once a Conform
	// goes on after a failure; nil: all of the run's (numbers).
	checks []int
	// Parallel is how many checks run at once, each on a server and fake
	// model of its own (the shrinker replays as many candidates at once);
	// 0 means 1. A target whose fake model must listen at a fixed address
	// runs one at a time whatever it says (see Parallel). The verdicts do
	// not depend on it: they are those of the checks run in order.
	Parallel int
}

// Shard names one share of a run's checks: the K-th (from 1) of N.
type Shard struct{ K, N int }

// String is the shard as K/N, "" for a whole run.
func (s Shard) String() string {
	if s.N == 0 {
		return ""
	}
	return fmt.Sprintf("%d/%d", s.K, s.N)
}

// check says what is wrong with the shard, nil if nothing.
func (s Shard) check() error {
	if s != (Shard{}) && (s.N < 1 || s.K < 1 || s.K > s.N) {
		return fmt.Errorf("shard %d/%d: want K/N with 1 <= K <= N", s.K, s.N)
	}
	return nil
}

// numbers are the numbers of the checks o runs, in order.
func (o Options) numbers() []int {
	if o.checks != nil {
		return o.checks
	}
	var out []int
	for n := 1; n <= o.Checks; n++ {
		if o.Shard.N == 0 || (n-1)%o.Shard.N == o.Shard.K-1 {
			out = append(out, n)
		}
	}
	return out
}

// ErrInterrupted is returned by Check when Options.Context ended first.
var ErrInterrupted = errors.New("interrupted")

// rapidFlags guards rapid's global settings, which live in package flag:
// the number of steps a check draws, which rapid reads as a check's
// Repeat starts (holdSteps), and the flags Run reads.
var rapidFlags sync.Mutex

// Check runs the state machine against target and reports what it found.
// A broken invariant, or a server that went down on its own (model.Crash),
// is a Result with a Failure, and no error. The error says the run could
// not be carried out (the target or the fake model did not start, or a
// setup error), left something behind (a server that did not stop
// cleanly), saw the server exit where no step shows the cause (between
// two checks), or was interrupted (ErrInterrupted; the Result holds what
// was found).
func Check(target targets.Target, opts Options) (*report.Result, error) {
	if err := opts.Shard.check(); err != nil {
		return nil, err
	}
	l, err := execute.Open(target, opts.Skip)
	if err != nil {
		return nil, err
	}
	res, err := check(l, opts)
	if cerr := l.Close(); cerr != nil {
		if res != nil && res.Failure != nil && err == nil {
			// The violation comes first; the leftover is said after it.
			res.Failure.Report += "\nAlso: " + cerr.Error() + "\n"
		} else {
			err = errors.Join(err, cerr)
		}
	}
	if between := exitedBetween(l); err == nil && res.Failure == nil && len(between) > 0 {
		// No step shows it, but the server went down: never a pass.
		err = errors.New(strings.Join(between, "\n"))
	}
	return res, err
}

// check is Check in the sessions of l and its workers.
func check(l *execute.Lab, opts Options) (*report.Result, error) {
	if opts.Checks <= 0 {
		opts.Checks = 100
	}
	if opts.Steps <= 0 {
		opts.Steps = 30
	}
	if opts.Seed == 0 {
		opts.Seed = randomSeed()
	}
	l.Context = opts.Context
	labs, err := l.Workers(Parallel(l.Target, max(opts.Parallel, 1)))
	if err != nil {
		return nil, err
	}

	if err := initTesting(); err != nil {
		return nil, err
	}
	if flag.Lookup("rapid.steps") == nil {
		return nil, errors.New("rapid's flag rapid.steps is not registered")
	}
	steps := opts.Steps
	if testing.Short() {
		// rapid draws half the steps under -short; Options are exact, so
		// undo that.
		steps *= 2
	}

	start := time.Now()
	r := &runner{labs: labs, stats: report.NewStats(), live: report.NewStats(), progress: opts.Progress, start: start, ctx: opts.Context,
		steps: steps}
	runs := r.drive(opts.numbers(), opts.Seed)
	res := &report.Result{Seed: opts.Seed}
	var last *checkRun
	if len(runs) > 0 {
		// A server that did not start where a check stopped is said
		// there, though the check's close met it again.
		last = runs[len(runs)-1]
		notStartedAt(last.setupErr, last.n, false)
	}
	var teardownErr error
	for _, c := range runs {
		r.stats.Add(*c.stats)
		if teardownErr == nil {
			teardownErr = c.teardownErr
			notStartedAt(teardownErr, c.n, true)
		}
	}
	if last != nil && last.setupErr != nil {
		l.Last = last.lab.Last // its output says why
		// What stopped the server from serving comes first, before an
		// interruption or the time bound it may have run into.
		res.Stats, res.Elapsed = *r.stats, time.Since(start)
		return res, last.setupErr
	}
	if last != nil && (last.failing != nil || last.broke != "") {
		res.Failure = r.failure(last, opts)
	}
	res.Stats, res.Elapsed = *r.stats, time.Since(start)
	if r.interrupted() || (last != nil && last.interrupted && res.Failure == nil) {
		return res, ErrInterrupted
	}
	var ns *execute.NotStarted
	if teardownErr != nil && res.Failure != nil && !errors.As(teardownErr, &ns) {
		// The violation comes first; the leftover is said after it.
		res.Failure.Report += "\nAlso: " + teardownErr.Error() + "\n"
		return res, nil
	}
	return res, teardownErr
}

// notStartedAt says where in the run a server that did not start (err,
// if it is execute.NotStarted) stopped it: at check n, or, closing, as
// check n closed, after its last step. Where it is said already (a lab
// that said so as a check closed says so again as the next starts), it
// stays.
func notStartedAt(err error, n int, closing bool) {
	var ns *execute.NotStarted
	if errors.As(err, &ns) && ns.Check == 0 {
		ns.Check, ns.Closing = n, closing
	}
}

// failure describes what check c found: its failing run shrunk, the run
// as it failed if it did not reproduce, or what stopped it when it was no
// violation (the harness itself failed).
func (r *runner) failure(c *checkRun, opts Options) *report.Failure {
	l := r.labs[0]
	f := &report.Failure{Seed: checkSeed(opts.Seed, c.n), Check: c.n, FoundAfter: c.i + 1, FoundIn: c.foundIn, Skipped: slices.Clone(l.Skip),
		SkippedKinds: slices.Clone(l.SkipKinds), AuxInstructions: l.Aux.List()}
	profile := l.Profile
	if c.failing == nil {
		f.Report = c.broke
		return f
	}
	run := c.failing
	if opts.Known != nil && opts.Known(&report.Failure{Violation: run.violation, Plans: run.plans, History: run.history}) {
		f.Violation, f.Plans, f.History = run.violation, run.plans, run.history
		f.Report = report.FormatFailure(f.Violation, f.History, profile)
		f.Shrink, f.ShrinkNote = report.NotShrunk, "a known finding (the baseline lists it): not shrunk again"
		return f
	}
	bound, said := opts.ShrinkTime, "--shrink-time "+opts.ShrinkTime.String()
	if bound <= 0 {
		var left time.Duration
		if opts.Context != nil {
			if end, ok := opts.Context.Deadline(); ok {
				left = max(time.Until(end), time.Millisecond)
			}
		}
		still := 0
		if opts.checks != nil {
			// A Conform goes on after its finding: the checks left are
			// run from its next one.
			still = max(len(opts.checks)-(c.i+1), 0)
		}
		each := time.Since(r.start) / time.Duration(c.i+1)
		bound, said = shrink.ReplayBound(c.took, left, still, each)
		if bound <= 0 {
			f.Violation, f.Plans, f.History = run.violation, run.plans, run.history
			f.Report = report.FormatFailure(f.Violation, f.History, profile)
			f.Shrink, f.ShrinkNote = report.NotShrunk, fmt.Sprintf("the %d check(s) still to run need %s of the %s left, at the %s a check took so far",
				still, (time.Duration(still)*each).Round(time.Second), left.Round(time.Second), each.Round(10*time.Millisecond))
			return f
		}
	}
	ctx, cancel := shrink.Budget(opts.Context, bound, said)
	defer cancel()
	start := time.Now()
	inv := run.violation.Invariant
	after := func(steps int) {
		r.stats.ShrinkRuns++
		r.shrinking(fmt.Sprintf("the %s failure, at %d step(s)", inv, steps))
	}
	defer r.shrinking("")
	s, ok := shrink.Run(ctx, r.labs, run.plans, run.violation, c.took, after)
	f.ShrinkRuns, f.ShrunkIn = s.Runs, time.Since(start)
	r.stats.TimeMS[execute.SpentShrink] += f.ShrunkIn.Milliseconds()
	switch {
	case ok:
		f.Violation, f.Plans, f.History = s.Violation, s.Plans, s.History
		f.Report = report.FormatFailure(f.Violation, f.History, profile)
		f.Shrink, f.ShrinkNote = s.State()
	case ctx.Err() != nil:
		// Interrupted, or out of time, before the replays said anything:
		// the run as it failed, unshrunk.
		f.Violation, f.Plans, f.History = run.violation, run.plans, run.history
		f.Report = report.FormatFailure(f.Violation, f.History, profile)
		f.Shrink, f.ShrinkNote = s.State()
	case s.Unreplayed() != nil:
		// No replay ran: nothing says the failure does not reproduce.
		f.Violation, f.Plans, f.History = run.violation, run.plans, run.history
		f.Shrink, f.ShrinkNote = report.NotShrunk, "its steps could not be replayed: "+s.Unreplayed().Error()
		f.Report = fmt.Sprintf("The failure's steps could not be replayed to shrink it (%v).\nThis is the run that failed:\n\n", s.Unreplayed()) +
			report.FormatFailure(f.Violation, f.History, profile)
	case s.GaveUp():
		// Given up before the replays said anything: the run as it
		// failed, unshrunk, and not flaky; the note says why.
		f.Violation, f.Plans, f.History = run.violation, run.plans, run.history
		f.Report = report.FormatFailure(f.Violation, f.History, profile)
		f.Shrink, f.ShrinkNote = s.State()
	default:
		f.Flaky, f.Shrink = true, report.NotShrunk
		f.Violation, f.Plans, f.History = run.violation, run.plans, run.history
		other := ""
		if n := f.ShrinkRuns - s.Misses(); n > 0 {
			other = fmt.Sprintf("\n%d other replay(s) could not be carried out or were cut short.", n)
		}
		f.Report = fmt.Sprintf("The failure did not reproduce in %d replay(s) of its steps: the server does not\n"+
			"behave the same way under the same steps.%s%s\nThis is the run that failed:\n\n", s.Misses(), s.Differed(run.history), other) +
			report.FormatFailure(f.Violation, f.History, profile)
	}
	return f
}

// checkSeed is the seed of the n-th check (from 1) of a run that starts
// from base: each check adds the number of checks before it, as rapid's
// own runs do.
func checkSeed(base uint64, n int) uint64 {
	k := uint64(n - 1)
	return base + k*(k+1)/2
}

// Run checks target inside a Go test, in the spirit of
// testing/fstest.TestFS: it runs Conform with rapid's -rapid.checks,
// -rapid.steps and -rapid.seed from the command line, then reports one
// subtest per invariant of PROTOCOL.md (t.Run("T1", ...) and so on). A
// broken invariant fails its subtest with the shrunk steps, saves the
// failure under testdata/turncheck/, and gives the command that replays it
// exactly: with TURNCHECK_REPLAY set to a saved failure, Run re-executes
// that failure's steps instead of searching. An invariant that was never
// exercised fails its subtest too, since nothing was shown; one that is
// not applicable is skipped with the reason. A Go server's own tests call it with a Target that starts that
// server (see Handler).
//
// A pass of an invariant means that it was exercised and no run broke it:
// no false positives, but a bug the runs did not reach may remain.
//
// An Options, if given, sets the run without global flags: its Checks,
// Steps and Seed, where not zero, win over rapid's flags, and the rest
// (Skip, ShrinkTime, Parallel, ...) is used as it is.
func Run(t *testing.T, target targets.Target, options ...Options) {
	t.Helper()
	if path := os.Getenv("TURNCHECK_REPLAY"); path != "" {
		replayIn(t, target, path)
		return
	}
	var opts Options
	if len(options) > 0 {
		opts = options[0]
	}
	opts.Checks = cmp.Or(opts.Checks, int(uintFlag("rapid.checks")))
	opts.Steps = cmp.Or(opts.Steps, int(uintFlag("rapid.steps")))
	opts.Seed = cmp.Or(opts.Seed, uintFlag("rapid.seed"))
	if testing.Short() {
		// As rapid does under -short: a fifth of the checks.
		opts.Checks = max(opts.Checks/5, 1)
	}
	c, err := Conform(target, opts)
	if err != nil {
		t.Fatalf("turncheck: %v", err)
	}
	t.Logf("turncheck: seed %d\n%s", c.Seed, c.Stats.Summary())
	for _, v := range c.Verdicts {
		t.Run(string(v.Invariant), func(t *testing.T) {
			// A failure is reported at the call of Run in the server's own
			// test, not here.
			t.Helper()
			switch v.Status {
			case report.Pass:
				t.Logf("%s (%s): %d %s", v.Invariant, v.Invariant.Title(), v.Evaluations, report.Exercises[v.Invariant])
			case report.Fail:
				f := v.Failure
				if f == nil {
					// No steps show it (a server that did not start, or
					// exited between two checks): its reason says it all.
					t.Fatalf("turncheck: %s (%s): %s", v.Invariant, v.Invariant.Title(), v.Reason)
				}
				res := &report.Result{Stats: c.Stats, Seed: f.Seed, Elapsed: c.Elapsed, Failure: f}
				t.Fatalf("turncheck: %s\n%s\n%s", f.Report, f.ShrinkStats(), saveForTest(t.Name(), res, target))
			case report.NotExercised:
				t.Fatalf("turncheck: %s (%s) was not exercised: %s", v.Invariant, v.Invariant.Title(), v.Reason)
			default:
				t.Skipf("%s (%s): %s: %s", v.Invariant, v.Invariant.Title(), v.Status, v.Reason)
			}
		})
	}
}

// saveForTest saves a Go test's failure under testdata/turncheck/ and
// says where, and the command that replays it exactly: from the module's
// root, where a person or CI most likely runs go test, with the file's
// absolute path.
func saveForTest(test string, res *report.Result, target targets.Target) string {
	f := res.Failure
	path := filepath.Join("testdata", "turncheck", fmt.Sprintf("%s-%s-%d.json",
		strings.NewReplacer("/", "_", " ", "_").Replace(test), f.Violation.Invariant, res.Seed))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "could not save the failure: " + err.Error()
	}
	if err := report.NewReport(res, specOf(target)).Save(path); err != nil {
		return "could not save the failure: " + err.Error()
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	return "saved: " + path + "\nreplay: TURNCHECK_REPLAY=" + abs + " " + goTestCommand(test)
}

// goTestCommand is the go test command that runs test alone, from the
// module's root.
func goTestCommand(test string) string {
	parts := strings.Split(test, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return "go test -run '" + strings.Join(parts, "/") + "' " + packageFromRoot()
}

// packageFromRoot is the package of the current directory (where go test
// runs a package's tests) as go test names it from the module's root:
// "./sub/pkg", or "." when no go.mod is found above it.
func packageFromRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return "."
	}
	for root := dir; ; {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			rel, err := filepath.Rel(root, dir)
			if err != nil || rel == "." {
				return "."
			}
			return "./" + filepath.ToSlash(rel)
		}
		up := filepath.Dir(root)
		if up == root {
			return "."
		}
		root = up
	}
}

// replayIn re-executes the failure saved at path against target, in t,
// up to TURNCHECK_REPLAY_TRIES times (shrink.ReproduceTries if unset),
// and fails t with what it came to: the failure, or that it did not
// break again.
func replayIn(t *testing.T, target targets.Target, path string) {
	t.Helper()
	msg, err := replayMessage(target, path, os.Getenv("TURNCHECK_REPLAY_TRIES"), t.Name())
	if err != nil {
		t.Fatalf("turncheck: %v", err)
	}
	// A replay that broke nothing fails too: the test was asked to show
	// a failure, and did not; its message says it is no FAIL verdict.
	t.Fatal(msg)
}

// replayMessage replays the failure saved at path against target, up to
// tries times (a number, or "" for shrink.ReproduceTries), and says what
// the replays came to, as replayIn fails test with it.
func replayMessage(target targets.Target, path, tries, test string) (string, error) {
	n := shrink.ReproduceTries
	if tries != "" {
		var err error
		if n, err = strconv.Atoi(tries); err != nil || n < 1 {
			return "", fmt.Errorf("TURNCHECK_REPLAY_TRIES=%s: want a number of tries, at least 1", tries)
		}
	}
	saved, err := report.ReadReport(path)
	if err != nil {
		return "", err
	}
	if saved.Failure == nil {
		return "", fmt.Errorf("%s holds no failure to replay", path)
	}
	r, err := ReplayFailureTries(context.Background(), target, saved.Failure, n)
	if err != nil {
		return "", err
	}
	var notes string
	for _, note := range r.Notes {
		notes += "\nnote: " + note
	}
	if r.Violation == nil {
		return fmt.Sprintf("turncheck: replayed %s\n%sTo try more: TURNCHECK_REPLAY_TRIES=%d TURNCHECK_REPLAY=%s %s%s",
			path, r.NotReproduced(), max(10, 4*n), path, goTestCommand(test), notes), nil
	}
	msg := fmt.Sprintf("turncheck: replayed %s:\n%s", path, report.FormatFailure(r.Violation, r.History, target.Profile()))
	if sv := saved.Failure.Violation; !r.Reproduced {
		msg = fmt.Sprintf("turncheck: replayed %s: it broke %s, not %s, the invariant saved, which it did not break again in %d %s:\n%s\n%s",
			path, r.Violation.Invariant, sv.Invariant, r.Tries, plural(r.Tries, "try", "tries"),
			report.FormatFailure(r.Violation, r.History, target.Profile()), r.Differed())
	} else if len(r.Misses) > 0 {
		msg += fmt.Sprintf("\nIt broke again on try %d; the tries before it did not break it.\n%s", r.Tries, r.Differed())
	}
	return msg + notes, nil
}

// specOf describes target for a saved report.
func specOf(target targets.Target) targets.ServerSpec {
	if s, ok := target.(targets.Specifier); ok {
		return s.Spec()
	}
	return targets.ServerSpec{Kind: "go"}
}

// uintFlag is the value of a number flag rapid registers, 0 if unset.
func uintFlag(name string) uint64 {
	rapidFlags.Lock()
	defer rapidFlags.Unlock()
	f := flag.Lookup(name)
	if f == nil {
		return 0
	}
	n, _ := strconv.ParseUint(f.Value.String(), 10, 64)
	return n
}

// initTesting makes testing.Short callable, as rapid calls it: outside a
// test binary the testing flags are registered and parsed (empty) first,
// once, whatever runs at once.
var initTesting = sync.OnceValue(func() error {
	testing.Init()
	if !flag.Parsed() {
		return flag.CommandLine.Parse(nil)
	}
	return nil
})

// holdSteps sets rapid's steps flag to steps, for a check about to start
// its Repeat, and returns the function that gives it back: rapid reads the
// flag once, as Repeat starts, and then calls the check action, which
// gives it back (see runner.property). Checks of runs with other steps,
// and Run reading rapid's flags, wait only that long.
func holdSteps(steps int) (release func()) {
	rapidFlags.Lock()
	f := flag.Lookup("rapid.steps")
	old := f.Value.String()
	if err := f.Value.Set(strconv.Itoa(steps)); err != nil {
		rapidFlags.Unlock()
		panic(fmt.Errorf("set rapid.steps: %w", err)) // an int into an int flag
	}
	return sync.OnceFunc(func() {
		_ = f.Value.Set(old)
		rapidFlags.Unlock()
	})
}

func randomSeed() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(errors.New("no randomness: " + err.Error()))
	}
	s := binary.LittleEndian.Uint64(b[:]) >> 1 // keep it positive when printed as a signed int
	if s == 0 {
		s = 1
	}
	return s
}
