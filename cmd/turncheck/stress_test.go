package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/scenarios/report"
)

// The stress mode: the clean reference server's checks, run through its
// profiles on a machine made slow, must not FAIL. A verdict that a slow
// machine turns into a FAIL is decided by the clock, not by the server;
// the contract allows a time bound to leave a check NOT EXERCISED, never
// to fail it. The machine is made slow three ways at once, as a busy CI
// runner is: the fake model and the server pause a random 0..-stress.stall
// at the points where a busy machine leaves a goroutine waiting
// (faults.StallModels, serve --stall); CPU hog processes compete for every
// core; and the harness and the server each run on one core
// (GOMAXPROCS=1), beside those hogs.
var (
	stressChecks = flag.Int("stress", 0, "TestStress: checks per protocol of the full campaign on a slowed machine (0: only the short one)")
	stressStall  = flag.Duration("stress.stall", 20*time.Millisecond, "TestStress: the fake model and the server pause a random 0..this at each stall point")
	stressHogs   = flag.Int("stress.hogs", runtime.NumCPU(), "TestStress: CPU hog processes of the full campaign (the short one runs none)")
	stressProcs  = flag.Int("stress.procs", 1, "TestStress: GOMAXPROCS of the harness and of the server (0 leaves it)")
	stressSeed   = flag.Uint64("stress.seed", 1, "TestStress: seed of each protocol's first check")
	stressBound  = flag.Duration("stress.timeout", 40*time.Minute, "TestStress: conform's --timeout for each protocol of the full campaign")
)

// shortStress is the campaign of a plain 'go test': a few checks per
// protocol, enough to show the stress machinery runs and a gross
// dependence on speed, small enough for the suite's time. It starts no
// CPU hog: beside it the suite's other packages keep both cores busy,
// and a hog of its own took a core from them for its whole run.
const (
	shortStressChecks = 2
	shortStressSteps  = 12
	stressSteps       = 20
)

// hogEnv, set, makes this test binary a CPU hog (hog).
const hogEnv = "TURNCHECK_HOG"

// stressAloneEnv, set, says this test binary was started by TestStress to
// run the short campaign in a process of its own (stressAlone).
const stressAloneEnv = "TURNCHECK_STRESS_ALONE"

// hog is a hog process's main: it spins on one core (its GOMAXPROCS is
// 1) until its stdin closes, which it does when the test stops it or
// when the test process dies, so that no hog outlives the test.
func hog() int {
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	for {
	}
}

// startHogs starts n CPU hogs, stopped when t ends: processes, not
// goroutines, so that they compete with the server process and the
// harness alike, as other jobs on a shared runner do.
func startHogs(t *testing.T, n int) {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	for range n {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), hogEnv+"=1", "GOMAXPROCS=1")
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			_ = stdin.Close()
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if u := cmd.ProcessState; u != nil {
				t.Logf("hog %d: %s of CPU", cmd.Process.Pid, u.UserTime().Round(time.Millisecond))
			}
		})
	}
}

// loadAverage is the 1-minute load average, "?" where /proc has none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// stressProfile writes protocol's reference profile with the server
// stalled (serve --stall) and on procs cores, and returns its path.
func stressProfile(t *testing.T, protocol string, stall time.Duration, procs int) string {
	t.Helper()
	b, err := os.ReadFile(protocolProfile(protocol))
	require.NoError(t, err)
	text := string(b)
	const last = "--request-timeout, 1s]"
	require.Contains(t, text, last, "the profile's command has changed: stress it anew")
	text = strings.Replace(text, last, fmt.Sprintf("--request-timeout, 1s, --stall, %s]", stall), 1)
	if procs > 0 {
		text = strings.Replace(text, "\nserver:\n", fmt.Sprintf("\nserver:\n  env: {GOMAXPROCS: \"%d\"}\n", procs), 1)
	}
	path := filepath.Join(t.TempDir(), "profile.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	return path
}

// shareOfDeadline is bound, or less: what is left of the test binary's
// -timeout (less a margin for stopping the servers), shared among the
// runs still to come (the full campaign's, one after another; the short
// one's run at once, each within its share, well within what is left). A
// machine too slow for the checks asked then leaves some unrun, NOT
// EXERCISED, rather than the test binary panicking at its deadline.
func shareOfDeadline(t *testing.T, bound time.Duration, runs int) time.Duration {
	d, ok := t.Deadline()
	if !ok {
		return bound
	}
	left := time.Until(d)
	return max(min(bound, (left-left/10-30*time.Second)/time.Duration(runs)), time.Second)
}

// TestStress: the clean reference server conforms through the profile of
// each protocol on a machine made slow: no FAIL, whatever a time bound
// leaves NOT EXERCISED. Plain 'go test' runs a short campaign (a couple
// of checks a protocol, no hog); the full one runs with -stress:
//
//	go test ./cmd/turncheck -run TestStress -stress 500 -timeout 150m -v
//
// Each protocol's run is bounded by -stress.timeout and by its share of
// what is left of -timeout: checks a slow machine leaves unrun are
// reported, not failed.
//
// It sets the stall of every fake model of the process and the
// GOMAXPROCS of the test binary, so it never runs beside other tests of
// its process: the full campaign runs without t.Parallel, its protocols
// one after another; the short one's run at once, in a test binary of
// their own (stressAlone), beside the other tests of this one.
func TestStress(t *testing.T) {
	if *stressChecks == 0 && os.Getenv(stressAloneEnv) == "" {
		stressAlone(t)
		return
	}
	onPath(t)
	checks, steps, hogs, bound := shortStressChecks, shortStressSteps, 0, 10*time.Minute
	if *stressChecks > 0 {
		checks, steps, hogs, bound = *stressChecks, stressSteps, *stressHogs, *stressBound
	}
	t.Cleanup(faults.StallModels(*stressStall))
	if *stressProcs > 0 {
		before := runtime.GOMAXPROCS(*stressProcs)
		t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	}
	startHogs(t, hogs)
	protocols := []string{"chat", "responses", "sessions", "a2a"}
	for i, protocol := range protocols {
		t.Run(protocol, func(t *testing.T) {
			if *stressChecks == 0 {
				// The short campaign's runs mostly wait out their stalls:
				// they run at once, still apart from the other tests (their
				// parent is not parallel, and ends after them).
				t.Parallel()
			}
			bound := shareOfDeadline(t, bound, len(protocols)-i)
			profile := stressProfile(t, strings.TrimPrefix(protocol, "chat"), *stressStall, *stressProcs)
			dir := t.TempDir()
			save, verdicts := filepath.Join(dir, "failures"), filepath.Join(dir, "verdicts.json")
			if *stressChecks > 0 {
				// Kept for replay: a FAIL of the full campaign is the
				// finding it exists for.
				save = filepath.Join(os.TempDir(), fmt.Sprintf("turncheck-stress-%s-%d", protocol, time.Now().Unix()))
			}
			load, began := loadAverage(), time.Now()
			code, stdout, stderr := runCLI(t, "conform", "--profile", profile, "--checks", fmt.Sprint(checks),
				"--steps", fmt.Sprint(steps), "--seed", fmt.Sprint(*stressSeed), "--timeout", bound.String(),
				"--save", save, "--json", verdicts, "--out", filepath.Join(dir, "out"))
			elapsed := time.Since(began).Round(time.Second)
			require.Contains(t, []int{exitOK, exitViolation, exitNotProven}, code, "the run did not end in verdicts:\nstdout:\n%s\nstderr:\n%s", stdout, stderr)
			raw, err := os.ReadFile(verdicts)
			require.NoError(t, err)
			var c report.Conformance
			require.NoError(t, json.Unmarshal(raw, &c))
			require.Positive(t, c.Stats.Checks, "no check ran:\n%s", stdout)
			var passed, notExercised []string
			for _, v := range c.Verdicts {
				switch v.Status {
				case report.Fail:
					msg := "no violation"
					if f := v.Failure; f != nil && f.Violation != nil {
						msg = fmt.Sprintf("%s (seed %d, check %d)", f.Violation.Reason, f.Seed, f.Check)
					}
					t.Errorf("%s FAILs on the clean server under stress: %s; saved under %s", v.Invariant, msg, save)
				case report.Pass:
					passed = append(passed, fmt.Sprintf("%s:%d", v.Invariant, v.Evaluations))
				case report.NotExercised:
					notExercised = append(notExercised, string(v.Invariant))
				}
			}
			assert.NotEmpty(t, passed, "nothing was judged: a campaign that checks nothing proves nothing\n%s", stdout)
			t.Logf("%s: %d of %d checks (stopped: %q) in %s, load average %s before, %s after; pass %v; not exercised %v",
				protocol, c.Stats.Checks, checks, c.Stopped, elapsed, load, loadAverage(), passed, notExercised)
			if t.Failed() || testing.Verbose() && *stressChecks > 0 {
				t.Logf("stdout:\n%s", stdout)
			}
		})
	}
}

// stressAlone runs the short campaign as TestStress alone in a new
// process of this test binary, and fails t as it fails: its stall and
// GOMAXPROCS are that process's, and this one's other tests run on beside
// it rather than wait out its stalls.
func stressAlone(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	require.NoError(t, err)
	args := []string{"-test.run=^TestStress$", "-test.count=1", "-test.v"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+time.Until(d).Round(time.Second).String())
	}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), stressAloneEnv+"=1")
	out, err := cmd.CombinedOutput()
	// Its runs' summaries (or its failures), as if it had run here.
	for line := range strings.Lines(string(out)) {
		if s := strings.TrimSpace(line); strings.HasPrefix(s, "stress_test.go:") || strings.HasPrefix(s, "Error") {
			t.Log(s)
		}
	}
	require.NoError(t, err, "TestStress in a process of its own:\n%s", out)
	require.Contains(t, string(out), "--- PASS: TestStress ", "TestStress did not run in its process:\n%s", out)
}
