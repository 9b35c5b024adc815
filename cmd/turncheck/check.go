package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/shrink"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// shrinkBoundHelp says, for --shrink-time, how a shrink is bounded.
const shrinkBoundHelp = "(no replay starts after it; stopping the one cut short may take the server's stop grace more); " +
	"0 counts it in replays: 100 replays of the failing run at the speed it ran, within 30s and 10m, and only what the checks still to run leave of the run's time; " +
	"a failure has half of either bound to break its invariant again in, and its shrink gives up before a replay that would end past that"

const checkHelp = `Usage: turncheck check [--mutant NAME] [--concurrency POLICY] [--interruption POLICY] [--protocol P] [--checks N] [--steps N] [--seed S] [--shrink-time D]

Runs the state machine against the embedded reference server: new
conversations, continuations (streamed or not), invalid continuations,
retries of failed turns, a second API key reusing a conversation id, and
bursts of 2-6 turns sent at once on one id, and restarts and crashes,
while the fake model asks for tool calls (echo and lookup, in rounds),
injects errors, timeouts, cut streams and malformed chunks at any call of
a turn's tool loop, and the client drops turns mid-call, mid-answer or
while a tool runs.
In a burst the model holds every call and lets them go in a drawn order,
so an interleaving replays from its seed. Every step is checked against the
reference model, and every burst's conversation for linearizability. A
violation is shrunk to a short sequence, printed, and saved as JSON
(replay it with 'turncheck replay FILE') and as an HTML report (a
timeline of the steps and the linearizability of the history; it opens
offline). Every run keeps its results, pass or fail, in a directory of
its own (--out; by default turncheck-results/TIME, with
turncheck-results/latest naming the newest): report.txt, report.json,
junit.xml, index.html and failures/. --json, --junit and --html write
copies where CI wants them.

--concurrency says which policy the server runs with and is judged by:
serialize (a concurrent turn waits its turn) or reject (it gets 409 and
nothing changes). --interruption likewise: rollback (a turn whose client
disconnects leaves nothing), keep-consistent (it may keep its user
message and completed tool rounds) or complete (it runs on to its end and
is committed whole or not at all).

--protocol says how the harness reaches the server, one of:
{protocols}The reference server speaks each (under acp, as an agent in process, over
pipes that stand for its stdin and stdout). A mutant whose bug lives in
one protocol is reached through it.

Ctrl-C stops the run cleanly after the step in flight.

Exit status: 0 no invariant broken, 1 an invariant broken (or the server
went down: a crash finding), 2 usage or setup error, or a run interrupted
before it found anything.

Examples:
  turncheck check --mutant commit-on-stream-error --checks 200
  turncheck check --protocol responses
  turncheck check --concurrency reject
  turncheck check --interruption keep-consistent
  turncheck check --mutant fork-new-session
`

const replayHelp = `Usage: turncheck replay FILE [--tries N] [--json F] [--junit F] [--html F]
       turncheck replay --seed S [--mutant NAME] [--concurrency POLICY] [--steps N] [--shrink-time D]

With FILE, a failure that 'turncheck check' or 'turncheck conform' saved:
re-executes exactly its steps against a fresh server of the kind it was
found on, without searching or shrinking, and prints the report of what
they come to now: the same steps and, for a server that behaves the same
way under them, the same verdict, every time.

  check's    the reference server, with the mutant, policies and protocol
             it was found with
  conform's  the server its profile starts, through that profile, read
             again from the path conform was given (keep it there, or the
             replay says it cannot read it): replicas are started again
             (over a fresh PostgreSQL for store: postgres, each request
             sent to the replica it went to), and a profile's front must
             be running again, as for conform; a profile with url reaches
             that server again. A failure of 'conform --url' names no
             profile: write one (url and model_addr) and conform through it
  Go tests   a failure a Go test saved (scenarios.Run) replays from that
             test: TURNCHECK_REPLAY=FILE go test -run ...

A server that does not report its activity may not behave the same way:
a burst may run in another interleaving, a front may route a request to
another replica, a held call may end otherwise. So the steps are tried up
to --tries times, each in a fresh session, until they break the saved
invariant. When none does, replay says how each try differed from the
saved run (the outcome and status of each request, how a held call ended,
the replica that served, the order a burst's requests were answered in)
and exits 3: try more (--tries 20), or, if the bug was fixed, that is what
a fix looks like.

With --seed, runs again the check that seed starts on the reference
server (as 'turncheck check' printed it), searching and shrinking as check
does; a conform run's seed runs again with 'turncheck conform --seed S'.

Exit status: 0 no invariant broken (--seed), 1 an invariant broken, or
the server went down, a crash finding (with FILE:
the saved one, or, said so, another), 2 usage or setup error, 3 (with
FILE) no try broke the saved failure's invariant nor any other.

Examples:
  turncheck replay turncheck-results/latest/failures/T4-fork-new-session-4852977355662637239.json
  turncheck replay turncheck-results/latest/failures/T4-conform-3303715329137286035.json --tries 20
  turncheck replay --seed 4015895127573847763 --mutant mutate-before-run
`

// runFlags are the flags check and replay share: which server, and where
// the reports go.
type runFlags struct {
	mutant, concurrency, interruption, protocol, out, save, json, junit, html *string
}

func addRunFlags(fs *flagSet, mutantHelp string) runFlags {
	return runFlags{
		mutant:      fs.String("mutant", "", mutantHelp),
		concurrency: fs.String("concurrency", string(sut.Serialize), "the reference server's policy for a turn on a busy conversation: serialize or reject"),
		interruption: fs.String("interruption", "", "the reference server's policy for a turn whose client disconnects: rollback, keep-consistent "+
			"(it keeps the user message and completed tool pairs) or complete (it runs on to its end); default rollback, keep-consistent for the orphan-tool-call-on-interrupt mutant"),
		protocol: fs.String("protocol", "", "the client protocol the reference server is reached through: "+targets.ProtocolNames()+
			"; default chat, or the protocol of the mutant's bug"),
		out: fs.String("out", "", "directory for the run's results (the report as text, JSON, JUnit and index.html, and the failure); "+
			"default "+resultsRoot+"/TIME, with "+resultsRoot+"/latest naming the newest"),
		save:  fs.String("save", "", "directory where a failure is saved (as JSON, for 'turncheck replay FILE', and as HTML); default: failures/ in the results"),
		json:  fs.String("json", "", "also write the report as JSON (schema "+report.ReportSchema+") to this file"),
		junit: fs.String("junit", "", "also write the report as JUnit XML, one test case per invariant, to this file"),
		html:  fs.String("html", "", "also write the HTML report (timeline and linearizability) to this file"),
	}
}

// server parses the flags that choose the reference server.
func (rf runFlags) server() (reference.Target, error) {
	mutant, err := sut.ParseMutant(*rf.mutant)
	if err != nil {
		return reference.Target{}, err
	}
	policy, err := sut.ParseConcurrency(*rf.concurrency)
	if err != nil {
		return reference.Target{}, fmt.Errorf("--concurrency: %w", err)
	}
	r := reference.WithMutant(mutant)
	r.Concurrency = policy
	if *rf.interruption != "" {
		if r.Interruption, err = sut.ParseInterruption(*rf.interruption); err != nil {
			return reference.Target{}, fmt.Errorf("--interruption: %w", err)
		}
	}
	if rf.protocol != nil && *rf.protocol != "" {
		p, err := targets.ParseProtocol(*rf.protocol)
		if err != nil {
			return reference.Target{}, fmt.Errorf("--protocol: %w", err)
		}
		r.Protocol = p
	}
	return r, nil
}

// describeReference says which reference server runs, for people.
func describeReference(r reference.Target) string {
	return fmt.Sprintf("reference server, mutant %s, concurrency %s, interruption %s, protocol %s",
		mutantLabel(r.Mutant), cmp.Or(r.Concurrency, sut.Serialize), r.Interruption, cmp.Or(r.Protocol, targets.Chat))
}

// referenceFlags are the flags of check and replay that choose r, after
// its mutant.
func referenceFlags(r reference.Target) string {
	var b strings.Builder
	if r.Concurrency != "" && r.Concurrency != sut.Serialize {
		fmt.Fprintf(&b, " --concurrency %s", r.Concurrency)
	}
	if r.Interruption != reference.WithMutant(r.Mutant).Interruption {
		fmt.Fprintf(&b, " --interruption %s", r.Interruption)
	}
	if r.Protocol != reference.WithMutant(r.Mutant).Protocol {
		fmt.Fprintf(&b, " --protocol %s", cmp.Or(r.Protocol, targets.Chat))
	}
	return b.String()
}

func cmdCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("check", checkHelp, stdout, stderr)
	rf := addRunFlags(fs, "switch on a mutant of the reference server (see 'turncheck mutants')")
	checks := fs.Int("checks", 100, "state-machine runs to try")
	steps := fs.Int("steps", 30, "average steps per run")
	seed := fs.Uint64("seed", 0, "seed of the first run; 0 draws one")
	shrink := fs.Duration("shrink-time", 0, "time limit for shrinking a failure "+shrinkBoundHelp)
	parallel := fs.Int("parallel", 0, "checks run at once, each on a server of its own; 0: one per core (the verdict is the same either way)")
	if code := fs.parse(args); code >= 0 {
		return code
	}
	if *checks <= 0 || *steps <= 0 || *shrink < 0 || *parallel < 0 {
		return fail(stderr, "check", fmt.Errorf("--checks and --steps must be positive, --shrink-time and --parallel not negative"))
	}
	opts := scenarios.Options{Checks: *checks, Steps: *steps, Seed: *seed, ShrinkTime: *shrink, Context: ctx,
		Parallel: scenarios.Parallel(reference.Target{}, *parallel)}
	return checkAndReport("check", rf, opts, stdout, stderr)
}

func cmdReplay(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("replay", replayHelp, stdout, stderr)
	fs.positional = 1
	rf := addRunFlags(fs, "the mutant the seed was found with, if any")
	seed := fs.Uint64("seed", 0, "replay the check this seed starts, searching and shrinking again")
	tries := fs.Int("tries", shrink.ReproduceTries, "with FILE: replay the saved steps up to `N` times, each in a fresh session, until they break the saved invariant")
	steps := fs.Int("steps", 30, "with --seed: average steps per run, the value the seed was found with")
	shrink := fs.Duration("shrink-time", 0, "with --seed: time limit for shrinking the failure "+shrinkBoundHelp)
	if code := fs.parse(args); code >= 0 {
		return code
	}
	switch {
	case fs.NArg() == 1 && *seed != 0:
		return fail(stderr, "replay", errors.New("give a failure file or --seed, not both"))
	case *seed != 0 && flagGiven(fs, "tries"):
		return fail(stderr, "replay", errors.New("--tries is for a failure file: --seed searches again"))
	case fs.NArg() == 1 && *tries < 1:
		return fail(stderr, "replay", errors.New("--tries must be at least 1"))
	case fs.NArg() == 1:
		return replayFile(ctx, fs.Arg(0), *tries, rf, stdout, stderr)
	case *seed == 0:
		return fail(stderr, "replay", errors.New("give a failure file (saved by 'turncheck check' or 'turncheck conform') or --seed S"))
	case *steps <= 0 || *shrink < 0:
		return fail(stderr, "replay", errors.New("--steps must be positive, --shrink-time not negative"))
	}
	return checkAndReport("replay", rf, scenarios.Options{Checks: 1, Steps: *steps, Seed: *seed, ShrinkTime: *shrink, Context: ctx}, stdout, stderr)
}

// replayFile re-executes a saved failure's plans against a fresh server
// of the kind it was found on, up to tries times, without rapid's search,
// and reports what they come to now.
func replayFile(ctx context.Context, path string, tries int, rf runFlags, stdout, stderr io.Writer) int {
	saved, err := report.ReadReport(path)
	if err != nil {
		return fail(stderr, "replay", err)
	}
	if saved.Failure == nil || len(saved.Failure.Plans) == 0 {
		return fail(stderr, "replay", fmt.Errorf("%s holds no failure to replay (verdict %s)", path, saved.Verdict))
	}
	target, what, err := replayTarget(saved.Server)
	if err != nil {
		return fail(stderr, "replay", fmt.Errorf("%s: %w", path, err))
	}
	// How the server was started, as first run: said under the header.
	var started atomic.Pointer[string]
	target = onStart(target, func(cmd string) { started.Store(&cmd) })
	start := time.Now()
	r, err := scenarios.ReplayFailureTries(ctx, target, saved.Failure, tries)
	if r != nil {
		for _, n := range r.Notes {
			// Said beside the verdict, never instead of it.
			defer fmt.Fprintf(stdout, "note: %s\n", n)
		}
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		fmt.Fprintf(stderr, "turncheck replay: interrupted after %d of %d tries; the saved invariant did not break again so far\n", r.Tries, tries)
		return exitUsage
	}
	if err != nil {
		return fail(stderr, "replay", err)
	}
	var text bytes.Buffer
	stdout = io.MultiWriter(stdout, &text)
	// The replay's own counts: the run of the saved steps reported.
	res := &scenarios.Result{Seed: saved.Seed, Elapsed: time.Since(start), Stats: replayStats(r.History)}
	fmt.Fprintf(stdout, "turncheck replay: %s against %s\n", path, what)
	if cmd := started.Load(); cmd != nil {
		fmt.Fprintf(stdout, "the server started as: %s\n", *cmd)
	}
	// How to try more, where the tries did not show the saved failure.
	more := fmt.Sprintf("To try more: %s replay %s --tries %d\n", self(), absPath(path), max(10, 4*tries))
	v, sv := r.Violation, saved.Failure.Violation
	switch {
	case v == nil:
		fmt.Fprintf(stdout, "%s%s", r.NotReproduced(), more)
		return exitNotReproduced
	case r.Reproduced:
		fmt.Fprintf(stdout, "FAIL: %s (%s) broken\n\n%s\n", v.Invariant, v.Invariant.Title(),
			strings.TrimRight(report.FormatFailure(v, r.History, target.Profile()), "\n"))
		if len(r.Misses) > 0 {
			fmt.Fprintf(stdout, "\nIt broke again on try %d; the tries before it did not break it.\n%s", r.Tries, r.Differed())
		}
	default:
		// Another invariant than the one saved: a failure all the same,
		// but not the one the file is about.
		fmt.Fprintf(stdout, "FAIL: %s (%s) broken, not %s (%s), the invariant saved: in %d %s the saved steps did not break %s again, "+
			"and try %d broke %s instead\n\n%s\n\n%s%s",
			v.Invariant, v.Invariant.Title(), sv.Invariant, sv.Invariant.Title(), r.Tries, plural(r.Tries, "try", "tries"),
			sv.Invariant, firstBroke(r), v.Invariant, strings.TrimRight(report.FormatFailure(v, r.History, target.Profile()), "\n"),
			r.Differed(), more)
	}
	n := r.History[len(r.History)-1].Step
	res.Failure = &scenarios.Failure{Violation: v, Plans: saved.Failure.Plans[:n], History: r.History, Seed: saved.Seed,
		Report: report.FormatFailure(v, r.History, target.Profile())}
	rep := report.NewReport(res, saved.Server)
	// A replay keeps results only where asked: it is the loop of a
	// person fixing a bug, run again and again.
	var res0 *results
	if *rf.out != "" {
		if res0, err = openResults(*rf.out, *rf.save, time.Now()); err != nil {
			return fail(stderr, "replay", err)
		}
	}
	writeReports("replay", rf, rep, "", res0, &text, stdout, stderr)
	return exitViolation
}

// flagGiven reports whether the flag name was given on the command line.
func flagGiven(fs *flagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// firstBroke is the number of the first try of r that broke an invariant.
func firstBroke(r *scenarios.Replays) int {
	for _, m := range r.Misses {
		if m.Violation != nil {
			return m.Try
		}
	}
	return r.Tries
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// replayTarget starts the server a saved report is about, and says which
// it is.
func replayTarget(spec scenarios.ServerSpec) (scenarios.Target, string, error) {
	if spec.Kind == "reference" && spec.Replicas > 1 {
		return nil, "", fmt.Errorf("%s ran in a Go test, over its PostgreSQL: replay it from that test, or catch it through a replicated profile (server.replicas and store: postgres)", spec)
	}
	switch spec.Kind {
	case "reference":
		r, err := runFlags{mutant: &spec.Mutant, concurrency: &spec.Concurrency, interruption: &spec.Interruption, protocol: &spec.Protocol}.server()
		if err != nil {
			return nil, "", err
		}
		return r, "the " + describeReference(r), nil
	case "profile":
		t, err := scenarios.LoadProfile(spec.Profile)
		if err != nil {
			return nil, "", fmt.Errorf("the server's profile: %w", err)
		}
		return t, describe(t), nil
	case "url":
		return nil, "", fmt.Errorf("the server ran at %s, started by someone else: write a profile for it (url and model_addr) and check it with 'turncheck conform --profile'", spec.URL)
	}
	return nil, "", fmt.Errorf("a %q server: replay it from the Go test that checks that server", spec.Kind)
}

// replayStats counts what a replay of saved steps did.
func replayStats(history []history.Op) scenarios.Stats {
	s := scenarios.Stats{Checks: 1, Steps: len(history), Faults: map[string]int{}, Outcomes: map[string]int{}}
	for _, op := range history {
		s.Outcomes[op.Response.Outcome.String()]++
	}
	return s
}

// checkAndReport runs a check against the reference server and prints the
// summary and, on a violation, the report, where it was saved and how to
// replay it.
func checkAndReport(cmd string, rf runFlags, opts scenarios.Options, stdout, stderr io.Writer) int {
	target, err := rf.server()
	if err != nil {
		return fail(stderr, cmd, err)
	}
	res0, err := openResults(*rf.out, *rf.save, time.Now())
	if err != nil {
		return fail(stderr, cmd, err)
	}
	// The results keep what the run printed, as it printed it.
	var text bytes.Buffer
	stdout = io.MultiWriter(stdout, &text)
	if isTerminal(stderr) {
		opts.Progress = progressLine(stderr)
	}
	res, err := scenarios.Check(target, opts)
	if opts.Progress != nil {
		fmt.Fprint(stderr, "\r\033[K")
	}
	interrupted := errors.Is(err, scenarios.ErrInterrupted)
	if interrupted && res.Failure == nil {
		fmt.Fprintf(stderr, "turncheck %s: interrupted after %d check(s), %d request(s), seed %d; no violation seen so far\n",
			cmd, res.Checks, res.Steps, res.Seed)
		return exitUsage
	}
	if interrupted {
		fmt.Fprintf(stderr, "turncheck %s: interrupted while shrinking; the steps below may not be the shortest\n", cmd)
	} else if err != nil {
		return fail(stderr, cmd, err)
	}
	rep := report.NewReport(res, target.Spec())
	fmt.Fprintf(stdout, "turncheck %s: %s, seed %d\n", cmd, describeReference(target), res.Seed)
	f := res.Failure
	if f == nil {
		fmt.Fprintf(stdout, "PASS: no invariant broken\n%s\nelapsed: %s\n", res.Summary(), res.Elapsed.Round(time.Millisecond))
		writeReports(cmd, rf, rep, "", res0, &text, stdout, stderr)
		return exitOK
	}
	switch {
	case f.Violation == nil:
		// Not the server's fault: the harness itself failed.
		fmt.Fprintf(stderr, "turncheck %s: the harness failed, not the server (seed %d):\n%s\n", cmd, res.Seed, f.Report)
		return exitUsage
	case f.Flaky:
		fmt.Fprintf(stdout, "FAIL: %s (%s) broken once, but the same steps did not break it again: "+
			"the server does not behave the same way under the same steps\n\n", f.Violation.Invariant, f.Violation.Invariant.Title())
	default:
		fmt.Fprintf(stdout, "FAIL: %s (%s) broken\n\n", f.Violation.Invariant, f.Violation.Invariant.Title())
	}
	fmt.Fprintln(stdout, strings.TrimRight(f.Report, "\n"))
	fmt.Fprintf(stdout, "\nTo send the requests by hand, start the fake model and the reference server, then paste the curl commands:\n"+
		"  turncheck model --listen 127.0.0.1:9090 &\n"+
		"  turncheck serve --listen 127.0.0.1:8080 --model-url http://127.0.0.1:9090/v1 --data-dir \"$(mktemp -d)\" %s&\n"+
		"  export TURNCHECK_URL=http://127.0.0.1:8080\n", serveFlags(target))
	fmt.Fprintf(stdout, "\n%s\n", res.Summary())
	fmt.Fprintf(stdout, "%s; elapsed: %s\n", f.ShrinkStats(), res.Elapsed.Round(time.Millisecond))
	if f.Seed != 0 {
		replay := fmt.Sprintf("%s replay --seed %d", self(), f.Seed)
		if target.Mutant != sut.Clean {
			replay += " --mutant " + string(target.Mutant)
		}
		replay += referenceFlags(target)
		if opts.Steps != 30 {
			replay += fmt.Sprintf(" --steps %d", opts.Steps)
		}
		fmt.Fprintf(stdout, "seed: %d (%s searches again)\n", f.Seed, replay)
	}
	name := fmt.Sprintf("%s-%s-%d", f.Violation.Invariant, mutantLabel(target.Mutant), res.Seed)
	writeReports(cmd, rf, rep, name, res0, &text, stdout, stderr)
	return exitViolation
}

// writeReports writes rep where the flags say, and, for a run with
// results, into them: a failure (named name) as JSON and HTML, then the
// report as text (what the run printed, text), JSON, JUnit and HTML. It
// prints each path.
func writeReports(cmd string, rf runFlags, rep *report.Report, name string, res *results, text *bytes.Buffer, stdout, stderr io.Writer) {
	if name != "" && res != nil {
		res.saveFailure(cmd, name, rep.Save, rep.WriteHTML, stdout, stderr)
	}
	writeReport(cmd, *rf.json, "json", rep.WriteJSON, stdout, stderr)
	writeReport(cmd, *rf.junit, "junit", rep.WriteJUnit, stdout, stderr)
	writeReport(cmd, *rf.html, "html", rep.WriteHTML, stdout, stderr)
	if res == nil {
		return
	}
	res.writeText(cmd, "report.txt", text, stderr)
	res.write(cmd, "report.json", rep.WriteJSON, stderr)
	res.write(cmd, "junit.xml", rep.WriteJUnit, stderr)
	res.write(cmd, "index.html", rep.WriteHTML, stderr)
	res.closing(stdout)
}

// writeReport renders a report (what: json, junit, html) to path, if one
// was asked for, and says where it went; a rendering that fails leaves no
// file behind.
func writeReport(cmd, path, what string, render func(io.Writer) error, stdout, stderr io.Writer) {
	if path == "" {
		return
	}
	var b bytes.Buffer
	err := render(&b)
	if err == nil {
		err = os.WriteFile(path, b.Bytes(), 0o644)
	}
	if err != nil {
		fmt.Fprintf(stderr, "turncheck %s: the %s report: %v\n", cmd, what, err)
		return
	}
	fmt.Fprintf(stdout, "%s: %s\n", what, path)
}

func mutantLabel(m sut.Mutant) string {
	if m == sut.Clean {
		return "none"
	}
	return string(m)
}

// serveFlags are the 'turncheck serve' flags that make the server the one
// the check ran against: its keys, policies and mutant.
func serveFlags(r reference.Target) string {
	var b strings.Builder
	for _, k := range r.Profile().Keys {
		fmt.Fprintf(&b, "--key %s ", k)
	}
	if r.Concurrency != "" && r.Concurrency != sut.Serialize {
		fmt.Fprintf(&b, "--concurrency %s ", r.Concurrency)
	}
	if r.Interruption != "" && r.Interruption != sut.Rollback {
		fmt.Fprintf(&b, "--interruption %s ", r.Interruption)
	}
	fmt.Fprintf(&b, "--compact-after %d ", reference.CompactAfter)
	if r.Mutant != sut.Clean {
		fmt.Fprintf(&b, "--mutant %s ", r.Mutant)
	}
	return b.String()
}

// isTerminal reports whether w is a terminal, where a progress line that
// rewrites itself helps rather than litters.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
