package reference_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestTarget: the reference target declares what its server does, names
// itself for a replay, and its server passes a short check, its held
// calls timed out by the harness and its bursts settled by its reports.
func TestTarget(t *testing.T) {
	t.Parallel()
	assert.Equal(t, sut.DefaultConversationHeader, scenarios.DefaultConversationHeader,
		"the harness's default header is the server's")
	r := reference.WithMutant(sut.OrphanToolCallOnInterrupt)
	assert.Equal(t, scenarios.KeepConsistent, r.Profile().Interruption, "the mutant's server keeps what an interrupted turn did")
	assert.Equal(t, scenarios.ServerSpec{Kind: "reference", Mutant: string(sut.OrphanToolCallOnInterrupt),
		Concurrency: "serialize", Interruption: "keep-consistent"}, r.Spec())

	fake, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	defer func() { require.NoError(t, fake.Close()) }()
	srv, err := reference.Target{}.Start(fake.URL())
	require.NoError(t, err)
	assert.Implements(t, (*scenarios.DeadlineController)(nil), srv)
	assert.Implements(t, (*scenarios.ActivityReporter)(nil), srv)
	assert.Implements(t, (*scenarios.Restarter)(nil), srv)
	require.NoError(t, srv.Close())

	res, err := scenarios.Check(reference.Target{}, scenarios.Options{Checks: 5, Seed: 1})
	require.NoError(t, err)
	assert.Nil(t, res.Failure)
	assert.Positive(t, res.Outcomes["ok"])
}

// TestProfilesPerProtocol: profiles/ has a profile per protocol for the
// reference server, and each reaches it as the in-process target does.
func TestProfilesPerProtocol(t *testing.T) {
	for file, protocol := range map[string]targets.Protocol{
		"reference.yaml":           targets.Chat,
		"reference-responses.yaml": targets.Responses,
		"reference-sessions.yaml":  targets.Sessions,
		"reference-a2a.yaml":       targets.A2A,
	} {
		target, err := scenarios.LoadProfile("../../profiles/" + file)
		require.NoError(t, err, file)
		got, want := target.Profile(), reference.Target{Protocol: protocol}.Profile()
		assert.Equal(t, want.Protocol, got.Protocol, file)
		assert.Equal(t, want.SessionsAPI, got.SessionsAPI, file)
		assert.Equal(t, want.A2AAPI, got.A2AAPI, file)
		assert.Equal(t, want.Keys, got.Keys, file)
	}
}

// oneSource is the reference server reached as docker-agent's serve api
// is: one agent source at a time, each session turn naming its agent by
// the source key its session was created under ({source}).
type oneSource struct{ reference.Target }

// Profile is the reference server's, loading one source at a time.
func (o oneSource) Profile() targets.Profile {
	p := o.Target.Profile()
	p.OneSource = true
	return p
}

// TestSessionKeyAfterSourceChange: through that profile, docker-agent
// #3410's mutant, which looks a session turn's agent up by the exact key
// it names, is caught as T8, and the clean server passes. Only a client
// that keeps naming the key a session was created under after a restart
// that changed it sees the bug: one that named the key loaded now would
// resume under the mutant too.
func TestSessionKeyAfterSourceChange(t *testing.T) {
	t.Parallel()
	t.Run("mutant", func(t *testing.T) {
		t.Parallel()
		mutant := oneSource{reference.WithMutant(sut.SessionExactSourceKey)}
		require.Contains(t, mutant.Profile().SessionsAPI.Turn.Path, "{source}")
		// Unshrunk: the finding's name and what the server said are the
		// point, and the failing check's steps hold both.
		res, err := scenarios.Check(mutant, scenarios.Options{Checks: 100, Seed: 1, ShrinkTime: time.Millisecond})
		require.NoError(t, err)
		require.NotNil(t, res.Failure, "not caught in %d checks", res.Checks)
		require.NotNil(t, res.Failure.Violation, res.Failure.Report)
		assert.Equal(t, model.T8, res.Failure.Violation.Invariant, res.Failure.Report)
		assert.Contains(t, res.Failure.Report, "agent not found")
		assert.NotContains(t, res.Failure.Report, "several loaded agent sources", "one source at a time: never two")
	})
	t.Run("clean", func(t *testing.T) {
		t.Parallel()
		res, err := scenarios.Check(oneSource{reference.Target{Protocol: targets.Sessions}}, scenarios.Options{Checks: 30, Seed: 1})
		require.NoError(t, err)
		assert.Nil(t, res.Failure)
		assert.Positive(t, res.Outcomes["ok"])
	})
}
