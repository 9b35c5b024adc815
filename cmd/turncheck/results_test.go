//go:build unix

package main

import (
	"encoding/json"
	"html"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/browser"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/sut"
)

// TestConformResults: a conform run keeps its results in a directory of
// its own under turncheck-results/, which latest names: the verdicts as
// text, JSON and JUnit, each failure as a replay file and a page, and
// index.html, which a browser opens to every verdict and the failure.
func TestConformResults(t *testing.T) {
	t.Parallel() // its runs are processes of their own, in a directory of their own
	bin := onPath(t)
	dir := t.TempDir()
	profile := writeMutantProfile(t, dir, sut.MutantInfo{Mutant: sut.ForkNewSession})

	// From seed 1 the fork is found in the first check.
	var runs []string
	for range 2 {
		code, stdout, stderr := runIn(t, dir, bin, "conform", "--profile", profile, "--checks", "2", "--steps", "15", "--seed", "1")
		require.Equal(t, exitViolation, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
		m := regexp.MustCompile(`(?m)^results: (turncheck-results/\S+) \(open `).FindStringSubmatch(stdout)
		require.NotNil(t, m, stdout)
		runs = append(runs, m[1])
	}
	require.NotEqual(t, runs[0], runs[1], "two runs share a results directory")
	latest, err := os.Readlink(filepath.Join(dir, "turncheck-results", "latest"))
	require.NoError(t, err)
	assert.Equal(t, filepath.Base(runs[1]), latest, "latest names the newest run")

	out := filepath.Join(dir, runs[1])
	text, err := os.ReadFile(filepath.Join(out, "verdicts.txt"))
	require.NoError(t, err)
	assert.Contains(t, string(text), "DOES NOT CONFORM")
	assert.Regexp(t, `(?m)^T4 +one conversation, one line +FAIL `, string(text))

	var verdicts struct {
		Schema   string `json:"schema"`
		Verdicts []struct {
			Invariant string `json:"invariant"`
			Status    string `json:"status"`
		} `json:"verdicts"`
	}
	b, err := os.ReadFile(filepath.Join(out, "verdicts.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &verdicts))
	assert.Equal(t, "turncheck/conformance/v2", verdicts.Schema)
	require.Len(t, verdicts.Verdicts, len(report.Judged()))

	junit, err := os.ReadFile(filepath.Join(out, "junit.xml"))
	require.NoError(t, err)
	assert.Contains(t, string(junit), "<testsuite")

	failures, err := filepath.Glob(filepath.Join(out, "failures", "T4-conform-*.json"))
	require.NoError(t, err)
	require.Len(t, failures, 1, "the T4 failure's replay file")
	assert.FileExists(t, strings.TrimSuffix(failures[0], ".json")+".html")
	code, stdout, stderr := runIn(t, dir, bin, "replay", failures[0])
	assert.Equal(t, exitViolation, code, "the saved failure replays: stdout:\n%s\nstderr:\n%s", stdout, stderr)

	// The page, as a browser builds it: each invariant's verdict, as the
	// JSON gives it, and the failure's own report inline.
	page, err := os.ReadFile(filepath.Join(out, "index.html"))
	require.NoError(t, err)
	dom := browser.DumpDOM(t, browser.Find(t), "index.html", page)
	for _, v := range verdicts.Verdicts {
		row := regexp.MustCompile(`(?s)<tr id="verdict-` + v.Invariant + `"[^>]*>(.*?)</tr>`).FindStringSubmatch(dom)
		require.NotNil(t, row, "no row for %s in the page", v.Invariant)
		status := regexp.MustCompile(`<td class="status">([^<]*)</td>`).FindStringSubmatch(row[1])
		require.NotNil(t, status, row[1])
		assert.Equal(t, strings.ToUpper(v.Status), html.UnescapeString(status[1]), v.Invariant)
	}
	assert.Regexp(t, `<p class="verdict fail" id="outcome">DOES NOT CONFORM</p>`, dom)
	assert.Contains(t, dom, `id="failure-T4"`)
	assert.Regexp(t, `(?s)<section class="failure" id="failure-T4">.*<pre id="violation">T4 `, dom, "the failure's report is inline")
}

// TestCheckResults: a check keeps its results too, pass or fail: here a
// pass, in the directory --out names.
func TestCheckResults(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	code, stdout, stderr := runCLI(t, "check", "--checks", "3", "--seed", "1", "--out", out)
	require.Equal(t, exitOK, code, stdout+stderr)
	assert.Contains(t, stdout, "results: "+out)
	for _, name := range []string{"report.txt", "report.json", "junit.xml", "index.html"} {
		assert.FileExists(t, filepath.Join(out, name))
	}
	text, err := os.ReadFile(filepath.Join(out, "report.txt"))
	require.NoError(t, err)
	assert.Contains(t, string(text), "PASS: no invariant broken")
	assert.NoDirExists(t, filepath.Join(out, "failures"), "a pass saves no failure")
}
