package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/sut"
)

// saveLockFailure saves in dir, as check would, the failure the
// no-conversation-lock mutant shows under reject: a turn, then two on its
// conversation sent at once, which the mutant runs side by side (T4)
// where a clean server refuses the second with 409. edit changes the
// report before it is saved.
func saveLockFailure(t *testing.T, name string, edit func(*report.Report)) string {
	t.Helper()
	target := reference.Target{Mutant: sut.NoConversationLock, Concurrency: sut.Reject}
	conv := model.ConversationRef{Key: target.Profile().Keys[0], ID: "c"}
	plans := []plan.Plan{plan.Single("new", plan.TurnSend(conv, model.UserToken(1), false)), plan.Burst(conv, 2, 2, 0, 1)}
	history, v, err := scenarios.Replay(target, plans)
	require.NoError(t, err)
	require.NotNil(t, v, "the mutant broke nothing")
	require.Equal(t, model.T4, v.Invariant, v.Error())
	rep := report.NewReport(&report.Result{Seed: 1, Failure: &report.Failure{Violation: v, Plans: plans, History: history}}, target.Spec())
	if edit != nil {
		edit(rep)
	}
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, rep.Save(path))
	return path
}

// TestReplayBreaksAgain: a saved failure that breaks its invariant again
// on the first try is a FAIL, exit 1, and nothing is said of tries.
func TestReplayBreaksAgain(t *testing.T) {
	path := saveLockFailure(t, "T4.json", nil)
	code, stdout, stderr := runCLI(t, "replay", path)
	require.Equal(t, exitViolation, code, stdout+stderr)
	assert.Contains(t, stdout, "FAIL: T4 (one conversation, one line) broken\n")
	assert.NotContains(t, stdout, "NOT REPRODUCED")
	assert.NotContains(t, stdout, "--tries")
}

// TestReplayNotReproduced: the same failure replayed against the clean
// server breaks nothing, in every try asked for: replay exits 3, not 0
// nor 1, says how many tries ran and what went otherwise than in the
// saved run (the second request refused, answered first, never reaching
// the model), and how to try more.
func TestReplayNotReproduced(t *testing.T) {
	path := saveLockFailure(t, "T4-clean.json", func(r *report.Report) { r.Server.Mutant = "" })
	code, stdout, stderr := runCLI(t, "replay", path, "--tries", "2")
	require.Equal(t, exitNotReproduced, code, stdout+stderr)
	assert.Contains(t, stdout, "NOT REPRODUCED: the saved failure, T4 (one conversation, one line), did not break again in 2 tries of its 2 step(s)")
	assert.Contains(t, stdout, "(they broke no invariant)")
	assert.Contains(t, stdout, "What differed from the saved run:\nTries 1 and 2:\n")
	assert.Contains(t, stdout, "at step 2, request 2 (c, tc-u3): the failing run got ok 200, the replay fail 409")
	assert.Contains(t, stdout, "at step 2, request 2 (c, tc-u3): the request reached the model 1 time(s) in the failing run, 0 in the replay")
	assert.Contains(t, stdout, "at step 2: its requests were answered in the order [1 2] in the failing run, [2 1] in the replay")
	assert.Contains(t, stdout, "To try more: ")
	assert.Contains(t, stdout, " replay "+path+" --tries 10\n")
	assert.NotContains(t, stdout, "FAIL")
	assert.NotContains(t, stdout, "PASS")

	// One try, by default as many as the shrinker's.
	code, stdout, _ = runCLI(t, "replay", path, "--tries", "1")
	assert.Equal(t, exitNotReproduced, code)
	assert.Contains(t, stdout, "did not break again in 1 try of its 2 step(s), each in a fresh session (it broke no invariant)")
	assert.Contains(t, stdout, "Try 1:\n")
	code, _, stderr = runCLI(t, "replay", path, "--tries", "0")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--tries must be at least 1")
	code, _, stderr = runCLI(t, "replay", "--seed", "1", "--tries", "2")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--tries is for a failure file")
}

// TestReplayBreaksAnother: steps that break another invariant than the
// one saved, in every try, are a FAIL, exit 1, that says which was saved
// and which broke, with what differed and how to try more.
func TestReplayBreaksAnother(t *testing.T) {
	path := saveLockFailure(t, "T1.json", func(r *report.Report) { r.Failure.Violation.Invariant = model.T1 })
	code, stdout, stderr := runCLI(t, "replay", path, "--tries", "2")
	require.Equal(t, exitViolation, code, stdout+stderr)
	assert.Contains(t, stdout, "FAIL: T4 (one conversation, one line) broken, not T1 (atomic turns), the invariant saved: "+
		"in 2 tries the saved steps did not break T1 again, and try 1 broke T4 instead")
	assert.Contains(t, stdout, "What differed from the saved run:\nTries 1 and 2:\n  - broke T4 (one conversation, one line) instead, on conversation \"c\"")
	assert.Contains(t, stdout, " --tries 10\n")
}

// TestReplayHelp: replay's help says it replays conform's failures too,
// what --tries does, and every exit status.
func TestReplayHelp(t *testing.T) {
	code, stdout, _ := runCLI(t, "replay", "--help")
	require.Equal(t, exitOK, code)
	for _, want := range []string{"'turncheck conform' saved", "through that profile", "conform --url", "TURNCHECK_REPLAY=FILE", "--tries N", "exits 3",
		"Exit status: 0", "1 an invariant broken", "2 usage or setup error", "3 (with\nFILE)"} {
		assert.Contains(t, stdout, want)
	}
	code, stdout, _ = runCLI(t, "--help")
	require.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "3 a saved failure replayed did not break again")
}
