package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/sut"
)

// mutantInfo is the MutantInfo of m.
func mutantInfo(t *testing.T, m sut.Mutant) sut.MutantInfo {
	t.Helper()
	for _, info := range sut.Mutants() {
		if info.Mutant == m {
			return info
		}
	}
	t.Fatalf("no mutant %s", m)
	return sut.MutantInfo{}
}

// TestConformBaseline: a run's findings, saved as its baseline, gate a
// later run on new findings only. The server with docker-agent's #2947
// (a continuation without a user message replayed, T3) FAILs; with its
// baseline, a run of the same server from another seed lists T3 KNOWN and
// exits 0; a server with #2890 instead (a failed turn's message kept, T1)
// FAILs T1, new there, and its T3, exercised and passed, is FIXED. The
// three show in the text, JSON, JUnit and HTML.
func TestConformBaseline(t *testing.T) {
	t.Parallel() // it mostly waits on the servers it starts
	onPath(t)
	dir := t.TempDir()
	replay := writeMutantProfile(t, dir, mutantInfo(t, sut.ReplayWithoutUser))
	first := filepath.Join(dir, "first")
	code, stdout, stderr := runCLI(t, "conform", "--profile", replay, "--checks", "4", "--steps", "20", "--seed", "2",
		"--out", first, "--shrink-time", "3s", "--parallel", "1")
	require.Equal(t, exitViolation, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	require.Regexp(t, `(?m)^T3 +.*\bFAIL\b`, stdout)
	saved, err := report.ReadBaseline(filepath.Join(first, report.BaselineFile))
	require.NoError(t, err, "every run saves its findings as a baseline")
	require.Len(t, saved.Findings, 1)
	assert.Equal(t, "T3", string(saved.Findings[0].Invariant))

	b := filepath.Join(dir, "baseline.json")
	code, stdout, stderr = runCLI(t, "baseline", "--from", first, "--out", b)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, "1 finding(s)")
	assert.Contains(t, stdout, saved.Findings[0].Signature)

	// The same bug from another seed, and another bug, each with the
	// baseline: two runs that share nothing but it, and wait on their
	// servers far more than they compute, so they run at once.
	second := filepath.Join(dir, "second")
	kept := writeMutantProfile(t, dir, mutantInfo(t, sut.CommitOnStreamError))
	type result struct {
		code           int
		stdout, stderr string
	}
	known := make(chan result, 1)
	go func() {
		var r result
		r.code, r.stdout, r.stderr = runCLI(t, "conform", "--profile", replay, "--checks", "4", "--steps", "20", "--seed", "7",
			"--out", second, "--shrink-time", "3s", "--parallel", "1", "--baseline", b)
		known <- r
	}()
	var third result
	third.code, third.stdout, third.stderr = runCLI(t, "conform", "--profile", kept, "--checks", "6", "--steps", "20", "--seed", "2",
		"--out", filepath.Join(dir, "third"), "--shrink-time", "3s", "--parallel", "1", "--baseline", b)
	r := <-known

	// The same bug from another seed: KNOWN, exit 0.
	code, stdout, stderr = r.code, r.stdout, r.stderr
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Regexp(t, `(?m)^T3 +.*\bKNOWN\b +in the baseline: `, stdout)
	assert.Contains(t, stdout, "KNOWN: the baseline "+b+" lists this finding")
	assert.Contains(t, stdout, "CONFORMS, BUT FOR 1 KNOWN FINDING(S): no new finding")
	assert.Contains(t, stdout, "a known finding (the baseline lists it): not shrunk again", "a known finding is matched, not shrunk")
	assert.NotContains(t, stdout, "NOT EXERCISED", "what the known finding set aside is SET ASIDE")
	junit, err := os.ReadFile(filepath.Join(second, "junit.xml"))
	require.NoError(t, err)
	assert.Regexp(t, `<skipped message="known finding, in the baseline [^"]*: T3`, string(junit), "a known finding is a skipped case, with why")
	verdicts, err := report.ReadConformance(filepath.Join(second, "verdicts.json"))
	require.NoError(t, err)
	assert.Equal(t, report.Known, verdicts.Verdicts[2].Status, "the JSON says KNOWN")
	html, err := os.ReadFile(filepath.Join(second, "index.html"))
	require.NoError(t, err)
	assert.Contains(t, string(html), "KNOWN")

	// Another bug, with the same baseline: a new FAIL, and T3 FIXED.
	code, stdout, stderr = third.code, third.stdout, third.stderr
	require.Equal(t, exitViolation, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Regexp(t, `(?m)^T1 +.*\bFAIL\b`, stdout)
	assert.Regexp(t, regexp.MustCompile(`(?m)^T3 +.*\bFIXED\b +\d+ .*the baseline's finding was not found, its trigger drawn \(.*\): T3`), stdout)
	assert.Contains(t, stdout, "DOES NOT CONFORM")

	// The baselines of two runs, merged: the findings of both, each once.
	// (The third's mutant is found as T1; where a client never hears its
	// turn failed, as on a loaded machine, also as T6 or T10: see
	// namedAs.)
	thirdSaved, err := report.ReadBaseline(filepath.Join(dir, "third", report.BaselineFile))
	require.NoError(t, err)
	var thirdNamed []string
	for _, f := range thirdSaved.Findings {
		thirdNamed = append(thirdNamed, string(f.Invariant))
	}
	require.Contains(t, thirdNamed, "T1")
	require.NotContains(t, thirdNamed, "T3", "the third run did not find the first's bug")
	both := filepath.Join(dir, "both.json")
	code, stdout, stderr = runCLI(t, "baseline", "--from", first, "--from", filepath.Join(dir, "third"), "--from", b, "--out", both)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, fmt.Sprintf("%d finding(s) of 3 run(s)", 1+len(thirdSaved.Findings)))
	merged, err := report.ReadBaseline(both)
	require.NoError(t, err)
	require.Len(t, merged.Findings, 1+len(thirdSaved.Findings))
	runs := map[string]int{}
	for _, f := range merged.Findings {
		runs[string(f.Invariant)] = f.Runs
		if f.Invariant == "T3" {
			assert.NotEmpty(t, f.Trigger)
		}
	}
	assert.Equal(t, 2, runs["T3"], "T3: in the first run, and in the baseline written from it")
	assert.Equal(t, 1, runs["T1"], "T1: in the third run alone")
}

// TestConformBaselineErrors: a baseline that cannot be read, or is no
// baseline, is a clear error before the run, exit 2.
func TestConformBaselineErrors(t *testing.T) {
	dir := t.TempDir()
	notOne := filepath.Join(dir, "verdicts.json")
	require.NoError(t, os.WriteFile(notOne, []byte(`{"schema":"turncheck/conformance/v2","verdicts":[]}`), 0o644))
	for path, want := range map[string]string{
		filepath.Join(dir, "missing.json"): "no such file",
		notOne:                             "not a turncheck baseline",
	} {
		code, _, stderr := runCLI(t, "conform", "--url", "http://127.0.0.1:1", "--baseline", path)
		assert.Equal(t, exitUsage, code, stderr)
		assert.Contains(t, stderr, want)
	}
	code, _, stderr := runCLI(t, "baseline", "--from", t.TempDir())
	assert.Equal(t, exitUsage, code, stderr)
	assert.Contains(t, stderr, "results dir of a conform run")
}
