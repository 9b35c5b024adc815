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
// 1), against a fresh process.
func TestCrashFindingThroughTheCLI(t *testing.T) {
	t.Parallel() // it mostly waits on servers
	out := t.TempDir()
	code, stdout, stderr := runCLI(t, "conform", "--profile", crashtest.Profile(t, crashtest.PanicOnAbort),
		"--checks", "6", "--seed", "5", "--out", out)
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
