//go:build unix

package misbehaving_test

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/crashtest"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/sut"
)

// oneServer is a target whose one server serves every check of a run,
// as a profile's server does unless it says fresh_per_check.
type oneServer struct{ scenarios.Target }

func (oneServer) ReuseServer() bool { return true }

// closingHandler is a handler that wraps another and closes it.
type closingHandler struct {
	http.Handler
	io.Closer
}

// shortIDs is the reference server, in process, naming each
// conversation by the last six characters of its id
// (crashtest.ShortenIDs), one server for a whole run: one check's
// conversations stay apart, two checks' of one name are one.
func shortIDs() scenarios.Target {
	return oneServer{scenarios.Handler(scenarios.Profile{Model: "turncheck", ModelTimeout: time.Second},
		func(modelURL, dataDir string) (http.Handler, error) {
			srv, err := sut.New(sut.Config{ModelURL: modelURL, DataDir: dataDir, RequestTimeout: time.Second})
			if err != nil {
				return nil, err
			}
			return closingHandler{crashtest.ShortenIDs(srv), srv}, nil
		})}
}

// TestLeakBetweenChecksReplays: a server that leaks a conversation of
// one check into another check's of the same name, and one check's into
// none of its own, is T5's finding at a later check: its saved failure
// holds the steps of the earlier check whose messages leaked, before
// the failing check's, says so, and replays on a fresh server, where the
// failing check's steps alone show nothing.
func TestLeakBetweenChecksReplays(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	target := shortIDs()
	c, err := scenarios.Conform(target, scenarios.Options{Checks: 4, Steps: 10, Seed: 1, FailFast: true, ShrinkTime: 10 * time.Second})
	require.NoError(t, err)
	v := c.Verdict(model.T5)
	require.Equal(t, scenarios.Fail, v.Status, "%s", c.Text(scenarios.Profile{}))
	f := v.Failure
	assert.Contains(t, f.Violation.Reason, "of a conversation of an earlier check on the same server")
	require.NotEmpty(t, f.Plans)
	first := f.Plans[0].Earlier
	assert.NotZero(t, first, "the earlier check's steps come first: %s", f.Report)
	assert.Positive(t, first.Check)
	assert.Less(t, first.Check, f.Check, "a check before the failing one")
	assert.Zero(t, f.Plans[len(f.Plans)-1].Earlier, "the failing check's own steps come last")
	// Shrunk, each earlier step says whose it is; cut short before any
	// replay, the run as it failed says its earlier steps are not shown.
	assert.Regexp(t, `\(a step of check \d+\)|\(not shown\): earlier checks' steps`, f.Report)
	assert.Contains(t, f.Report, "A replay runs them first, each check's in a session of its own on one server")
	t.Logf("%s\n%s", f.ShrinkStats(), f.Report)

	// Saved, read back and replayed as 'turncheck replay' does: on a
	// fresh server, it breaks T5 again.
	path := filepath.Join(t.TempDir(), "T5.json")
	require.NoError(t, report.NewReport(&report.Result{Seed: c.Seed, Failure: f}, scenarios.ServerSpec{Kind: "go"}).Save(path))
	saved, err := report.ReadReport(path)
	require.NoError(t, err)
	r, err := scenarios.ReplayFailureTries(context.Background(), target, saved.Failure, 3)
	require.NoError(t, err)
	require.True(t, r.Reproduced, "%s", r.NotReproduced())
	assert.Equal(t, model.T5, r.Violation.Invariant)
	assert.Contains(t, r.Violation.Reason, "of a conversation of an earlier check on the same server")

	// The failing check's own steps alone do not show it.
	own := &scenarios.Failure{Violation: f.Violation, Skipped: f.Skipped, SkippedKinds: f.SkippedKinds}
	for _, p := range f.Plans {
		if p.Earlier == (plan.Origin{}) {
			own.Plans = append(own.Plans, p)
		}
	}
	r, err = scenarios.ReplayFailureTries(context.Background(), target, own, 1)
	require.NoError(t, err)
	assert.False(t, r.Reproduced, "the failing check's steps alone broke T5 on a fresh server")
}
