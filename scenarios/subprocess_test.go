//go:build unix

package scenarios_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/testbin"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
)

// TestSubprocessTarget checks the reference server run as a subprocess, as
// any server in another language is: the clean one passes, and a fork is
// caught and shrunk through the black-box path.
func TestSubprocessTarget(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	bin := testbin.Turncheck(t)
	// The profile declares the server's own model timeout, --request-timeout
	// below, which also bounds a wait for a busy conversation: a refusal
	// after it is a bounded wait ending, which a loaded machine shows.
	profile := reference.Target{}.Profile()
	profile.ModelTimeout = time.Second
	serve := func(extra ...string) scenarios.Subprocess {
		return scenarios.Subprocess{
			Command: append([]string{bin, "serve", "--listen", "{addr}", "--model-url", "{model_url}",
				"--data-dir", "{data_dir}", "--key", "key-a", "--key", "key-b", "--agent={agents}",
				// A held model call times out on the server's own clock: make it short.
				"--request-timeout", "1s"}, extra...),
			Agent:   "helper",
			Reaches: profile,
		}
	}
	// A fixed seed: what a check draws comes from it, so that the test is
	// the same run every time: its one short check restarts the server
	// and crashes it, as a longer run would.
	res, err := scenarios.Check(serve(), scenarios.Options{Checks: 1, Steps: 15, Seed: 1})
	require.NoError(t, err)
	require.Nil(t, res.Failure, "the clean server as a subprocess failed")
	assert.Positive(t, res.Steps)
	assert.Positive(t, res.Faults["restart"], "no restart: pick a seed that draws one")
	assert.Positive(t, res.Faults["crash"], "no crash: pick a seed that draws one")

	res, err = scenarios.Check(serve("--mutant", "fork-new-session"), scenarios.Options{Checks: 20, Seed: 1, ShrinkTime: 20 * time.Second})
	require.NoError(t, err)
	require.NotNil(t, res.Failure)
	require.NotNil(t, res.Failure.Violation, res.Failure.Report)
	assert.Equal(t, model.T4, res.Failure.Violation.Invariant, res.Failure.Report)
	f := res.Failure
	if f.Shrink == scenarios.Shrunk { // a loaded machine may cut a shrink short
		assert.LessOrEqual(t, len(f.Plans), 2, f.Report)
	}
	t.Logf("caught after %d check(s) in %s; shrunk in %d replays, %s, to %d step(s)",
		f.FoundAfter, f.FoundIn, f.ShrinkRuns, f.ShrunkIn, len(f.Plans))
}

// TestProfileWritesConfigFiles: a server that reads its model's base URL
// only from a config file is checked without a wrapper script: the
// profile writes the file into its data dir, before every start.
func TestProfileWritesConfigFiles(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	bin := testbin.Turncheck(t)
	target, err := scenarios.ParseProfile([]byte(`
server:
  # The model URL comes from the file alone, never from the command line.
  command: [sh, -c, 'exec "$0" serve --listen "$1" --data-dir "$2" --model-url "$(cat "$2/conf/model-url")" --request-timeout 1s',
            ` + bin + `, "{addr}", "{data_dir}"]
  files: {conf/model-url: "{model_url}"}
policies: {durability: {restart: true, crash: true}}
model_timeout: 1s
`))
	require.NoError(t, err)
	// One check of seed 1 restarts and crashes the server: the file is
	// written again before those starts.
	res, err := scenarios.Check(target, scenarios.Options{Checks: 1, Steps: 15, Seed: 1})
	require.NoError(t, err)
	require.Nil(t, res.Failure, "the clean server configured by a file failed")
	assert.Positive(t, res.Outcomes["ok"], "no turn reached the model through the file's URL")
	assert.Positive(t, res.Faults["restart"]+res.Faults["crash"], "no restart: pick a seed that draws one")
}
