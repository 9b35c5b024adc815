//go:build unix

package misbehaving_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/crashtest"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/report"
)

// These tests hold the start finding (PROTOCOL.md, "A server starts") to
// its promise: a server that does not start within the tries its profile
// allows (server.start_tries) reads one way wherever in the run it
// fails, at the run's first start, between two checks or at a restart a
// step drew: the start verdict FAILs with the server's last words, never
// a crash nor an error; the verdicts of the checks that ran stand; and
// the run says how many of the checks asked ran. A try that fails and is
// tried again is a note, and the run goes on.

// failedStart is what FailStarts's server says as it fails start n.
func failedStart(n int) string {
	return fmt.Sprintf("crashtest: start %d: the gateway failed to start", n)
}

// conformStarts runs Conform with o against FailStarts's server through
// profile, one check at a time: which start a check makes is then the
// same in every run.
func conformStarts(t *testing.T, profile string, o scenarios.Options) *scenarios.Conformance {
	t.Helper()
	target, err := scenarios.LoadProfile(profile)
	require.NoError(t, err)
	o.Parallel = 1
	c, err := scenarios.Conform(target, o)
	require.NoError(t, err, "a server that does not start is a finding, not an error")
	return c
}

// assertStartFinding asserts that c's start verdict FAILs, quoting want
// and the server's last words (said), that nothing else FAILs, and that
// c says the checks that ran (stopped, "" for all).
func assertStartFinding(t *testing.T, c *scenarios.Conformance, want, said, stopped string) {
	t.Helper()
	v := c.Verdict(model.Start)
	require.Equal(t, scenarios.Fail, v.Status, "%s", c.Text(scenarios.Profile{}))
	assert.Contains(t, v.Reason, want)
	assert.Contains(t, v.Reason, said, "the server's last words are the evidence")
	assert.Contains(t, c.ServerOutput, said, "and the run's last output")
	assertOnlyFinding(t, c, model.Start)
	assert.Equal(t, stopped, c.Stopped)
	assert.Regexp(t, `(?m)^start the server starts +FAIL +the server did not start`, c.Table())
	assert.Equal(t, "DOES NOT CONFORM", c.Outcome())
}

// TestStartTriedAgain: with start_tries 2, a first start that fails is
// tried again, said in a note with the server's last words, and the run
// goes on to pass.
func TestStartTriedAgain(t *testing.T) {
	t.Parallel() // it mostly waits on servers
	profile := crashtest.StartsProfile(t, "1", false, "start_tries: 2")
	c := conformStarts(t, profile, scenarios.Options{Checks: 3, Steps: 10, Seed: 1})
	v := c.Verdict(model.Start)
	assert.Equal(t, scenarios.Pass, v.Status, "%s", c.Text(scenarios.Profile{}))
	assert.Equal(t, 1, v.Evaluations, "one start got ready: the second try of the first")
	assert.Contains(t, v.Reason, "within 2 tries")
	assert.Empty(t, c.Stopped)
	assert.Equal(t, 3, c.Stats.Checks)
	notes := strings.Join(c.Notes, "\n")
	assert.Contains(t, notes, "the server's start failed, and was tried again (try 1 of 2, server.start_tries): its start")
	assert.Contains(t, notes, "exited with status 3 before it was ready")
	assert.Contains(t, notes, failedStart(1), "the note quotes the server's last words")
	assert.Equal(t, 2, crashtest.Starts(t, profile))
	for _, v := range c.Verdicts {
		assert.NotEqual(t, scenarios.Fail, v.Status, "%s: %s", v.Invariant, v.Reason)
	}
}

// TestFirstStartFails: with one try (the default), a first start that
// fails is the start finding: every verdict is said, none of the checks
// asked ran, and nothing else fails.
func TestFirstStartFails(t *testing.T) {
	t.Parallel() // it mostly waits on a server
	profile := crashtest.StartsProfile(t, "1", false)
	c := conformStarts(t, profile, scenarios.Options{Checks: 3, Steps: 10, Seed: 1})
	assertStartFinding(t, c, "the server did not start at check 1: its start failed in 1 try (server.start_tries: 1)",
		failedStart(1), "0 of 3 checks asked ran: the server did not start at check 1")
	assert.Len(t, c.Verdicts, len(report.Judged()), "every verdict is said")
	assert.Zero(t, c.Stats.Checks, "no check ran")
	assert.Equal(t, scenarios.NotExercised, c.Verdict(model.T1).Status)
	assert.Equal(t, 1, crashtest.Starts(t, profile), "one try")
}

// TestStartFailsBetweenChecks: a server that fails every start after its
// third, started fresh for every check, is the start finding at check 4:
// the verdicts of the three checks that ran stand.
func TestStartFailsBetweenChecks(t *testing.T) {
	t.Parallel() // it mostly waits on servers
	profile := crashtest.StartsProfile(t, "4-", false, "fresh_per_check: true")
	c := conformStarts(t, profile, scenarios.Options{Checks: 5, Steps: 10, Seed: 1})
	assertStartFinding(t, c, "the server did not start at check 4: its start failed in 1 try", failedStart(4),
		"3 of 5 checks asked ran: the server did not start at check 4")
	assert.Equal(t, 3, c.Stats.Checks)
	assert.Equal(t, scenarios.Pass, c.Verdict(model.T2).Status, "what the checks that ran found stands: %+v", c.Verdict(model.T2))
	assert.Equal(t, 3, c.Verdict(model.Start).Evaluations, "three starts got ready")
}

// TestStartFailsAtADrawnRestart: a server that fails every start after
// its first, restarted or crashed by a step, is the start finding at that
// step, never a crash (it did not go down while serving) nor T7 (which
// judges what a server that came back holds).
func TestStartFailsAtADrawnRestart(t *testing.T) {
	t.Parallel() // it mostly waits on servers
	profile := crashtest.StartsProfile(t, "2-", true)
	c := conformStarts(t, profile, scenarios.Options{Checks: 6, Steps: 20, Seed: 5})
	v := c.Verdict(model.Start)
	m := regexp.MustCompile(`^the server did not start at step (\d+) of check (\d+): its restart drawn at step (\d+) \((graceful restart|crash \(kill -9\) and restart)\) failed in 1 try`).
		FindStringSubmatch(v.Reason)
	require.NotNil(t, m, "no restart drawn, or another reading: pick a seed that draws one\n%s", c.Text(scenarios.Profile{}))
	assert.Equal(t, m[1], m[3], "the step that drew it")
	check, err := strconv.Atoi(m[2])
	require.NoError(t, err)
	assertStartFinding(t, c, "", failedStart(2),
		fmt.Sprintf("%d of 6 checks asked ran: the server did not start again at step %s of check %d", check-1, m[1], check))
	assert.NotEqual(t, scenarios.Fail, c.Verdict(model.T7).Status)
	assert.Equal(t, 2, crashtest.Starts(t, profile))
}
