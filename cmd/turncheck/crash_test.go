package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/crashtest"
)

// TestCrashFindingThroughTheCLI: a server that panics, checked through
// its profile, does not conform (exit 1) with a crash verdict that quotes
// the panic, saved as a file that 'turncheck replay' breaks again (exit
// 1), against a fresh process. Shrunk or not (its bound is short: a
// crash replays the same), the saved failure breaks again.
func TestCrashFindingThroughTheCLI(t *testing.T) {
	t.Parallel() // it mostly waits on servers
	out := t.TempDir()
	code, stdout, stderr := runCLI(t, "conform", "--profile", crashtest.Profile(t, crashtest.PanicOnAbort),
		"--checks", "6", "--seed", "5", "--shrink-time", "1s", "--out", out)
	require.Equal(t, exitViolation, code, stdout+stderr)
	assert.Regexp(t, `(?m)^crash the server stays up +FAIL +crash \(the server stays up\) violated: the server exited without being told to`, stdout)
	assert.Contains(t, stdout, "panic: send on closed channel")
	assert.Contains(t, stdout, "DOES NOT CONFORM")
	saved, err := filepath.Glob(filepath.Join(out, "failures", "crash-conform-*.json"))
	require.NoError(t, err)
	require.Len(t, saved, 1, stdout)

	code, stdout, stderr = runCLI(t, "replay", saved[0])
	require.Equal(t, exitViolation, code, stdout+stderr)
	assert.Contains(t, stdout, "FAIL: crash (the server stays up) broken\n")
	assert.Contains(t, stdout, "panic: send on closed channel")
}

// TestLeakBetweenChecksThroughTheCLI: a server that leaks one check's
// conversation into a later check's of the same name (crashtest.ShortIDs),
// its one process shared by the run's checks, does not conform (T5,
// exit 1), and the failure it saves holds the earlier check's steps
// before the failing check's: 'turncheck replay', against a fresh
// process, breaks T5 again (exit 1) where the failing check's steps
// alone would show nothing. Shrunk or not within its bound (2 s, a few
// candidates; a loaded machine may try none), the saved failure breaks
// again.
func TestLeakBetweenChecksThroughTheCLI(t *testing.T) {
	t.Parallel() // it mostly waits on servers
	out := t.TempDir()
	code, stdout, stderr := runCLI(t, "conform", "--profile", crashtest.Profile(t, crashtest.ShortIDs),
		"--checks", "4", "--steps", "10", "--seed", "1", "--fail-fast", "--shrink-time", "2s", "--out", out)
	require.Equal(t, exitViolation, code, stdout+stderr)
	assert.Regexp(t, `(?m)^T5 +isolation +FAIL +T5 \(isolation\) violated .* of a conversation of an earlier check on the same server`, stdout)
	// Shrunk, each earlier step says whose it is; cut short before any
	// replay, the run as it failed says its earlier steps are not shown.
	assert.Regexp(t, `\(a step of check \d+\)|\(not shown\): earlier checks' steps`, stdout)
	saved, err := filepath.Glob(filepath.Join(out, "failures", "T5-conform-*.json"))
	require.NoError(t, err)
	require.Len(t, saved, 1, stdout)

	code, stdout, stderr = runCLI(t, "replay", saved[0])
	require.Equal(t, exitViolation, code, stdout+stderr)
	assert.Contains(t, stdout, "FAIL: T5 (isolation) broken\n")
	assert.Contains(t, stdout, "of a conversation of an earlier check on the same server")
	assert.Contains(t, stdout, "(a step of check ")
}
