package shrink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/report"
)

var shrinkConv = model.ConversationRef{Key: "key-a", ID: "conv-1"}

// singleSteps are n steps of one turn each, user tokens 1 to n.
func singleSteps(n int) []plan.Plan {
	out := make([]plan.Plan, n)
	for i := range out {
		out[i] = plan.Single("continue", plan.TurnSend(shrinkConv, model.UserToken(i+1), false))
	}
	return out
}

// tokens are the user tokens plans send, step by step ("1 2+3": a step
// sends tokens 2 and 3 at once).
func tokens(plans []plan.Plan) string {
	var steps []string
	for _, p := range plans {
		var sends []string
		for _, s := range p.Sends {
			sends = append(sends, string(s.Token))
		}
		steps = append(steps, fmt.Sprint(sends))
	}
	return fmt.Sprint(steps)
}

// fakeServer stands for a server under test: breaks says whether the
// try-th replay (from 1) of the same plans breaks T1, at the first step
// that sends token at; onReplay, if set, hears of each replay, numbered
// from 1 over all plans.
type fakeServer struct {
	at       model.Token
	breaks   func(plans []plan.Plan, try int) bool
	onReplay func(n int)

	mu    sync.Mutex
	tries map[string]int
	n     int
}

func (f *fakeServer) replay(_ *execute.Lab, _ context.Context, plans []plan.Plan) ([]history.Op, *model.Violation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tries == nil {
		f.tries = map[string]int{}
	}
	f.tries[tokens(plans)]++
	f.n++
	if f.onReplay != nil {
		f.onReplay(f.n)
	}
	ops := make([]history.Op, len(plans))
	for i := range ops {
		ops[i] = history.Op{Step: i + 1}
	}
	if !f.breaks(plans, f.tries[tokens(plans)]) {
		return ops, nil, nil
	}
	at := slices.IndexFunc(plans, func(p plan.Plan) bool { return sends(p, f.at) })
	return ops[:at+1], &model.Violation{Invariant: model.T1, Conv: shrinkConv}, nil
}

// sends reports whether p sends token tok.
func sends(p plan.Plan, tok model.Token) bool {
	return slices.ContainsFunc(p.Sends, func(s plan.Send) bool { return s.Token == tok })
}

// anySends reports whether a step of plans sends token tok.
func anySends(plans []plan.Plan, tok model.Token) bool {
	return slices.ContainsFunc(plans, func(p plan.Plan) bool { return sends(p, tok) })
}

// newShrinker shrinks a T1 failure of plans in one lab, replaying on
// replay; the violation names no conversation, so no slice is tried.
func newShrinker(ctx context.Context, plans []plan.Plan, replay replayFunc) *Shrinker {
	return &Shrinker{labs: []*execute.Lab{{}}, want: model.T1, ctx: ctx, from: len(plans), Plans: plans,
		Violation: &model.Violation{Invariant: model.T1}, replayOn: replay, freshOn: replay}
}

// TestShrinkKeepsWhatBreaksOnItsSecondTry: a failing run that broke the
// invariant again only on its second replay gives every smaller
// candidate two tries: the one step that breaks it on every second
// replay is found, and the result is called shrunk.
func TestShrinkKeepsWhatBreaksOnItsSecondTry(t *testing.T) {
	tok := model.UserToken(3)
	f := &fakeServer{at: tok, breaks: func(plans []plan.Plan, try int) bool { return anySends(plans, tok) && try%2 == 0 }}
	s := newShrinker(context.Background(), singleSteps(4), f.replay)
	require.True(t, s.run(singleSteps(4)))
	assert.Equal(t, 2, s.need, "the failing run broke it again on its second try")
	assert.Equal(t, tokens(singleSteps(4)[2:3]), tokens(s.Plans), "the one step that matters")
	state, note := s.State()
	assert.Equal(t, report.Shrunk, state, note)
	assert.Equal(t, "4 candidates tried, 2 of them twice", note)
}

// TestShrinkTriesABurstTwice: a candidate with a step that sends
// requests at once gets a second try on a server that does not report
// its activity, which may interleave them another way on each replay,
// and one try on a server that does.
func TestShrinkTriesABurstTwice(t *testing.T) {
	burst := plan.Plan{Action: plan.BurstAction(2), Release: []int{0, 1}, Sends: []plan.Send{
		plan.TurnSend(shrinkConv, model.UserToken(2), false), plan.TurnSend(shrinkConv, model.UserToken(3), false)}}
	plans := []plan.Plan{singleSteps(1)[0], burst}
	failing := tokens(plans)
	for _, reports := range []bool{false, true} {
		t.Run(fmt.Sprintf("reports=%v", reports), func(t *testing.T) {
			// The failing run breaks it every time; the burst alone only
			// on every second replay.
			f := &fakeServer{at: model.UserToken(2), breaks: func(ps []plan.Plan, try int) bool {
				return tokens(ps) == failing || (len(ps) == 1 && len(ps[0].Sends) == 2 && try%2 == 0)
			}}
			s := newShrinker(context.Background(), plans, f.replay)
			s.reports = reports
			require.True(t, s.run(plans))
			state, note := s.State()
			assert.Equal(t, report.Shrunk, state, note)
			if reports {
				assert.Len(t, s.Plans, 2, "one try, as the failing run needed")
				return
			}
			assert.Equal(t, tokens([]plan.Plan{burst}), tokens(s.Plans), "the burst alone, on its second try")
		})
	}
}

// TestShrinkCutShortIsPartlyShrunk: the bound ending in the middle of a
// search, here the test's own cancel with the bound's cause, makes the
// result partly shrunk, never a verdict of its own, and the note says how
// many candidates were tried how often, that one had fewer tries than it
// needed, and why the search stopped; a run stopped otherwise says so.
func TestShrinkCutShortIsPartlyShrunk(t *testing.T) {
	for _, cause := range []error{boundError{"1m40s: 100 replays of the failing run at the 1s it took, within 30s and 10m0s"}, context.Canceled} {
		t.Run(cause.Error(), func(t *testing.T) {
			tok := model.UserToken(3)
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			f := &fakeServer{at: tok, breaks: func(plans []plan.Plan, try int) bool { return anySends(plans, tok) && try%2 == 0 }}
			// Replays 1 and 2: the failing run; 3 to 5: [2 3] kept on its
			// second try; 6: [3], once; 7: cut short.
			f.onReplay = func(n int) {
				if n == 7 {
					cancel(cause)
				}
			}
			s := newShrinker(ctx, singleSteps(4), f.replay)
			require.True(t, s.run(singleSteps(4)), "the failure reproduced")
			assert.True(t, s.Cut)
			assert.Equal(t, tokens(singleSteps(3)[1:3]), tokens(s.Plans))
			state, note := s.State()
			assert.Equal(t, report.PartlyShrunk, state)
			assert.Contains(t, note, "3 candidates tried, 1 of them twice; 1 of them given fewer tries than they needed; ")
			if errors.As(cause, new(boundError)) {
				assert.Contains(t, note, "the shrink bound, 1m40s: 100 replays of the failing run at the 1s it took, within 30s and 10m0s, ran out before the search ended")
			} else {
				assert.Contains(t, note, "the run was stopped before the search ended")
			}

			f2 := &report.Failure{Violation: s.Violation, Plans: s.Plans, Shrink: state, ShrinkNote: note}
			assert.Contains(t, f2.ShrinkStats(), "; partly shrunk ("+note+") in ")
		})
	}
}

// TestShrinkUndecidedIsPartlyShrunk: a candidate whose replay could not
// run (a harness error) was not tried as often as it needed: a search
// that left it is not called shrunk, though it ran to its end. Here the
// invariant breaks where tokens 2 and 3 are both sent, and step 3 alone
// cannot be replayed.
func TestShrinkUndecidedIsPartlyShrunk(t *testing.T) {
	two, three := model.UserToken(2), model.UserToken(3)
	f := &fakeServer{at: three, breaks: func(plans []plan.Plan, _ int) bool { return anySends(plans, two) && anySends(plans, three) }}
	replay := func(l *execute.Lab, ctx context.Context, plans []plan.Plan) ([]history.Op, *model.Violation, error) {
		h, v, err := f.replay(l, ctx, plans)
		if len(plans) == 1 && sends(plans[0], three) {
			return nil, nil, errors.New("the server under test did not start")
		}
		return h, v, err
	}
	s := newShrinker(context.Background(), singleSteps(4), replay)
	require.True(t, s.run(singleSteps(4)))
	assert.False(t, s.Cut)
	assert.Equal(t, tokens(singleSteps(3)[1:3]), tokens(s.Plans))
	state, note := s.State()
	assert.Equal(t, report.PartlyShrunk, state, note)
	assert.Equal(t, "3 candidates tried; 1 of them given fewer tries than they needed", note)
}

// TestShrinkUnreplayedIsNoMiss: a failure none of whose replays could be
// carried out (the server did not start again) neither reproduced nor
// was shown not to: the shrinker says why its steps could not be
// replayed, where replays that ran and broke nothing say nothing of it.
func TestShrinkUnreplayedIsNoMiss(t *testing.T) {
	down := errors.New("start the server under test: exited with status 1 before it was ready")
	s := newShrinker(context.Background(), singleSteps(2), func(*execute.Lab, context.Context, []plan.Plan) ([]history.Op, *model.Violation, error) {
		return nil, nil, down
	})
	require.False(t, s.run(singleSteps(2)))
	assert.ErrorIs(t, s.Unreplayed(), down)

	f := &fakeServer{at: model.UserToken(1), breaks: func([]plan.Plan, int) bool { return false }}
	s = newShrinker(context.Background(), singleSteps(2), f.replay)
	require.False(t, s.run(singleSteps(2)))
	assert.NoError(t, s.Unreplayed(), "replays that ran and broke nothing: the failure did not reproduce")
}

// TestShrinkGivesUpOnASlowServer: on a server whose replays take a fifth
// of the bound, a failure that does not break its invariant again is
// replayed only while a replay, at the failing run's pace, ends within
// the half of the bound it has to reproduce in: twice, not the three
// tries it would get otherwise; the shrinker then gives up, and says
// so. One that reproduces on its first replay is shrunk on past that
// half, and one whose replay alone would end past it is not replayed at
// all. The clock is the replays' own: each moves it on by a replay.
func TestShrinkGivesUpOnASlowServer(t *testing.T) {
	const bound, took = 10 * time.Minute, 2 * time.Minute
	tok := model.UserToken(3)
	for _, tc := range []struct {
		name    string
		took    time.Duration
		breaks  bool
		ok      bool
		runs    int
		state   report.ShrinkState
		gaveUp  bool
		noteHas string
	}{
		{"does not reproduce", took, false, false, 2, report.NotShrunk, true,
			"gave up after 2 replays, none of which broke it again: one at the 2m0s the failing run took would have ended past 5m0s, the 50% of its 10m0s bound a failure has to reproduce in"},
		{"a replay alone ends past the half", 6 * time.Minute, false, false, 0, report.NotShrunk, true, "gave up before any replay"},
		// Replays at 0, 2, 4 and 6 minutes: the last past the half.
		{"reproduces", took, true, true, 4, report.Shrunk, false, "candidates tried"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			f := &fakeServer{at: tok, breaks: func(plans []plan.Plan, _ int) bool { return tc.breaks && anySends(plans, tok) },
				onReplay: func(int) { clock = clock.Add(tc.took) }}
			s := newShrinker(context.Background(), singleSteps(4), f.replay)
			s.now, s.took = func() time.Time { return clock }, tc.took
			s.reproduceWithin(bound)
			require.Equal(t, tc.ok, s.run(singleSteps(4)))
			assert.Equal(t, tc.gaveUp, s.GaveUp())
			assert.Equal(t, tc.runs, s.Runs, "replays made")
			assert.False(t, s.Cut, "the bound itself did not run out")
			state, note := s.State()
			assert.Equal(t, tc.state, state, note)
			assert.Contains(t, note, tc.noteHas)
		})
	}
}

// TestShrinkSliceLeavesRoomForTheRun: the slice tried first stops where
// one more of its tries would leave no time, within the half of the
// bound, for a replay of the failing run's own steps: those are
// replayed, break the invariant again, and the shrink goes on.
func TestShrinkSliceLeavesRoomForTheRun(t *testing.T) {
	other := model.ConversationRef{Key: "key-a", ID: "conv-2"}
	burst := plan.Plan{Action: plan.BurstAction(2), Release: []int{0, 1}, Sends: []plan.Send{
		plan.TurnSend(shrinkConv, model.UserToken(2), false), plan.TurnSend(shrinkConv, model.UserToken(3), false)}}
	plans := []plan.Plan{plan.Single("continue", plan.TurnSend(other, model.UserToken(1), false)), burst}
	whole := tokens(plans)
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// Only the whole run breaks it: the burst alone, a slice that needs
	// two tries on a server that does not report its activity, never.
	f := &fakeServer{at: model.UserToken(2), breaks: func(ps []plan.Plan, _ int) bool { return tokens(ps) == whole },
		onReplay: func(int) { clock = clock.Add(2 * time.Minute) }}
	var order []string
	replay := func(l *execute.Lab, ctx context.Context, ps []plan.Plan) ([]history.Op, *model.Violation, error) {
		order = append(order, tokens(ps))
		return f.replay(l, ctx, ps)
	}
	s := newShrinker(context.Background(), plans, replay)
	s.Violation.Conv = shrinkConv
	s.now, s.took = func() time.Time { return clock }, 2*time.Minute
	s.reproduceWithin(10 * time.Minute)
	require.True(t, s.run(plans), "the failing run's own steps were replayed")
	assert.False(t, s.GaveUp())
	require.GreaterOrEqual(t, len(order), 3)
	assert.Equal(t, []string{tokens([]plan.Plan{burst}), whole, tokens([]plan.Plan{burst})}, order[:3],
		"one try of the slice, then the failing run, then the slice's second try")
	state, note := s.State()
	assert.NotContains(t, note, "gave up", state)
}

// TestShrinkPaceCountsEarlierSteps: a failing check replayed with the
// steps of the earlier checks that shared its server runs longer than the
// check did, in proportion; the half of the bound a failure has to
// reproduce in is set where the bound is a shrink's Budget, and nowhere
// else.
func TestShrinkPaceCountsEarlierSteps(t *testing.T) {
	plans := singleSteps(4)
	plans[0].Earlier, plans[1].Earlier = plan.Origin{Check: 1, Session: 1}, plan.Origin{Check: 1, Session: 1}
	v := &model.Violation{Invariant: model.T1}
	ctx, cancel := Budget(context.Background(), 10*time.Minute, "--shrink-time 10m")
	defer cancel()
	s := newRun(ctx, []*execute.Lab{{}}, plans, v, time.Second, nil)
	assert.Equal(t, 2*time.Second, s.took, "two own steps of four took a second")
	assert.Equal(t, 5*time.Minute, s.reproduceIn)
	s = newRun(context.Background(), []*execute.Lab{{}}, singleSteps(4), v, time.Second, nil)
	assert.Equal(t, time.Second, s.took)
	assert.True(t, s.reproduceBy.IsZero(), "no Budget, no share of it")
}
