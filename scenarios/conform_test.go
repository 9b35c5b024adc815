package scenarios

import (
	"flag"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// statuses maps each invariant to its verdict's status.
func statuses(c *report.Conformance) map[model.Invariant]report.Status {
	out := map[model.Invariant]report.Status{}
	for _, v := range c.Verdicts {
		out[v.Invariant] = v.Status
	}
	return out
}

// TestConformCleanServer: the clean reference server passes every
// invariant of the contract, each exercised, under either interruption
// policy, and stays up (it came back from every restart drawn).
func TestConformCleanServer(t *testing.T) {
	t.Parallel() // its runs are the in-process server's, and share nothing with other tests
	for _, policy := range []sut.Interruption{sut.Rollback, sut.KeepConsistent, sut.Complete} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			// Four checks from seed 7 exercise every invariant and reach
			// every fault under each policy; one more for a machine that
			// runs a burst another way.
			c, err := Conform(reference.Target{Interruption: policy}, Options{Checks: 5, Seed: 7})
			require.NoError(t, err)
			st := statuses(c)
			for _, inv := range report.Judged() {
				if inv == model.Wire {
					// Only an ACP agent calls its client back.
					assert.Equal(t, report.NotApplicable, st[inv], "%+v", c.Verdict(inv))
					continue
				}
				assert.Equal(t, report.Pass, st[inv], "%s: %+v", inv, c.Verdict(inv))
				assert.Positive(t, c.Verdict(inv).Evaluations, "%s", inv)
			}
			assert.True(t, c.Passed())
			assert.Empty(t, c.Stopped)
			assert.Contains(t, c.Text(targets.Profile{}), "T4   one conversation, one line")
			// A server that serves its turns gets the faults drawn for
			// them: aborts (kept alive under complete) and model faults,
			// the ones hitting a later call of the tool loop too.
			for _, k := range []string{"client-abort", "model-error", "stream-cut"} {
				assert.Positive(t, c.Stats.Faults[k], "%s injected: %v (not reached: %v)", k, c.Stats.Faults, c.Stats.Unreached)
			}
		})
	}
}

// TestConformGoesOnAfterAFailure: a broken invariant is shrunk and
// recorded, and the run goes on to exercise and pass the others. Every
// finding says how many checks and how long it took to find from the
// run's start, the checks and shrinking before earlier findings included:
// a second finding does not count from the first, as it once did ("found
// after 3 check(s)" at check 12).
func TestConformGoesOnAfterAFailure(t *testing.T) {
	t.Parallel()
	var found []*Failure
	var mu sync.Mutex
	said := 0 // the most checks progress said were done
	// Seed 11 finds T1 and T10 in its first two checks: eight more go on.
	c, err := Conform(reference.Target{Mutant: sut.MutateBeforeRun}, Options{Checks: 10, Seed: 11, Parallel: 2,
		ShrinkTime: 2 * time.Second, Found: func(f *Failure, _ Stats) { found = append(found, f) },
		Progress: func(s Stats) { mu.Lock(); said = max(said, s.Checks); mu.Unlock() }})
	require.NoError(t, err)
	// Checks that ran past a finding run again after it: progress counts
	// each check once, never past those asked.
	assert.Equal(t, 10, said, "progress counts the checks done")
	// The mutant keeps a failed turn's message (T1) and an aborted turn's
	// (T10): two findings, the second in a round of its own.
	require.GreaterOrEqual(t, len(found), 2, "%s", c.Text(Profile{}))
	for i, f := range found {
		// Checks are numbered from 1 in the whole run: the n-th is found
		// after n checks of it.
		assert.Equal(t, f.Check, f.FoundAfter, "finding %d (%s) counts its checks from the run's start", i+1, f.Violation.Invariant)
		assert.Contains(t, f.ShrinkStats(), fmt.Sprintf("found after %d check(s) of the run, ", f.Check))
		if i > 0 {
			prev := found[i-1]
			assert.Greater(t, f.Check, prev.Check)
			// Found once the one before it was found and shrunk.
			assert.GreaterOrEqual(t, f.FoundIn, prev.FoundIn+prev.ShrunkIn,
				"finding %d (%s) counts its time from the run's start", i+1, f.Violation.Invariant)
		}
	}
	v := c.Verdict(model.T1)
	require.Equal(t, report.Fail, v.Status, "%+v", c.Verdicts)
	require.NotNil(t, v.Failure)
	if v.Failure.Shrink == report.Shrunk {
		// Only a shrink that was done says how short it gets: a loaded
		// machine may cut one short, and that is no failure of the test.
		assert.LessOrEqual(t, len(v.Failure.Plans), 3, "shrunk")
	}
	assert.False(t, c.Passed())
	st := statuses(c)
	for _, inv := range []model.Invariant{model.T2, model.T3, model.T4, model.T5} {
		assert.Equal(t, report.Pass, st[inv], "%s explored after T1 broke: %+v", inv, c.Verdict(inv))
	}
	assert.Positive(t, c.Stats.SetAside[model.T1], "T1 kept breaking, its conversations set aside")
	// The mutant keeps an aborted turn's message too: another trigger,
	// found on its own evidence, never folded into T1's finding.
	assert.Equal(t, report.Fail, c.Verdict(model.T10).Status, "%+v", c.Verdict(model.T10))
}

// TestConformSkip: a known failure left out is reported as skipped, and
// the server conforms on the rest.
func TestConformSkip(t *testing.T) {
	t.Parallel() // its runs are the in-process server's, and share nothing with other tests
	c, err := Conform(reference.Target{Mutant: sut.ReplayWithoutUser}, Options{Checks: 20, Seed: 3, Skip: []model.Invariant{model.T3}})
	require.NoError(t, err)
	assert.Equal(t, report.Skipped, c.Verdict(model.T3).Status)
	assert.Positive(t, c.Stats.SetAside[model.T3])
	assert.True(t, c.Passed(), "%s", c.Text(targets.Profile{}))
}

// TestNothingServedIsNoPass: a server that answers 400 to everything
// breaks no invariant, and passes none either: not even T3, since no
// conversation had a committed turn to replay.
func TestNothingServedIsNoPass(t *testing.T) {
	c, err := Conform(refuseAll{}, Options{Checks: 3, Seed: 1})
	require.NoError(t, err)
	assert.False(t, c.Passed())
	st := statuses(c)
	for _, inv := range []model.Invariant{model.T1, model.T2, model.T3, model.T4, model.T6} {
		assert.Equal(t, report.NotExercised, st[inv], "%s", inv)
		assert.NotEmpty(t, c.Verdict(inv).Reason)
	}
	// No turn reached the model: the faults drawn for its calls, and
	// the aborts drawn for when it holds them, took no effect.
	for k := range c.Stats.Faults {
		// Bursts and tool turns are shapes of traffic, drawn, not faults.
		assert.Contains(t, []string{"concurrency", "tool-turn"}, k, "a fault counted as injected")
	}
	assert.Positive(t, c.Stats.Unreached["client-abort"], "%v", c.Stats.Unreached)
	summary := c.Stats.Summary()
	assert.Contains(t, summary, "faults injected: none\n")
	assert.Regexp(t, `faults drawn, not reached \(.*\): (.*, )?client-abort \d+`, summary)
}

// TestRunSubtests: Run reports a subtest per invariant, through the
// Handler constructor.
func TestRunSubtests(t *testing.T) {
	for name, v := range map[string]string{"rapid.checks": "8", "rapid.seed": "5"} {
		old := flag.Lookup(name).Value.String()
		require.NoError(t, flag.Set(name, v))
		t.Cleanup(func() { _ = flag.Set(name, old) })
	}
	t.Run("conformance", func(t *testing.T) { Run(t, referenceHandler()) })
}

// TestRunOptions: Options given to Run win over rapid's flags, and the
// rest of them (here Progress) is used as it is.
func TestRunOptions(t *testing.T) {
	old := flag.Lookup("rapid.checks").Value.String()
	require.NoError(t, flag.Set("rapid.checks", "8"))
	t.Cleanup(func() { _ = flag.Set("rapid.checks", old) })
	checks := 0
	t.Run("conformance", func(t *testing.T) {
		Run(t, referenceHandler(), Options{Checks: 3, Seed: 5, Progress: func(s report.Stats) { checks = s.Checks }})
	})
	want := 3
	if testing.Short() {
		want = 1 // a fifth of them, at least one
	}
	assert.Equal(t, want, checks)
}

// referenceHandler is the reference server as a Go server's own test
// would give it: an http.Handler built for a model URL. A held model call
// times out on the server's own clock: a short one keeps the test short.
func referenceHandler() targets.Target {
	return targets.Handler(targets.Profile{Model: "turncheck", ModelTimeout: time.Second}, func(modelURL, dataDir string) (http.Handler, error) {
		return sut.New(sut.Config{ModelURL: modelURL, DataDir: dataDir, RequestTimeout: time.Second})
	})
}

// misdeclared is the reference server with a profile that declares what
// declare makes of its own.
type misdeclared struct {
	reference.Target
	declare func(*targets.Profile)
}

func (m misdeclared) Profile() targets.Profile {
	p := m.Target.Profile()
	m.declare(&p)
	return p
}

// TestInterruptionPolicyIsJudged: what a clean server does with a turn
// whose client left passes under the policy it declares, and is T10 under
// another: the policies are exercised, not merely named.
func TestInterruptionPolicyIsJudged(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	for _, tc := range []struct {
		name     string
		runs     sut.Interruption
		declares targets.Interruption
	}{
		// What a keep-consistent server keeps is T10 under rollback.
		{"keeps, declared rollback", sut.KeepConsistent, targets.Rollback},
		// Calls after the disconnect, or a reply kept, are T10 under
		// rollback.
		{"completes, declared rollback", sut.Complete, targets.Rollback},
		// A part kept is T10 under complete (whole or nothing).
		{"keeps, declared complete", sut.KeepConsistent, targets.Complete},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Behind a model timeout of a second: a turn run on after its
			// client left waits out no more than that for a held call,
			// where the default 20s took most of a run under complete.
			target := misdeclared{reference.Target{Interruption: tc.runs, ModelTimeout: time.Second},
				func(p *targets.Profile) { p.Interruption = tc.declares }}
			res, err := Check(target, Options{Checks: 100, Seed: 3, ShrinkTime: 2 * time.Second})
			require.NoError(t, err)
			require.NotNil(t, res.Failure, "a %s server went unnoticed under the %s policy", tc.runs, tc.declares)
			require.NotNil(t, res.Failure.Violation, res.Failure.Report)
			assert.Equal(t, model.T10, res.Failure.Violation.Invariant, res.Failure.Report)
			t.Logf("found after %d check(s); %s in all", res.Failure.FoundAfter, res.Elapsed)
		})
	}
}

// TestConformWithoutTools: a server that offers no tools gets T9 and T11
// as not applicable, never passed, and no tool turns; a client that drops
// a turn mid-call is judged all the same (T10).
func TestConformWithoutTools(t *testing.T) {
	t.Parallel()
	toolsUndeclared := misdeclared{reference.Target{}, func(p *targets.Profile) { p.Tools = false }}
	c, err := Conform(toolsUndeclared, Options{Checks: 10, Seed: 5})
	require.NoError(t, err)
	for _, inv := range []model.Invariant{model.T9, model.T11} {
		v := c.Verdict(inv)
		assert.Equal(t, report.NotApplicable, v.Status, "%s: %+v", inv, v)
		assert.Contains(t, v.Reason, "no tools")
	}
	assert.Equal(t, report.Pass, c.Verdict(model.T10).Status, "%+v", c.Verdict(model.T10))
	assert.Zero(t, c.Stats.Faults["tool-turn"], "tool turns drawn for a server that offers no tools")
	assert.True(t, c.Passed())
}

// TestSameCauseIsNotAPass: an invariant broken only in the way another's
// finding was is neither a second FAIL nor a PASS, in the text and in
// JUnit.
func TestSameCauseIsNotAPass(t *testing.T) {
	s := report.NewStats()
	s.Invariants[model.T1], s.Invariants[model.T9] = 5, 5
	s.SameCause[model.T9] = 2
	s.Folded = map[model.Invariant]model.Violation{model.T9: {Invariant: model.T9, Conv: model.ConversationRef{ID: "c"}, Turn: "tc-u3",
		Kind: model.LeftoverFailed, Reason: "an orphan of a failed turn"}}
	found := map[model.Invariant]*report.Failure{model.T1: {Violation: &model.Violation{Invariant: model.T1, Kind: model.LeftoverFailed, Reason: "left"}}}
	c := &report.Conformance{Stats: *s, Verdicts: verdicts(targets.Profile{Tools: true}, refuseAll{}, false, false, nil, *s, found)}
	v := c.Verdict(model.T9)
	assert.Equal(t, report.SameCause, v.Status)
	assert.Contains(t, v.Reason, "T1 (leftover of a failed turn)")
	assert.Contains(t, v.Reason, "the first: on conversation \"c\", turn tc-u3: an orphan of a failed turn", "an example is kept")
	assert.Len(t, c.Failures(), 1)
	assert.Contains(t, c.Text(targets.Profile{}), "SAME CAUSE")
	var junit strings.Builder
	require.NoError(t, c.WriteJUnit(&junit))
	assert.Contains(t, junit.String(), `<skipped message="same cause: broken 2 time(s)`)
}

// TestBreachBesideT3: a breach the report printed under a T3 finding's
// step is the wire finding's SAME CAUSE, saying so, never a PASS.
func TestBreachBesideT3(t *testing.T) {
	s := report.NewStats()
	s.Invariants[model.T3], s.Invariants[model.Wire] = 5, 40
	s.SameCause[model.Wire] = 1
	s.Folded = map[model.Invariant]model.Violation{model.Wire: {Invariant: model.Wire, Conv: model.ConversationRef{ID: "c"},
		Reason: "tasks/get of task t1 shows tc-a3"}}
	found := map[model.Invariant]*report.Failure{model.T3: {Violation: &model.Violation{Invariant: model.T3, Reason: "replayed"}}}
	p := targets.Profile{Protocol: targets.A2A}
	c := &report.Conformance{Stats: *s, Verdicts: verdicts(p, refuseAll{}, false, false, nil, *s, found)}
	v := c.Verdict(model.Wire)
	assert.Equal(t, report.SameCause, v.Status)
	assert.Contains(t, v.Reason, "another invariant's finding")
	assert.Contains(t, v.Reason, "shows tc-a3")
}

// TestWirePassInItsProtocolsWords: the wire finding's PASS says what an
// agent of the run's own protocol kept to, and nothing of another's.
func TestWirePassInItsProtocolsWords(t *testing.T) {
	s := report.NewStats()
	s.Invariants[model.Wire] = 7
	// Each protocol's words, and the other's that must not show.
	words := map[targets.Protocol]string{targets.ACP: "answered each cancelled prompt cancelled", targets.A2A: "tasks/get showed"}
	for proto, other := range map[targets.Protocol]targets.Protocol{targets.ACP: targets.A2A, targets.A2A: targets.ACP} {
		c := &report.Conformance{Stats: *s, Verdicts: verdicts(targets.Profile{Protocol: proto}, refuseAll{}, false, false, nil, *s, nil)}
		line := c.Verdict(model.Wire)
		require.Equal(t, report.Pass, line.Status, "%s", proto)
		text := c.Text(targets.Profile{Protocol: proto})
		assert.Contains(t, text, "7 prompt(s) or task(s) answered", "%s", proto)
		assert.Contains(t, text, words[proto], "%s", proto)
		assert.NotContains(t, text, words[other], "%s", proto)
	}
}

// TestAlsoBrokenIsSameCause: a finding whose very request breaks another
// invariant by the same trigger (an interrupted turn's orphaned tool call,
// T9, in a request that also carries the turn's message, T10's) leaves
// that invariant SAME CAUSE, never a pass.
func TestAlsoBrokenIsSameCause(t *testing.T) {
	s := report.NewStats()
	s.Invariants[model.T9], s.Invariants[model.T10] = 5, 1040
	found := map[model.Invariant]*report.Failure{model.T9: {Violation: &model.Violation{Invariant: model.T9,
		Kind: model.LeftoverInterrupted, Also: []model.Invariant{model.T10}, Reason: "orphan"}}}
	vs := verdicts(targets.Profile{Tools: true}, refuseAll{}, false, false, nil, *s, found)
	c := &report.Conformance{Stats: *s, Verdicts: vs}
	v := c.Verdict(model.T10)
	assert.Equal(t, report.SameCause, v.Status, "%+v", v)
	assert.Contains(t, v.Reason, "T9 (leftover of an interrupted turn)")
	assert.Equal(t, report.Fail, c.Verdict(model.T9).Status)
}

// TestCutShortIsNoPass: a run the time bound ended before the checks asked
// ran has not passed, though nothing broke in what it ran.
func TestCutShortIsNoPass(t *testing.T) {
	var all []report.Verdict
	for _, inv := range model.Invariants() {
		all = append(all, report.Verdict{Invariant: inv, Status: report.Pass, Evaluations: 1})
	}
	done := &report.Conformance{Verdicts: all, Asked: 10}
	assert.True(t, done.Passed())
	assert.False(t, done.CutShort())
	cut := &report.Conformance{Verdicts: all, Asked: 10, Stopped: "the time bound was reached"}
	assert.False(t, cut.Passed())
	assert.True(t, cut.CutShort())
	assert.True(t, cut.NotProven(), "cut short, nothing broken: not proven")
	assert.False(t, cut.Broken())
	all[3].Status = report.NotExercised
	assert.False(t, cut.CutShort(), "a run with an invariant not exercised does not conform, cut short or not")
	assert.True(t, cut.NotProven())
	assert.True(t, done.NotProven(), "an invariant not exercised: not proven")
	assert.Equal(t, "NOT PROVEN", done.Outcome())
	assert.Contains(t, done.NotProvenText(), "not exercised: "+string(all[3].Invariant)+". What would exercise each:\n  "+string(all[3].Invariant))
	all[4].Status = report.Fail
	assert.False(t, done.NotProven(), "a FAIL is broken, whatever else")
	assert.True(t, done.Broken())
	assert.Equal(t, "DOES NOT CONFORM", done.Outcome())
	assert.Empty(t, done.NotProvenText())
}

// oneSource is the reference server as a server that loads one agent
// source at a time (docker-agent's serve api takes one reference): a
// restart with two does not start, and declared says whether its profile
// says so (server.one_source).
type oneSource struct {
	reference.Target
	declared bool
}

func (o oneSource) Profile() targets.Profile {
	p := o.Target.Profile()
	p.OneSource = o.declared
	return p
}

func (o oneSource) Start(modelURL string) (targets.Server, error) {
	srv, err := o.Target.Start(modelURL)
	if err != nil {
		return nil, err
	}
	return oneSourceServer{srv.(*sut.Instance)}, nil
}

type oneSourceServer struct{ *sut.Instance }

func (s oneSourceServer) Restart(crash bool, refs []string) error {
	if len(refs) > 1 {
		return fmt.Errorf("accepts 1 arg(s), received %d", len(refs))
	}
	return s.Instance.Restart(crash, refs)
}

// TestOneSourceAtATime: a server that loads one agent source at a time,
// declared so, is never restarted with two; it conforms, its T8 judged on
// the changed source alone and saying so. Undeclared, the restart it
// cannot make is a setup error that names the profile's field, no verdict
// on the server (neither T7 nor a crash).
func TestOneSourceAtATime(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	// Seed 7 draws a restart with two sources in its first check: five
	// checks of the declared server would meet some.
	c, err := Conform(oneSource{declared: true}, Options{Checks: 5, Seed: 7})
	require.NoError(t, err)
	assert.True(t, c.Passed(), c.Text(targets.Profile{}))
	v := c.Verdict(model.T8)
	require.Equal(t, report.Pass, v.Status, "%+v", v)
	assert.Positive(t, v.Evaluations)
	assert.Contains(t, c.Text(targets.Profile{}), "two sources on one stable key not applicable")

	c, err = Conform(oneSource{}, Options{Checks: 15, Seed: 7})
	require.Error(t, err, "a restart with two sources was never drawn: pick a seed that draws one")
	assert.Contains(t, err.Error(), "set server.one_source: true in the profile")
	assert.Contains(t, err.Error(), "accepts 1 arg(s), received 2")
	for _, v := range c.Verdicts {
		assert.NotEqual(t, report.Fail, v.Status, "a setup error judged as the server's %s: %+v", v.Invariant, v)
	}
}

// TestNoRestarterSaysHow: a server that declares durability, on a target
// the harness cannot restart, gets T7 and T8 as not applicable, and the
// reason says what its target lacks and how to give it.
func TestNoRestarterSaysHow(t *testing.T) {
	p := targets.Profile{Agent: "helper", Durability: targets.Durability{Restart: true, Crash: true}}
	for _, v := range verdicts(p, refuseAll{}, false, false, nil, *report.NewStats(), nil) {
		if v.Invariant != model.T7 && v.Invariant != model.T8 {
			continue
		}
		assert.Equal(t, report.NotApplicable, v.Status, "%s", v.Invariant)
		for _, how := range []string{"Restart(crash bool, agents []string) error", "scenarios.Restarter", "same data dir", "From go test"} {
			assert.Contains(t, v.Reason, how, "%s", v.Invariant)
		}
	}
}

// TestSupersededBurstsSaySo: under supersede, bursts whose prompts each
// cancelled the one before leave T4 not exercised, and the reason says
// that bursts were sent and why none overlapped, not that none was.
func TestSupersededBurstsSaySo(t *testing.T) {
	s := report.NewStats()
	s.Faults["concurrency"] = 13
	for _, supersede := range []bool{false, true} {
		p := targets.Profile{Protocol: targets.ACP, Supersede: supersede}
		for _, v := range verdicts(p, refuseAll{}, false, false, nil, *s, nil) {
			if v.Invariant != model.T4 {
				continue
			}
			assert.Equal(t, report.NotExercised, v.Status)
			if supersede {
				assert.Contains(t, v.Reason, "13 burst(s) sent, but no two prompts of one session both reached the model: under supersede")
			} else {
				assert.Equal(t, "no two turns of one conversation were in flight at once", v.Reason)
			}
		}
	}
}

// TestExitUnshownIsNoPass: a server that exited between two checks, no
// step showing why, fails the crash verdict (the notes quote it), where it
// would have passed: never a pass for a server seen down.
func TestExitUnshownIsNoPass(t *testing.T) {
	s := report.NewStats()
	for _, inv := range report.Judged() {
		s.Invariants[inv] = 3
	}
	c := &report.Conformance{Stats: *s, Verdicts: verdicts(targets.Profile{Tools: true}, refuseAll{}, true, true, nil, *s, nil)}
	require.True(t, c.Passed(), c.Text(targets.Profile{}))
	crashUnshown(c.Verdicts, 1)
	v := c.Verdict(model.Crash)
	assert.Equal(t, report.Fail, v.Status)
	assert.Contains(t, v.Reason, "between two checks")
	assert.False(t, c.Passed())
	assert.Regexp(t, `(?m)^crash the server stays up +FAIL +the server exited`, c.Table())
}

// TestAssumedPolicyIsNamed: a finding judged by a policy the profile did
// not declare says which it assumed, and what else the profile could say.
func TestAssumedPolicyIsNamed(t *testing.T) {
	v := &model.Violation{Invariant: model.T10, Conv: model.ConversationRef{ID: "c"}, Turn: "tc-u1", Reason: "kept"}
	c := &report.Conformance{Verdicts: []report.Verdict{{Invariant: model.T10, Status: report.Fail,
		Failure: &report.Failure{Violation: v, Report: v.Error()}}}}
	p := targets.Profile{Assumed: map[string]string{"interruption": "the profile declares no interruption policy, so rollback was assumed; the others are keep-consistent and complete"}}
	assert.Contains(t, c.Text(p), "Judged by a policy not declared: the profile declares no interruption policy, so rollback was assumed")
	p.Assumed = nil
	assert.NotContains(t, c.Text(p), "not declared")
}
