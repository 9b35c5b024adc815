//go:build unix

package misbehaving_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/crashtest"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/protocol"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// These tests hold the crash finding (PROTOCOL.md, "A server stays up")
// to its promise: a server that goes down without being told to is a
// finding of its own, with the server's last words, shrunk and saved to
// replay; the run goes on past it; a restart that does not come back is
// the start finding (start_test.go), never a crash nor T7; and a profile
// that cannot express its server is a setup error, never a verdict.

// assertCrashFound checks that c found a crash, quoting want, with
// steps that replay it against target, and broke nothing else.
func assertCrashFound(t *testing.T, target scenarios.Target, c *scenarios.Conformance, want string) *scenarios.Failure {
	t.Helper()
	v := c.Verdict(model.Crash)
	require.Equal(t, scenarios.Fail, v.Status, "%s", c.Text(scenarios.Profile{}))
	f := v.Failure
	require.NotNil(t, f)
	require.NotNil(t, f.Violation)
	assert.Equal(t, model.Crash, f.Violation.Invariant)
	assert.Contains(t, f.Violation.Reason, want, "the server's last words are the evidence")
	assert.NotEmpty(t, f.Plans, "a crash finding has its steps")
	// Its replays ran (the server started again after each), and broke
	// it again: it was shrunk, not left as it failed.
	assert.False(t, f.Flaky, "the crash did not reproduce when shrinking: %s", f.ShrinkStats())
	assert.NotContains(t, f.ShrinkNote, "could not be replayed")
	assert.Positive(t, f.ShrinkRuns)
	assert.Contains(t, c.Text(scenarios.Profile{}), "=== crash (the server stays up) ===")
	assertOnlyFinding(t, c, model.Crash)
	t.Logf("crash: %s", f.ShrinkStats())
	r, err := scenarios.ReplayFailureTries(context.Background(), target, f, 3)
	require.NoError(t, err)
	require.True(t, r.Reproduced, "the saved crash did not replay: %s", r.NotReproduced())
	assert.Equal(t, model.Crash, r.Violation.Invariant)
	assert.Contains(t, r.Violation.Reason, want)
	return f
}

// assertOnlyFinding asserts that c fails inv and nothing else: one root
// cause, one finding.
func assertOnlyFinding(t *testing.T, c *scenarios.Conformance, inv model.Invariant) {
	t.Helper()
	require.Equal(t, scenarios.Fail, c.Verdict(inv).Status, "%s", c.Text(scenarios.Profile{}))
	for _, v := range c.Verdicts {
		if v.Invariant != inv {
			assert.NotEqual(t, scenarios.Fail, v.Status, "%s failed against a server whose one defect is %s's:\n%s",
				v.Invariant, inv, c.Text(scenarios.Profile{}))
		}
	}
}

// conformMode runs Conform with o against crashtest's server of mode m,
// through its profile.
func conformMode(t *testing.T, m crashtest.Mode, o scenarios.Options) (scenarios.Target, *scenarios.Conformance) {
	t.Helper()
	target, err := scenarios.LoadProfile(crashtest.Profile(t, m))
	require.NoError(t, err)
	c, err := scenarios.Conform(target, o)
	require.NoError(t, err)
	return target, c
}

// unshrunk is an Options.Known that takes every failure for a known one,
// which is not shrunk: for a test that asserts what a run finds, not how
// its finding shrinks.
func unshrunk(*report.Failure) bool { return true }

// TestCrashInProcess: a server in process that dies after a streamed turn
// whose client went away is a crash finding, not an error: shrunk to the
// turn that kills it, its panic quoted, replayed; and the run goes on
// past it, restarting the server each time it dies again, to pass what
// the server does right.
func TestCrashInProcess(t *testing.T) {
	t.Parallel()
	target := crashtest.Target{}
	c, err := scenarios.Conform(target, scenarios.Options{Checks: 12, Seed: 5, ShrinkTime: 30 * time.Second})
	require.NoError(t, err)
	f := assertCrashFound(t, target, c, "panic: send on closed channel")
	if f.Shrink == scenarios.Shrunk { // a loaded machine may cut a shrink short
		assert.LessOrEqual(t, len(f.Plans), 2, f.Report)
	}
	assert.Positive(t, c.Stats.SetAside[model.Crash], "the server died again after the finding, and the run went on")
	for _, inv := range []model.Invariant{model.T1, model.T2, model.T4, model.T7} {
		assert.Equal(t, scenarios.Pass, c.Verdict(inv).Status, "%s explored past the crash: %+v", inv, c.Verdict(inv))
	}
}

// TestCrashThroughAProfile: the same defect in a process started from a
// profile, a runtime panic that ends it: the crash finding with the panic
// as its evidence, replayed against a fresh process.
func TestCrashThroughAProfile(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	target, err := scenarios.LoadProfile(crashtest.Profile(t, crashtest.PanicOnAbort))
	require.NoError(t, err)
	// Seed 5 finds the crash in its second check; the third runs past it.
	c, err := scenarios.Conform(target, scenarios.Options{Checks: 3, Seed: 5, ShrinkTime: 60 * time.Second})
	require.NoError(t, err)
	f := assertCrashFound(t, target, c, "panic: send on closed channel")
	assert.Contains(t, f.Violation.Reason, "exited with status 2")
	assert.Equal(t, scenarios.Pass, c.Verdict(model.T2).Status, "the run went on past the crash: %+v", c.Verdict(model.T2))
}

// staleLock is the reference server whose start after a kill -9 fails
// once (a lock the killed run left, which the failed start clears), as
// StaleLock's process does; tries is its profile's start_tries.
type staleLock struct {
	reference.Target
	tries int
}

// Profile is the reference target's, with tries as its start_tries.
func (s staleLock) Profile() scenarios.Profile {
	p := s.Target.Profile()
	p.StartTries = s.tries
	return p
}

func (s staleLock) Start(modelURL string) (scenarios.Server, error) {
	srv, err := s.Target.Start(modelURL)
	if err != nil {
		return nil, err
	}
	return &staleLockServer{Instance: srv.(*sut.Instance)}, nil
}

type staleLockServer struct {
	*sut.Instance
	mu     sync.Mutex
	locked bool
}

func (s *staleLockServer) Restart(crash bool, agents []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.locked {
		s.locked = false
		return s.Instance.Restart(crash, agents)
	}
	if !crash {
		return s.Instance.Restart(false, agents)
	}
	if err := s.Instance.Running.Crash(); err != nil {
		return err
	}
	s.locked = true
	return errors.New("server exited with status 1 before it was ready: the store is locked by an earlier run (stale lock)")
}

// staleLockProfile is StaleLock's profile, with server lines added.
func staleLockProfile(t *testing.T, server ...string) scenarios.Target {
	t.Helper()
	target, err := scenarios.LoadProfile(crashtest.ProfileWith(t, crashtest.StaleLock, server...))
	require.NoError(t, err)
	return target
}

// TestRestartThatDoesNotComeBack: a crash the harness draws that the
// server does not come back from, in the one try its profile allows, is
// the start finding, never a crash (the server did not go down while it
// served) nor T7 (which judges what a server that came back holds), in
// process and through a profile: the run stops there. With a second try
// (start_tries: 2) it comes back, the failed try is a note, and the run
// goes on to judge T7.
func TestRestartThatDoesNotComeBack(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	for _, tc := range []struct {
		name        string
		once, twice scenarios.Target
		checks      int
	}{
		{"in process", staleLock{}, staleLock{tries: 2}, 12},
		// Through the profile, seed 5 draws the restart that fails in
		// its second check; the third goes on past it.
		{"profile", staleLockProfile(t, "restart_share: 1"), staleLockProfile(t, "restart_share: 1", "start_tries: 2"), 3},
	} {
		// The server started once, and the same tried twice: two runs
		// that share nothing, and mostly wait, at once.
		t.Run(tc.name+"/once", func(t *testing.T) {
			t.Parallel()
			c, err := scenarios.Conform(tc.once, scenarios.Options{Checks: tc.checks, Seed: 5, ShrinkTime: 60 * time.Second, Parallel: 1})
			require.NoError(t, err)
			assertOnlyFinding(t, c, model.Start)
			v := c.Verdict(model.Start)
			assert.Regexp(t, `^the server did not start at step \d+ of check \d+: its restart drawn at step \d+ \(crash \(kill -9\) and restart\) failed in 1 try`, v.Reason)
			assert.Contains(t, v.Reason, "stale lock")
			assert.Regexp(t, `^\d+ of \d+ checks asked ran: the server did not start again at step`, c.Stopped)
			assert.NotEqual(t, scenarios.Fail, c.Verdict(model.Crash).Status, "a restart that did not come back judged as a crash")
			assert.NotEqual(t, scenarios.Fail, c.Verdict(model.T7).Status, "a restart that did not come back judged as T7")
		})
		t.Run(tc.name+"/twice", func(t *testing.T) {
			t.Parallel()
			c, err := scenarios.Conform(tc.twice, scenarios.Options{Checks: tc.checks, Seed: 5, ShrinkTime: 60 * time.Second, Parallel: 1})
			require.NoError(t, err)
			for _, v := range c.Verdicts {
				assert.NotEqual(t, scenarios.Fail, v.Status, "%s: %s", v.Invariant, v.Reason)
			}
			assert.Empty(t, c.Stopped)
			assert.Contains(t, strings.Join(c.Notes, "\n"), "the server's start failed, and was tried again (try 1 of 2, server.start_tries): its restart drawn at step")
			assert.Contains(t, strings.Join(c.Notes, "\n"), "stale lock")
			assert.Equal(t, scenarios.Pass, c.Verdict(model.T7).Status, "the run went on past the restart tried again: %+v", c.Verdict(model.T7))
		})
	}
}

// TestOneSourceProfileIsASetupError: a profile that does not say its
// server loads one agent source at a time, for a server whose command
// takes one reference, is a setup error that names the field to set when
// the first start with two fails: no verdict on the server.
func TestOneSourceProfileIsASetupError(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	target, err := scenarios.LoadProfile(crashtest.Profile(t, crashtest.OneAgent))
	require.NoError(t, err)
	// Seed 1 draws a restart, with two sources, at step 13 of its first
	// check; the second is spare.
	c, err := scenarios.Conform(target, scenarios.Options{Checks: 2, Seed: 1})
	require.Error(t, err, "no restart with two sources drawn: pick a seed that draws one")
	assert.Contains(t, err.Error(), "set server.one_source: true in the profile")
	assert.Contains(t, err.Error(), "accepts 1 arg(s), received 2")
	if c != nil {
		for _, v := range c.Verdicts {
			assert.NotEqual(t, scenarios.Fail, v.Status, "a setup error judged as the server's %s", v.Invariant)
		}
	}
	assert.False(t, strings.Contains(err.Error(), "T7"), "a setup error named as T7: %v", err)
}

// TestACPAgentThatExitsOnOneInput: an ACP agent that exits when sent an
// empty prompt is the crash finding, and nothing else: it is started again
// before the run goes on, so no later prompt is judged by what a dead
// agent could not answer, and no request the harness could not send (a
// session/new or session/load to the dead process) is evidence of
// anything.
func TestACPAgentThatExitsOnOneInput(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	// Seed 1 sends an empty prompt in its first check, and the agent
	// exits on later ones too, in both checks.
	target, c := conformMode(t, crashtest.ACPExitOnEmpty, scenarios.Options{Checks: 2, Seed: 1, ShrinkTime: 60 * time.Second})
	f := assertCrashFound(t, target, c, "an empty prompt")
	assert.Contains(t, f.Violation.Reason, "exited with status 3")
	assert.NotContains(t, f.Violation.Reason, "\" at http://", "a stdio agent has no address")
	assert.NotContains(t, f.Violation.Reason, "{model_url}", "the command as it ran, placeholders filled")
	assert.NotContains(t, f.ShrinkNote, "could not be replayed", "a stdio agent's steps replay on a fresh agent")
	assert.Positive(t, c.Stats.SetAside[model.Crash], "the agent exited again after the finding, and the run went on")
	assert.Zero(t, c.Stats.Causes[protocol.CauseUnsent], "requests to a dead agent: %v", c.Stats.Causes)
}

// TestNoProcessIsNoExit: a server whose start failed (here a restart
// after kill -9 that finds a stale lock) has no process: that is no exit
// of its own, and no crash to report between two checks. Its start's
// failure is said where it happened; "exited" needs a process that
// ended, with its status or signal.
func TestNoProcessIsNoExit(t *testing.T) {
	t.Parallel()
	target, err := scenarios.LoadProfile(crashtest.Profile(t, crashtest.StaleLock))
	require.NoError(t, err)
	fake, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	defer fake.Close()
	srv, err := target.Start(fake.URL())
	require.NoError(t, err)
	defer srv.Close()
	w, ok := srv.(targets.ServerWatcher)
	require.True(t, ok)
	require.NoError(t, w.Exited())
	require.Error(t, srv.(targets.Restarter).Restart(true, nil), "the start after kill -9 finds the lock")
	assert.NoError(t, w.Exited(), "a start that failed is no exit")
	require.NoError(t, srv.(targets.Restarter).Restart(true, nil), "the next start comes back")
	assert.NoError(t, w.Exited())
}

// TestSharedHistoryIsOneLeak: a server whose conversations share one
// history leaks each into every other, and, its process shared by the
// run's checks, into every later check: one finding, T5, after the first
// finding too. A token of an earlier check's conversation is never read
// as this check's token of the same number (T1, T2, T6). The finding
// replays on a fresh process: the shrinker's replays, which met what the
// checks before them left in the shared one, ran on fresh ones.
func TestSharedHistoryIsOneLeak(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	// Seed 6 leaks in its first check, and again in its second, on the
	// process the two share; its shrink is a few replays.
	target, c := conformMode(t, crashtest.SharedHistory, scenarios.Options{Checks: 2, Seed: 6, ShrinkTime: 10 * time.Second})
	assertOnlyFinding(t, c, model.T5)
	assert.Positive(t, c.Stats.SetAside[model.T5]+c.Stats.Consequences[model.T5], "the leak was met again after the finding")
	r, err := scenarios.ReplayFailureTries(context.Background(), target, c.Verdict(model.T5).Failure, 3)
	require.NoError(t, err)
	assert.True(t, r.Reproduced, "%s", r.NotReproduced())
}

// TestACPAgentThatForgetsItsSessions: an ACP agent that advertises
// loadSession but loses its sessions at a restart, declared durable, is
// T7's finding alone: a refused session/load is judged as the resume it
// was, never as the outcome of the prompt that was to follow (an empty
// one, say, which the agent never got: no T3).
func TestACPAgentThatForgetsItsSessions(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	// Seed 1 finds the loss in its first check, and its second restarts
	// the agent and meets refused loads again. Nothing here is about the
	// shrink, which would only replay the finding: it is skipped.
	_, c := conformMode(t, crashtest.ACPForgets, scenarios.Options{Checks: 2, Seed: 1, Known: unshrunk})
	assertOnlyFinding(t, c, model.T7)
	assert.Contains(t, c.Verdict(model.T7).Failure.Violation.Reason, "did not resume")
}
