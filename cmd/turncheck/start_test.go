//go:build unix

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/crashtest"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/report"
)

// TestServerThatDoesNotStart: a server whose start fails, in the one try
// its profile allows, does not conform (exit 1, never 2): the start
// verdict FAILs with the server's last words, every other verdict is
// printed and saved, every file of the results is written, and the run
// says how many of the checks asked ran. With start_tries: 2 the same
// server's failed try is a note, and the run goes on.
func TestServerThatDoesNotStart(t *testing.T) {
	t.Parallel() // it mostly waits on servers
	out := t.TempDir()
	code, stdout, stderr := runCLI(t, "conform", "--profile", crashtest.StartsProfile(t, "1", false),
		"--checks", "3", "--steps", "10", "--seed", "1", "--parallel", "1", "--out", out)
	require.Equal(t, exitViolation, code, stdout+stderr)
	assert.Empty(t, stderr, "a finding, not an error")
	assert.Regexp(t, `(?m)^start the server starts +FAIL +the server did not start at check 1: its start failed in 1 try \(server\.start_tries: 1\): server ".*" on 127\.0\.0\.1:\d+ exited with status 3 before it was ready`, stdout)
	assert.Regexp(t, `(?m)^T1 +atomic turns +NOT EXERCISED`, stdout, "every verdict is printed")
	assert.Contains(t, stdout, "stopped early: 0 of 3 checks asked ran: the server did not start at check 1\n")
	assert.Contains(t, stdout, "the server's last output:\ncrashtest: start 1: the gateway failed to start")
	assert.Contains(t, stdout, "DOES NOT CONFORM")
	for _, name := range []string{"verdicts.txt", "verdicts.json", "junit.xml", report.BaselineFile, "index.html"} {
		assert.FileExists(t, filepath.Join(out, name))
	}
	text, err := os.ReadFile(filepath.Join(out, "verdicts.txt"))
	require.NoError(t, err)
	assert.Contains(t, string(text), "0 of 3 checks asked ran")
	var saved report.Conformance
	b, err := os.ReadFile(filepath.Join(out, "verdicts.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &saved))
	assert.Equal(t, report.Fail, saved.Verdict(model.Start).Status)
	assert.Equal(t, "0 of 3 checks asked ran: the server did not start at check 1", saved.Stopped)
	assert.Contains(t, saved.ServerOutput, "crashtest: start 1: the gateway failed to start")
	b, err = os.ReadFile(filepath.Join(out, report.BaselineFile))
	require.NoError(t, err)
	assert.Contains(t, string(b), `"invariant": "start"`, "the finding, for a baseline")

	code, stdout, stderr = runCLI(t, "conform", "--profile", crashtest.StartsProfile(t, "1", false, "start_tries: 2"),
		"--checks", "3", "--steps", "10", "--seed", "1", "--parallel", "1")
	require.NotEqual(t, exitUsage, code, stdout+stderr)
	assert.Regexp(t, `(?m)^start the server starts +PASS +1 start\(s\) of the server, each ready`, stdout)
	assert.Contains(t, stdout, "note: the server's start failed, and was tried again (try 1 of 2, server.start_tries): its start: ")
	assert.NotContains(t, stdout, "stopped early")
}

// TestStartCannotBeSkipped: --skip start is refused: a server that does
// not start leaves nothing to check, whatever is skipped.
func TestStartCannotBeSkipped(t *testing.T) {
	code, _, stderr := runCLI(t, "conform", "--profile", referenceProfile, "--skip", "start", "--checks", "1", "--steps", "1")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "start cannot be skipped")
}
