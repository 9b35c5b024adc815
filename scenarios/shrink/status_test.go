package shrink

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// TestShrinkStateInEveryReport: the shrink's state and what it rests on
// read the same in the text, the JSON (read back too) and the HTML
// report of a failure.
func TestShrinkStateInEveryReport(t *testing.T) {
	tok := model.UserToken(3)
	f := &fakeServer{at: tok, breaks: func(plans []plan.Plan, try int) bool { return anySends(plans, tok) && try%2 == 0 }}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	f.onReplay = func(n int) {
		if n == 7 {
			cancel(boundError{"--shrink-time 3s"})
		}
	}
	s := newShrinker(ctx, singleSteps(4), f.replay)
	require.True(t, s.run(singleSteps(4)))
	state, note := s.State()
	require.Equal(t, report.PartlyShrunk, state)
	fail := &report.Failure{Violation: s.Violation, Plans: s.Plans, History: s.History, ShrinkRuns: s.Runs, Shrink: state, ShrinkNote: note}
	text := fail.ShrinkStats()
	assert.Contains(t, text, "; partly shrunk ("+note+") in 7 replay(s)")

	rep := report.NewReport(&report.Result{Failure: fail}, targets.ServerSpec{Kind: "go"})
	var js bytes.Buffer
	require.NoError(t, rep.WriteJSON(&js))
	var back struct{ Failure *report.Failure }
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	assert.Equal(t, state, back.Failure.Shrink)
	assert.Equal(t, note, back.Failure.ShrinkNote)

	var page bytes.Buffer
	require.NoError(t, rep.WriteHTML(&page))
	assert.Contains(t, html.UnescapeString(page.String()), `<p class="muted" id="shrink">`+text+`</p>`)
}

// TestReplayBound: with no bound in time, a shrink gets ShrinkReplays
// replays of the failing run at the speed it ran, never under MinShrink
// nor over MaxShrink; within a run's time bound, only what the checks
// still to run leave of it, and it says so: the run's time goes to its
// checks first.
func TestReplayBound(t *testing.T) {
	for took, want := range map[time.Duration]time.Duration{
		100 * time.Millisecond: MinShrink,
		time.Second:            100 * time.Second,
		20 * time.Second:       MaxShrink,
	} {
		d, said := ReplayBound(took, 0, 0, 0)
		assert.Equal(t, want, d, "took %s", took)
		assert.Contains(t, said, fmt.Sprintf("%d replays of the failing run at the %s it took", ShrinkReplays, took))
	}
	// 8 minutes left, 3 checks of a minute each still to run: 5 minutes.
	d, said := ReplayBound(20*time.Second, 8*time.Minute, 3, time.Minute)
	assert.Equal(t, 5*time.Minute, d)
	assert.Equal(t, "5m0s: 100 replays of the failing run at the 20s it took, within 30s and 10m0s, and what the run's time left (8m0s) "+
		"leaves beside the 3 check(s) still to run (3m0s, at the 1m0s a check took so far)", said)
	// The last check: the time left is the shrink's.
	d, _ = ReplayBound(20*time.Second, 8*time.Minute, 0, time.Minute)
	assert.Equal(t, 8*time.Minute, d)
	// Checks that need all the time left: no shrink.
	d, said = ReplayBound(20*time.Second, 8*time.Minute, 9, time.Minute)
	assert.LessOrEqual(t, d, time.Duration(0))
	assert.True(t, strings.HasPrefix(said, "0s: "), said)
	d, _ = ReplayBound(100*time.Millisecond, time.Hour, 5, time.Second)
	assert.Equal(t, MinShrink, d, "a run with time enough")
}
