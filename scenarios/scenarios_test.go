package scenarios_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/pgtest"
	"github.com/turncheck/turncheck/internal/procs"
	"github.com/turncheck/turncheck/internal/tmpfs"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/sut"
)

func TestMain(m *testing.M) {
	tmpfs.Use() // its servers' data dirs in memory
	procs.WaitBound(3)
	// A leaked goroutine fails the tests, and so does a server process
	// that outlived them.
	goleak.VerifyTestMain(procs.Checked(pgtest.Main(m)))
}

// TestCleanCheckPasses runs Check, the CLI's path, on the clean server.
// Every turn that did not end ok ended so for what the harness drew, a
// refusal while two loaded sources share one stable key (T8) included: no
// warning blames the server for it.
func TestCleanCheckPasses(t *testing.T) {
	t.Parallel()
	res, err := scenarios.Check(reference.Target{}, scenarios.Options{Checks: 8, Seed: 1})
	require.NoError(t, err)
	if res.Failure != nil {
		t.Fatalf("clean reference server failed (seed %d):\n%s", res.Failure.Seed, res.Failure.Report)
	}
	assert.Equal(t, 8, res.Checks)
	require.Positive(t, res.Invariants[model.T8], "no resume after a source change was drawn")
	assert.Empty(t, res.Uninjected, res.Summary())
	assert.Positive(t, res.Steps)
	for _, inv := range []model.Invariant{model.T1, model.T2, model.T3, model.T4, model.T5} {
		assert.Positive(t, res.Invariants[inv], "invariant %s never evaluated", inv)
	}
	assert.Positive(t, res.Outcomes["fail"], "no turn failed: faults are not being injected")
	assert.NotEmpty(t, res.Faults)
}

// TestCleanReplicasPass: the clean reference server as three replicas in
// process over one PostgreSQL passes where the mutants of replicas are
// caught (TestMutantsCaught), with turns of one conversation spread over
// the replicas and sent to two at once.
func TestCleanReplicasPass(t *testing.T) {
	t.Parallel()
	pgtest.Start(t) // skips without PostgreSQL
	target := reference.Target{Replicas: 3, Store: pgtest.Schema}
	res, err := scenarios.Check(target, scenarios.Options{Checks: 4, Seed: 1})
	require.NoError(t, err)
	if res.Failure != nil {
		t.Fatalf("clean replicas failed (seed %d):\n%s", res.Failure.Seed, res.Failure.Report)
	}
	assert.Positive(t, res.Invariants[model.T4], "T4 never evaluated")
	assert.Positive(t, res.Invariants[model.T2], "T2 never evaluated")
	assert.Positive(t, res.Faults["concurrency"], "no burst sent")
}

// TestCleanCheckPassesUnderReject: the reference server that answers 409
// to a concurrent turn passes when its profile says so, and bursts were
// sent and refused.
func TestCleanCheckPassesUnderReject(t *testing.T) {
	t.Parallel()
	res, err := scenarios.Check(reference.Target{Concurrency: sut.Reject}, scenarios.Options{Checks: 8})
	require.NoError(t, err)
	if res.Failure != nil {
		t.Fatalf("clean reference server under reject failed (seed %d):\n%s", res.Failure.Seed, res.Failure.Report)
	}
	assert.Positive(t, res.Invariants[model.T4], "T4 never evaluated")
	assert.Positive(t, res.Faults["concurrency"], "no burst sent")
}

// TestRejectIsNotSerialize: a server that answers 409 while its profile
// claims serialize is caught, as T4.
func TestRejectIsNotSerialize(t *testing.T) {
	res, err := scenarios.Check(rejectClaimingSerialize{}, scenarios.Options{Checks: 50, Seed: 1, ShrinkTime: 5 * time.Second})
	require.NoError(t, err)
	require.NotNil(t, res.Failure, "a 409 under a serialize profile went unnoticed")
	require.NotNil(t, res.Failure.Violation, res.Failure.Report)
	assert.Equal(t, model.T4, res.Failure.Violation.Invariant, res.Failure.Report)
	assert.Contains(t, res.Failure.Violation.Reason, "serialize")
}

// rejectClaimingSerialize runs the reference server under reject with the
// profile of one that serializes.
type rejectClaimingSerialize struct{}

func (rejectClaimingSerialize) Start(modelURL string) (scenarios.Server, error) {
	return reference.Target{Concurrency: sut.Reject}.Start(modelURL)
}
func (rejectClaimingSerialize) Profile() scenarios.Profile { return reference.Target{}.Profile() }

// quietTarget hides the reference server's activity reports, as a server
// that does not implement ActivityReporter: bursts then settle by a quiet
// period.
type quietTarget struct{ reference.Target }

type quietServer struct{ srv scenarios.DeadlineController }

func (q quietServer) URL() string                { return q.srv.URL() }
func (q quietServer) Close() error               { return q.srv.Close() }
func (q quietServer) ExpireDeadlines()           { q.srv.ExpireDeadlines() }
func (q quietTarget) Profile() scenarios.Profile { return q.Target.Profile() }
func (q quietTarget) Start(modelURL string) (scenarios.Server, error) {
	srv, err := q.Target.Start(modelURL)
	if err != nil {
		return nil, err
	}
	return quietServer{srv.(scenarios.DeadlineController)}, nil
}

// TestWithoutActivityReports: a server that does not report its activity
// is checked all the same, and a fork on it is caught.
func TestWithoutActivityReports(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	res, err := scenarios.Check(quietTarget{}, scenarios.Options{Checks: 3})
	require.NoError(t, err)
	require.Nil(t, res.Failure, "clean server without activity reports failed")
	assert.Positive(t, res.Invariants[model.T4])

	res, err = scenarios.Check(quietTarget{reference.Target{Mutant: sut.NoConversationLock}},
		scenarios.Options{Checks: 50, Seed: 1, ShrinkTime: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NotNil(t, res.Failure)
	require.NotNil(t, res.Failure.Violation, res.Failure.Report)
	assert.Equal(t, model.T4, res.Failure.Violation.Invariant)
}

// TestSameSeedSameRun: a seed replays the same steps, so a passing run's
// counts are identical too.
func TestSameSeedSameRun(t *testing.T) {
	t.Parallel()
	opts := scenarios.Options{Checks: 5, Seed: 42}
	a, err := scenarios.Check(reference.Target{}, opts)
	require.NoError(t, err)
	b, err := scenarios.Check(reference.Target{}, opts)
	require.NoError(t, err)
	assert.Equal(t, a.Steps, b.Steps)
	assert.Equal(t, a.Faults, b.Faults)
	assert.Equal(t, a.Outcomes, b.Outcomes)
}

type brokenTarget struct{}

func (brokenTarget) Start(string) (scenarios.Server, error) { return nil, errors.New("cannot start") }
func (brokenTarget) Profile() scenarios.Profile             { return scenarios.Profile{} }

// TestSetupErrorIsNotAViolation: a server that does not start is a setup
// error, reported as such, never as a broken invariant.
func TestSetupErrorIsNotAViolation(t *testing.T) {
	_, err := scenarios.Check(brokenTarget{}, scenarios.Options{Checks: 3})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cannot start")
}

// TestInterrupt: a run whose context ends stops after the step in flight,
// with its servers stopped, and says so.
func TestInterrupt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := scenarios.Options{Checks: 1000, Context: ctx, Progress: func(s scenarios.Stats) {
		if s.Checks == 3 {
			cancel()
		}
	}}
	res, err := scenarios.Check(reference.Target{}, opts)
	require.ErrorIs(t, err, scenarios.ErrInterrupted)
	assert.Equal(t, 3, res.Checks)
	assert.Nil(t, res.Failure)
}

// TestInterruptKeepsTheFailure: interrupted while shrinking, a run still
// reports the violation it found and a seed that replays it.
func TestInterruptKeepsTheFailure(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := scenarios.Options{Checks: 100, Context: ctx, Progress: func(s scenarios.Stats) {
		if s.ShrinkRuns == 2 {
			cancel() // while shrinking
		}
	}}
	target := reference.Target{Mutant: sut.ReplayWithoutUser}
	res, err := scenarios.Check(target, opts)
	require.ErrorIs(t, err, scenarios.ErrInterrupted)
	require.NotNil(t, res.Failure)
	require.NotNil(t, res.Failure.Violation)
	assert.Equal(t, model.T3, res.Failure.Violation.Invariant)

	replay, err := scenarios.Check(target, scenarios.Options{Checks: 1, Seed: res.Failure.Seed, ShrinkTime: time.Second})
	require.NoError(t, err)
	require.NotNil(t, replay.Failure, "seed %d of an interrupted run does not replay", res.Failure.Seed)
}

// TestShrinkCutShortSaysSo: a failure whose shrink bound is too short for
// a replay is not shrunk, and the report says why.
func TestShrinkCutShortSaysSo(t *testing.T) {
	res, err := scenarios.Check(reference.WithMutant(sut.LostOnEvict), scenarios.Options{Checks: 100, Seed: 1, ShrinkTime: time.Millisecond})
	require.NoError(t, err)
	require.NotNil(t, res.Failure)
	f := res.Failure
	assert.NotEqual(t, scenarios.Shrunk, f.Shrink)
	assert.Regexp(t, `not shrunk \(no smaller candidate tried; gave up before any replay: one at the \S+ the failing run took would have ended past 500µs, the 50% of its 1ms bound`, f.ShrinkStats())
	assert.NotContains(t, f.ShrinkStats(), "; shrunk in")
}
