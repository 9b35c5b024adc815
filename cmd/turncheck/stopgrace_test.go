//go:build unix

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/crashtest"
)

// outlivesGraceProfile writes a profile whose server outlives its
// stop_grace: a shell that ignores SIGTERM runs the crashtest server
// that panics after an aborted stream (crashtest.PanicOnAbort), passes
// its failure status on when it dies, and, once it has stopped on
// SIGTERM, sleeps on, as a server whose wrapper script or child process
// ignores SIGTERM does. Only the SIGKILL after the grace ends it.
func outlivesGraceProfile(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	script := `trap "" TERM; "$0" "$@"; code=$?; if [ "$code" -ne 0 ]; then exit "$code"; fi; sleep 60`
	yaml := fmt.Sprintf(`server:
  command: [sh, -c, %q, %q, "{addr}", "{model_url}", "{data_dir}", "{agents}"]
  env: {%s: %s}
  stop_grace: 300ms
  ready: {timeout: 30s}
model: turncheck
model_timeout: 1s
policies:
  durability: {restart: true, crash: true}
`, script, exe, crashtest.Env, crashtest.PanicOnAbort)
	path := filepath.Join(t.TempDir(), "outlives-grace.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o644))
	return path
}

// killedNote is the note of a server killed after its stop_grace.
var killedNote = regexp.MustCompile(`(?m)^note: the server did not stop cleanly: .*server did not exit within 300ms of SIGTERM; killed`)

// TestServerOutlivesStopGrace: a server that does not exit within its
// stop_grace of SIGTERM is killed, and that is a note beside the
// verdicts, never an error in their place: conform prints and saves its
// verdicts with the exit status they call for (1, for the crash it
// finds), and a replay of the saved failure prints the verdict of its
// try, where it once printed nothing and exited 2.
func TestServerOutlivesStopGrace(t *testing.T) {
	t.Parallel() // it mostly waits on servers
	profile := outlivesGraceProfile(t)
	out := t.TempDir()
	// From seed 5 the crash comes in the second check; the third runs
	// on a server started after it, which the run's end stops: killed,
	// the note. No more checks show more.
	code, stdout, stderr := runCLI(t, "conform", "--profile", profile, "--checks", "3", "--seed", "5", "--parallel", "1", "--out", out)
	require.Equal(t, exitViolation, code, stdout+stderr)
	assert.Regexp(t, `(?m)^crash the server stays up +FAIL`, stdout)
	assert.Regexp(t, killedNote, stdout)
	assert.Contains(t, stdout, "DOES NOT CONFORM")
	assert.NotContains(t, stderr, "did not exit within", "the kill is a note, not an error")
	for _, name := range []string{"verdicts.json", "junit.xml", "index.html"} {
		assert.FileExists(t, filepath.Join(out, name))
	}
	saved, err := filepath.Glob(filepath.Join(out, "failures", "crash-conform-*.json"))
	require.NoError(t, err)
	require.Len(t, saved, 1, stdout)

	code, stdout, stderr = runCLI(t, "replay", saved[0])
	require.Equal(t, exitViolation, code, stdout+stderr)
	assert.Contains(t, stdout, "FAIL: crash (the server stays up) broken\n")
	assert.Regexp(t, killedNote, stdout)
	assertStartedAsRun(t, stdout)
	assert.NotContains(t, stderr, "did not exit within")
}

// startedAs is the line that says how the server was started.
var startedAs = regexp.MustCompile(`(?m)^the server started as: (.*)$`)

// assertStartedAsRun asserts that out says how the server was started as
// it was run: its placeholders filled with the address, the fake model's
// URL and the data dir of the run, never the profile's template.
func assertStartedAsRun(t *testing.T, out string) {
	t.Helper()
	m := startedAs.FindStringSubmatch(out)
	require.NotNil(t, m, "no line says how the server was started:\n%s", out)
	line := m[1]
	assert.NotContains(t, line, "{", "a placeholder left unfilled")
	assert.Regexp(t, ` 127\.0\.0\.1:[0-9]+ http://127\.0\.0\.1:[0-9]+/v1 /\S*turncheck-subprocess-\S+`, line, "the address, the model URL and the data dir, filled in")
	assert.Contains(t, line, crashtestExe(t))
}

// crashtestExe is the test binary, which the profiles here run as the
// server.
func crashtestExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	return exe
}

// TestServerStartedAsRun: conform says how it started the server with
// the command it actually ran, placeholders filled, and the profile's
// template apart, as a template.
func TestServerStartedAsRun(t *testing.T) {
	t.Parallel() // it mostly waits on a server
	code, stdout, stderr := runCLI(t, "conform", "--profile", outlivesGraceProfile(t), "--checks", "1", "--steps", "3", "--seed", "1", "--parallel", "1")
	require.NotEqual(t, exitUsage, code, stdout+stderr)
	assertStartedAsRun(t, stdout)
	assert.Contains(t, stdout, "turncheck conform: the server the profile's command starts: sh -c")
	assert.Contains(t, stdout, `{addr} {model_url} {data_dir} {agents}`, "the template, said as one")
}
