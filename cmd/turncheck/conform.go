package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/report"
)

const conformHelp = `Usage: turncheck conform --profile FILE [--checks N] [--seed S] [--timeout D] [--skip T3]... [--shard K/N]
       turncheck conform --url URL [--model-addr HOST:PORT] [flags]

Checks a session server, in any language, against the whole contract of
PROTOCOL.md and gives a verdict per invariant, one (crash) on whether the
server stays up (its process never exits on its own while it serves),
and one (start) on whether it starts: at the run's start, between
checks, and again at every restart and crash drawn, within the tries its
profile allows (server.start_tries, default 1):

  PASS            exercised, and never broken: the line says how often,
                  counting only what could have broken it
  FAIL            broken: the shrunk steps follow, saved with the results
  NOT APPLICABLE  the server's declared policies, or the way it runs, exclude it
  NOT EXERCISED   never reached with its preconditions met (e.g. no turn ended ok)
  SKIPPED         left out with --skip as a known failure
  SAME CAUSE      broken only in the way another invariant's finding was
                  (one root cause, reported once, there): not a pass
  KNOWN           broken, as the --baseline lists: shown, and no failure
  FIXED           the --baseline lists a finding of it, and it passed
  SET ASIDE       not exercised in a run with known findings, whose
                  conversations were set aside: no failure of the gate

A broken invariant does not end the run (unless --fail-fast): it is
shrunk, printed and saved at once, and the checks go on for the others, with what it touched set aside: its later
consequences are counted in the summary, never a FAIL of their own. The
summary counts the turns that did not end ok by cause, and warns when the
run is weak (no turn ended ok, unknown outcomes or one refusal dominate). The server must take the base URL of an
OpenAI-compatible model provider: the harness runs a fake one, which it
scripts to fail, hang and cut streams, and reads the server's history from
what the server sends it.

--profile FILE is a YAML profile (see profiles/README.md; without --profile
or --url, turncheck.yaml in the current directory is read): the command that
starts the server (with {addr}, {port}, {model_url}, {data_dir}), or the url
of a running one, the conversation header, API keys, the model name,
whether the server offers the tool loop's tools (echo and lookup), and the
policies it declares. One server serves the whole run; each
check uses conversation ids of its own.

The profile's protocol says how turns reach the server:
{protocols}server.replicas: N starts N processes
over one store (server.store: postgres starts a throwaway PostgreSQL for
them) and breaks their links to the store and to the client mid-turn;
server.front names a load balancer you run in front of them. profiles/
holds a ready profile of each shape, for the reference server.

--url URL checks a server that already runs with the default profile (no
keys, X-Conversation-Id, policy serialize). Start it with its model base URL
set to http://MODEL-ADDR/v1 first.

Every run keeps its results in a directory of its own (--out; by default
turncheck-results/TIME, with turncheck-results/latest naming the newest):
verdicts.txt (what the run printed), verdicts.json, junit.xml, index.html
(a page with every verdict, each failure's timeline and linearizability,
the counts and the server's last output), and failures/, each failure as
a file for 'turncheck replay FILE' and as a page.

--baseline FILE (or the profile's baseline field) gates on new findings
only: a finding the file lists, by its signature, is KNOWN, and fails
nothing; any other FAILs; a listed finding whose invariant passed is
FIXED. Every run saves its findings as baseline.json in its results dir;
'turncheck baseline' writes one from a run.

Off a terminal (a CI log, a file), progress is a line on stderr every 30s.

--parallel N runs N checks at once, each on a server and fake model of its
own (one per core by default, at most the profile's server.parallel; a
--url server runs one at a time), and shrinks by replaying N candidates at
once. The verdicts are those of the same checks run one after another:
--seed S gives the same findings whatever N is, on a server that behaves
the same way under the same steps.

--shard K/N runs only the K-th of N shares of the run's checks, each
check from its own seed as in the whole run: run the N shards anywhere (a
CI matrix) with the same --seed and --checks, and 'turncheck merge' joins
their verdicts.json into the run's verdicts.

--timeout bounds the whole run, shrinking included. A server that hangs,
streams forever or dies gets a verdict or a clear error within it. One
whose process exits on its own is a crash finding (shrunk and saved,
with its last output), and the run starts it again and goes on. One that
does not start (it exits, or is not ready within server.ready.timeout)
in server.start_tries tries, wherever in the run, is the start finding,
its last output quoted: the run stops there, keeps and writes the
verdicts of the checks that ran, and says how many of the checks asked
ran; each try tried again is a note. One that stops answering (8
requests in a row get no connection or no answer) ends the run with exit
2, never a pass. One that exits with a failure status on SIGTERM at the
end, or outlives its stop_grace and is killed, is a note beside the
verdicts.

A run ends in one of three outcomes, each with its word and exit status:

  CONFORMS          0  every applicable invariant turncheck checks was
                       exercised and passed (skipped ones, and known ones
                       under --baseline, aside) in every check asked, and
                       the server started and stayed up
  DOES NOT CONFORM  1  broken: an invariant FAILed (a finding not in the
                       baseline), or the server went down or did not start
  NOT PROVEN        4  nothing broke, but nothing is proven either: an
                       invariant was NOT EXERCISED (each is named, with
                       what would exercise it), or --timeout cut the run
                       short of the checks asked

Exit status 2 says the run could not be carried out (bad profile, a
profile that cannot express the server, a command that cannot be run at
all, a server that stopped answering), or was interrupted. A CI gate
fails on 1; whether it fails on 4 is its choice.

Examples:
  turncheck conform --profile profiles/reference.yaml
  turncheck conform --profile myserver.yaml --checks 50 --timeout 5m --skip T3
  turncheck conform --url http://127.0.0.1:8080 --model-addr 127.0.0.1:9090
`

func cmdConform(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("conform", conformHelp, stdout, stderr)
	profile := fs.String("profile", "", "YAML profile of the server: how to start it (or its url) and the policies it declares")
	url := fs.String("url", "", "base URL of a server that already runs, checked with the default profile")
	modelAddr := fs.String("model-addr", "127.0.0.1:9090", "with --url: where the fake model listens; the server's model base URL is http://ADDR/v1")
	checks := fs.Int("checks", 100, "state-machine runs to try")
	steps := fs.Int("steps", 30, "average steps per run")
	seed := fs.Uint64("seed", 0, "seed of the first run; 0 draws one")
	timeout := fs.Duration("timeout", 10*time.Minute, "wall-clock bound on the whole run, shrinking included")
	shrink := fs.Duration("shrink-time", 0, "time limit for shrinking each failure "+shrinkBoundHelp)
	var skip skipFlag
	fs.Var(&skip, "skip", "leave out a known failure, e.g. T3, or crash (repeatable)")
	out := fs.String("out", "", "directory for the run's results (verdicts as text, JSON and JUnit, index.html, each failure); default "+resultsRoot+"/TIME, with "+resultsRoot+"/latest naming the newest")
	save := fs.String("save", "", "directory where each failure is saved as it is found (JSON for 'turncheck replay FILE', and HTML); default: failures/ in the results")
	jsonPath := fs.String("json", "", "also write the verdicts as JSON to this file")
	junitPath := fs.String("junit", "", "also write the verdicts as JUnit XML, one test case per invariant, to this file")
	failFast := fs.Bool("fail-fast", false, "stop at the first failure (its verdict, shrunk and saved, and the others as far as they got)")
	parallel := fs.Int("parallel", 0, "checks run at once, each on a server of its own; 0: one per core, as the profile allows (server.parallel); a --url server runs one")
	var shard shardFlag
	fs.Var(&shard, "shard", "run only the K-th of N shares of the run's checks, as K/N (the same --seed and --checks on every shard); 'turncheck merge' joins their verdicts")
	baselinePath := fs.String("baseline", "", "a baseline of known findings ('turncheck baseline', or baseline.json of an earlier run's results): they are KNOWN, not FAIL; default: the profile's baseline")
	if code := fs.parse(args); code >= 0 {
		return code
	}
	if *checks <= 0 || *steps <= 0 || *timeout <= 0 || *shrink < 0 || *parallel < 0 {
		return fail(stderr, "conform", errors.New("--checks, --steps and --timeout must be positive, --shrink-time and --parallel not negative"))
	}
	if shard.N > 0 && *seed == 0 {
		return fail(stderr, "conform", errors.New("--shard needs --seed: the shards of one run must start from one seed"))
	}
	var target scenarios.Target
	var spec scenarios.ServerSpec
	if *profile == "" && *url == "" {
		if _, err := os.Stat(defaultProfile); err == nil {
			*profile = defaultProfile
			fmt.Fprintf(stdout, "turncheck conform: using the profile %s found in this directory\n", defaultProfile)
		}
	}
	switch {
	case (*profile == "") == (*url == ""):
		return fail(stderr, "conform", errors.New("give --profile FILE or --url URL, or write the profile as "+defaultProfile+
			" in this directory (see 'turncheck conform --help')"))
	case *profile != "":
		t, err := scenarios.LoadProfile(*profile)
		if err != nil {
			return fail(stderr, "conform", err)
		}
		abs, _ := filepath.Abs(*profile)
		target, spec = t, scenarios.ServerSpec{Kind: "profile", Profile: abs}
		if b := t.Profile().Baseline; *baselinePath == "" && b != "" {
			// A profile's baseline lies beside it.
			*baselinePath = b
			if !filepath.IsAbs(b) {
				*baselinePath = filepath.Join(filepath.Dir(*profile), b)
			}
		}
	default:
		t, err := scenarios.ParseProfile(fmt.Appendf(nil, "url: %q\nmodel_addr: %q\n", *url, *modelAddr))
		if err != nil {
			return fail(stderr, "conform", err)
		}
		target, spec = t, scenarios.ServerSpec{Kind: "url", URL: *url}
	}
	var baseline *report.Baseline
	if *baselinePath != "" {
		b, err := report.ReadBaseline(*baselinePath)
		if err != nil {
			return fail(stderr, "conform", err)
		}
		baseline = &b
	}
	res, err := openResults(*out, *save, time.Now())
	if err != nil {
		return fail(stderr, "conform", err)
	}
	// The results keep what the run printed, as it printed it.
	var text bytes.Buffer
	stdout = io.MultiWriter(stdout, &text)
	saveFinding := func(f *scenarios.Failure, stats scenarios.Stats) {
		rep := report.NewReport(&scenarios.Result{Stats: stats, Seed: f.Seed, Elapsed: f.FoundIn + f.ShrunkIn, Failure: f}, spec)
		// Named by the failing check's seed, the one the file holds.
		res.saveFailure("conform", fmt.Sprintf("%s-conform-%d", f.Violation.Invariant, f.Seed), rep.Save, rep.WriteHTML, stdout, stderr)
	}
	runCtx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	opts := scenarios.Options{Checks: *checks, Steps: *steps, Seed: *seed, ShrinkTime: *shrink, Context: runCtx, Skip: skip,
		FailFast: *failFast, Parallel: scenarios.Parallel(target, *parallel), Shard: scenarios.Shard(shard), Known: baseline.Lists}
	live := isTerminal(stderr)
	pl := newProgressLog(stderr, live)
	opts.Progress = pl.update
	if !live {
		// A check of a slow server may take minutes: a line every
		// progressEvery all the same.
		defer pl.beats(progressEvery / 6)()
	}
	// Each finding is printed, and saved, as soon as it is shrunk: on a
	// slow server the first one may come minutes before the run ends.
	printed := 0
	opts.Found = func(f *scenarios.Failure, stats scenarios.Stats) {
		if live {
			fmt.Fprint(stderr, "\r\033[K")
		}
		printed++
		fmt.Fprint(stdout, report.FindingText(f))
		if baseline.Lists(f) {
			fmt.Fprintf(stdout, "KNOWN: the baseline %s lists this finding; it fails nothing.\n", *baselinePath)
		}
		saveFinding(f, stats)
		fmt.Fprintln(stdout)
	}
	fmt.Fprintf(stdout, "turncheck conform: %s\n", describe(target))
	// Said once the server runs: the command as run, not its template.
	target = onStart(target, func(cmd string) { fmt.Fprintf(stdout, "the server started as: %s\n", cmd) })
	if r, ok := target.(scenarios.Remote); ok {
		fmt.Fprintf(stdout, "the fake model listens at http://%s/v1: the server must be configured to call it there\n", r.ModelAt)
	}
	c, err := scenarios.Conform(target, opts)
	if live {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err != nil && (c == nil || c.Stats.Steps == 0) {
		// Nothing was sent (a command that cannot run, say): the cause
		// alone, not a table of verdicts that rest on nothing. The
		// results say it too.
		fail(io.MultiWriter(stderr, &text), "conform", err)
		res.writeText("conform", "verdicts.txt", &text, stderr)
		return exitUsage
	}
	if baseline != nil {
		c.ApplyBaseline(*baseline, *baselinePath)
	}
	// What was found before an error is printed and saved all the same.
	fmt.Fprint(stdout, c.Table())
	if printed > 0 {
		fmt.Fprintf(stdout, "\n(the %d failure(s) are printed above, as they were found)\n", printed)
	}
	code := conclude("conform", c, err, *jsonPath, *junitPath, stdout, io.MultiWriter(stderr, &text))
	if c.Shard != "" {
		fmt.Fprintf(stdout, "This is shard %s of the run: 'turncheck merge' joins the verdicts.json of its shards.\n", c.Shard)
	}
	res.writeText("conform", "verdicts.txt", &text, stderr)
	res.write("conform", "verdicts.json", c.WriteJSON, stderr)
	res.write("conform", "junit.xml", c.WriteJUnit, stderr)
	res.write("conform", report.BaselineFile, c.Baseline().Write, stderr)
	res.write("conform", "index.html", func(w io.Writer) error { return c.WriteHTML(w, spec) }, stderr)
	res.closing(stdout)
	return code
}

// conclude prints the closing lines of verdicts c, writes them where
// --json and --junit say, and returns the exit status they call for: err
// is what ended the run, if anything.
func conclude(cmd string, c *report.Conformance, err error, jsonPath, junitPath string, stdout, stderr io.Writer) int {
	fmt.Fprint(stdout, "\n"+c.Closing())
	writeReport(cmd, jsonPath, "json", c.WriteJSON, stdout, stderr)
	writeReport(cmd, junitPath, "junit", c.WriteJUnit, stdout, stderr)
	switch {
	case err != nil:
		fail(stderr, cmd, err)
		return exitUsage
	case c.Stopped == "interrupted":
		fmt.Fprintln(stdout, "INTERRUPTED: the verdicts above cover the checks run so far")
		return exitUsage
	case c.Passed() && c.Outcome() != "CONFORMS":
		fmt.Fprintf(stdout, "%s: no new finding; the known ones are in the baseline %s\n", c.Outcome(), c.BaselineFrom)
		return exitOK
	case c.Passed():
		fmt.Fprintln(stdout, "CONFORMS: every applicable invariant turncheck checks was exercised and passed")
		return exitOK
	case c.NotProven():
		fmt.Fprint(stdout, c.NotProvenText())
		return exitNotProven
	default:
		fmt.Fprintln(stdout, "DOES NOT CONFORM: see the verdicts above")
	}
	return exitViolation
}

// defaultProfile is the profile conform reads when given neither
// --profile nor --url: a project keeps its server's profile at its root
// and runs a bare 'turncheck conform'.
const defaultProfile = "turncheck.yaml"

// describe names the server a target runs, for the first line of output.
func describe(t scenarios.Target) string {
	switch t := t.(type) {
	case scenarios.Remote:
		return "the server at " + t.URL
	case scenarios.Subprocess:
		// The template: how it was started, placeholders filled, is said
		// once it is (onStart).
		return "the server the profile's command starts: " + t.String()
	}
	return fmt.Sprintf("%T", t)
}

// onStart makes t, where it is a Subprocess, call said with the command
// line of its first start, its placeholders filled and quoted for a
// shell: what was actually run, once, whatever restarts, replicas and
// parallel checks start after it. Another target is returned as it is.
func onStart(t scenarios.Target, said func(cmd string)) scenarios.Target {
	s, ok := t.(scenarios.Subprocess)
	if !ok {
		return t
	}
	var once sync.Once
	s.Started = func(argv []string) { once.Do(func() { said(shellLine(argv)) }) }
	return s
}

// shellLine is argv as a shell command line: each argument that a shell
// would split or expand in single quotes.
func shellLine(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = a
		if a == "" || strings.ContainsFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("@%+=:,./_-", r))
		}) {
			out[i] = report.ShellQuote(a)
		}
	}
	return strings.Join(out, " ")
}

// shardFlag is --shard K/N.
type shardFlag scenarios.Shard

func (s *shardFlag) String() string { return scenarios.Shard(*s).String() }

func (s *shardFlag) Set(v string) error {
	var k, n int
	if _, err := fmt.Sscanf(v, "%d/%d", &k, &n); err != nil || n < 1 || k < 1 || k > n || fmt.Sprintf("%d/%d", k, n) != v {
		return fmt.Errorf("%q: want K/N, with 1 <= K <= N (e.g. 2/3)", v)
	}
	*s = shardFlag{K: k, N: n}
	return nil
}

// skipFlag collects --skip values, each an invariant of PROTOCOL.md.
type skipFlag []model.Invariant

func (s *skipFlag) String() string { return fmt.Sprint([]model.Invariant(*s)) }

func (s *skipFlag) Set(v string) error {
	if strings.EqualFold(strings.TrimSpace(v), string(model.Start)) {
		return errors.New("start cannot be skipped: a server that does not start leaves nothing to check (a profile's server.start_tries lets a start be tried again)")
	}
	for _, known := range report.Judged() {
		if strings.EqualFold(strings.TrimSpace(v), string(known)) {
			*s = append(*s, known)
			return nil
		}
	}
	return fmt.Errorf("%q is not an invariant (T1 to T11, or crash)", v)
}

// progressLine rewrites one line on a terminal after every check.
func progressLine(w io.Writer) func(scenarios.Stats) {
	return progress(w, true)
}

// progressEvery is how often progress is said off a terminal.
const progressEvery = 30 * time.Second

// progress says how a run goes: on a terminal (live) one updating line,
// otherwise (a CI log, a file) a plain line at most every progressEvery.
func progress(w io.Writer, live bool) func(scenarios.Stats) {
	return newProgressLog(w, live).update
}

// progressLog says how a run goes, from what its checks tell it
// (update) and, off a terminal, every progressEvery in between (beat):
// on a slow server one check may take minutes. Safe for concurrent use.
type progressLog struct {
	w    io.Writer
	live bool
	mu   sync.Mutex
	// start is when the run began, said when the last line was said;
	// latest are the counts as the checks last told them.
	start, said time.Time
	latest      scenarios.Stats
}

func newProgressLog(w io.Writer, live bool) *progressLog {
	now := time.Now()
	return &progressLog{w: w, live: live, start: now, said: now}
}

// update takes the counts a check, or a shrink replay, gives, and says
// them: at once on a terminal, else if nothing was said for progressEvery.
func (p *progressLog) update(s scenarios.Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latest = s
	if !p.live && time.Since(p.said) < progressEvery {
		return
	}
	p.say("")
}

// beat says the latest counts again, off a terminal, where nothing was
// said for progressEvery: a check still running.
func (p *progressLog) beat() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live || time.Since(p.said) < progressEvery {
		return
	}
	if p.latest.Shrinking != "" {
		p.say("") // the line says what runs
		return
	}
	p.say("; a check is running")
}

// beats calls beat every tick until the returned stop is called, which
// waits for it to end.
func (p *progressLog) beats(tick time.Duration) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				p.beat()
			}
		}
	}()
	return func() { close(done); <-ended }
}

// say writes the latest counts, with more said after them; p.mu held.
func (p *progressLog) say(more string) {
	p.said = time.Now()
	s := p.latest
	faults := 0
	for _, n := range s.Faults {
		faults += n
	}
	elapsed := time.Since(p.start)
	line := fmt.Sprintf("%d checks, %.0f requests/s, %d faults injected, %s", s.Checks,
		float64(s.Steps)/max(elapsed.Seconds(), 1e-3), faults, elapsed.Round(time.Second))
	switch {
	case s.Shrinking != "":
		line += fmt.Sprintf("; shrinking %s: %d replays so far", s.Shrinking, s.ShrinkRuns)
	case s.ShrinkRuns > 0:
		line += fmt.Sprintf("; %d shrink replays", s.ShrinkRuns)
	}
	line += more
	if p.live {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		return
	}
	fmt.Fprintf(p.w, "turncheck: %s\n", line)
}
