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
	"time"

	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/sut"
)

const checkHelp = `Usage: turncheck check [--mutant NAME] [--concurrency POLICY] [--checks N] [--steps N] [--seed S] [--shrink-time D]

Runs the state machine against the embedded reference server: new
conversations, continuations (streamed or not), invalid continuations,
retries of failed turns, a second API key reusing a conversation id, and
bursts of 2-6 turns sent at once on one id, while the fake model injects
errors, timeouts, cut streams and malformed chunks and the client aborts.
In a burst the model holds every call and lets them go in a drawn order,
so an interleaving replays from its seed. Every step is checked against the
reference model, and every burst's conversation for linearizability. A
violation is shrunk to a short sequence and printed with the seed, the
command that replays it, and the path of an HTML page that shows the
history (open it in a browser; it needs no network).

--concurrency says which policy the server runs with and is judged by:
serialize (a concurrent turn waits its turn) or reject (it gets 409 and
nothing changes).

Examples:
  turncheck check --mutant commit-on-stream-error --checks 200
  turncheck check --concurrency reject
  turncheck check --mutant fork-new-session
`

const replayHelp = `Usage: turncheck replay --seed S [--mutant NAME] [--concurrency POLICY] [--steps N] [--shrink-time D]

Replays the run that a seed starts, as 'turncheck check' printed it, and
prints the same report: the broken invariant, the shrunk steps with what the
model saw, and a curl command per request.

Example:
  turncheck replay --seed 4015895127573847763 --mutant mutate-before-run
`

// runFlags are the flags check and replay share: which server, and where a
// failure's history page goes.
type runFlags struct {
	mutant, concurrency, historyHTML *string
}

func addRunFlags(fs *flagSet, mutantHelp string) runFlags {
	return runFlags{
		mutant:      fs.String("mutant", "", mutantHelp),
		concurrency: fs.String("concurrency", string(sut.Serialize), "the reference server's policy for a turn on a busy conversation: serialize or reject"),
		historyHTML: fs.String("history-html", "", "where to write a failure's history page (default: turncheck-SEED-history.html in the temp dir)"),
	}
}

func cmdCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("check", checkHelp, stdout, stderr)
	rf := addRunFlags(fs, "switch on a mutant of the reference server (see 'turncheck mutants')")
	checks := fs.Int("checks", 100, "state-machine runs to try")
	steps := fs.Int("steps", 30, "average steps per run")
	seed := fs.Uint64("seed", 0, "seed of the first run; 0 draws one")
	shrink := fs.Duration("shrink-time", 30*time.Second, "time limit for shrinking a failure")
	if code := fs.parse(args); code >= 0 {
		return code
	}
	if *checks <= 0 || *steps <= 0 || *shrink <= 0 {
		return fail(stderr, "check", fmt.Errorf("--checks, --steps and --shrink-time must be positive"))
	}
	return checkAndReport("check", rf, scenarios.Options{Checks: *checks, Steps: *steps, Seed: *seed, ShrinkTime: *shrink, Context: ctx}, stdout, stderr)
}

func cmdReplay(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("replay", replayHelp, stdout, stderr)
	rf := addRunFlags(fs, "the mutant the seed was found with, if any")
	seed := fs.Uint64("seed", 0, "the seed to replay (required)")
	steps := fs.Int("steps", 30, "average steps per run: the value the seed was found with")
	shrink := fs.Duration("shrink-time", 30*time.Second, "time limit for shrinking the failure")
	if code := fs.parse(args); code >= 0 {
		return code
	}
	if *seed == 0 {
		return fail(stderr, "replay", fmt.Errorf("--seed is required: the seed a failing 'turncheck check' printed"))
	}
	if *steps <= 0 || *shrink <= 0 {
		return fail(stderr, "replay", fmt.Errorf("--steps and --shrink-time must be positive"))
	}
	return checkAndReport("replay", rf, scenarios.Options{Checks: 1, Steps: *steps, Seed: *seed, ShrinkTime: *shrink, Context: ctx}, stdout, stderr)
}

// checkAndReport runs a check against the reference server and prints the
// summary and, on a violation, the report and how to replay it.
func checkAndReport(cmd string, rf runFlags, opts scenarios.Options, stdout, stderr io.Writer) int {
	mutant, err := sut.ParseMutant(*rf.mutant)
	if err != nil {
		return fail(stderr, cmd, err)
	}
	policy, err := sut.ParseConcurrency(*rf.concurrency)
	if err != nil {
		return fail(stderr, cmd, fmt.Errorf("--concurrency: %w", err))
	}
	label := "none"
	if mutant != sut.Clean {
		label = string(mutant)
	}
	if isTerminal(stderr) {
		opts.Progress = func(s scenarios.Stats) {
			fmt.Fprintf(stderr, "\r\033[K%d checks, %d steps...", s.Checks, s.Steps)
		}
	}
	res, err := scenarios.Check(scenarios.Reference{Mutant: mutant, Concurrency: policy}, opts)
	if opts.Progress != nil {
		fmt.Fprint(stderr, "\r\033[K")
	}
	interrupted := errors.Is(err, scenarios.ErrInterrupted)
	if interrupted && res.Failure == nil {
		fmt.Fprintf(stderr, "turncheck %s: interrupted after %d check(s), %d step(s), seed %d; no violation seen so far\n",
			cmd, res.Checks, res.Steps, res.Seed)
		return exitUsage
	}
	if interrupted {
		fmt.Fprintf(stderr, "turncheck %s: interrupted while shrinking; the steps below may not be the shortest\n", cmd)
	} else if err != nil {
		return fail(stderr, cmd, err)
	}
	fmt.Fprintf(stdout, "turncheck %s: reference server, mutant %s, concurrency %s, seed %d\n", cmd, label, policy, res.Seed)
	f := res.Failure
	if f == nil {
		fmt.Fprintf(stdout, "PASS: no invariant broken\n%s\nelapsed: %s\n", res.Summary(), res.Elapsed.Round(time.Millisecond))
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
		"  export TURNCHECK_URL=http://127.0.0.1:8080\n", serveFlags(mutant, policy))
	fmt.Fprintf(stdout, "\n%s\n", res.Summary())
	fmt.Fprintf(stdout, "found after %d check(s) in %s; shrunk to %d step(s); elapsed: %s\n",
		f.FoundAfter, f.FoundIn.Round(time.Millisecond), len(f.Plans), res.Elapsed.Round(time.Millisecond))
	if f.Seed != 0 {
		replay := fmt.Sprintf("turncheck replay --seed %d", f.Seed)
		if mutant != sut.Clean {
			replay += " --mutant " + string(mutant)
		}
		if policy != sut.Serialize {
			replay += " --concurrency " + string(policy)
		}
		if opts.Steps != 30 {
			replay += fmt.Sprintf(" --steps %d", opts.Steps)
		}
		fmt.Fprintf(stdout, "seed: %d\nreplay: %s\n", f.Seed, replay)
	}
	if page, err := writeHistoryPage(*rf.historyHTML, res.Seed, f.History); err != nil {
		fmt.Fprintf(stderr, "turncheck %s: the history page: %v\n", cmd, err)
	} else if page != "" {
		fmt.Fprintf(stdout, "history: %s (the turns per conversation, injected faults, and how far they linearize)\n", page)
	}
	return exitViolation
}

// writeHistoryPage writes porcupine's visualisation of a failing history
// to path (a default one in the temp dir if ""), and returns the path.
func writeHistoryPage(path string, seed uint64, history []scenarios.Op) (string, error) {
	if len(history) == 0 {
		return "", nil
	}
	if path == "" {
		path = filepath.Join(os.TempDir(), fmt.Sprintf("turncheck-%d-history.html", seed))
	}
	var b bytes.Buffer
	if err := scenarios.WriteLinearizability(&b, history); err != nil {
		return "", err
	}
	return path, os.WriteFile(path, b.Bytes(), 0o644)
}

// serveFlags are the 'turncheck serve' flags that make the server the one
// the check ran against: its keys, policy and mutant.
func serveFlags(m sut.Mutant, policy sut.Concurrency) string {
	var b strings.Builder
	for _, k := range (scenarios.Reference{}).Profile().Keys {
		fmt.Fprintf(&b, "--key %s ", k)
	}
	if policy != sut.Serialize {
		fmt.Fprintf(&b, "--concurrency %s ", policy)
	}
	if m != sut.Clean {
		fmt.Fprintf(&b, "--mutant %s ", m)
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
