package scenarios

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// Conform checks target against the whole contract and gives a verdict
// per invariant. Unlike Check, a broken invariant does not end the run:
// it is shrunk, recorded, and from then on skipped (as Options.Skip), and
// the remaining checks go on exploring the others. Options.Context bounds
// the whole run in wall-clock time; when it ends, the verdicts say what
// the checks run so far found, and Stopped says why the run is short.
//
// The error says the run could not be carried out: the server stopped
// answering, its command could not be run at all, or the harness failed
// (a setup error: a profile that cannot express the server, say). A
// server that went down on its own is a finding, the crash verdict's,
// not an error; one that did not start in the tries its profile allows
// (targets.Profile.StartTries), wherever in the run, is the start
// verdict's: the run ends there, with the verdicts of the checks that
// ran, and Stopped says how many of the checks asked did.
func Conform(target targets.Target, opts Options) (*report.Conformance, error) {
	if err := opts.Shard.check(); err != nil {
		return nil, err
	}
	if opts.Checks <= 0 {
		opts.Checks = 100
	}
	if opts.Seed == 0 {
		opts.Seed = randomSeed()
	}
	start := time.Now()
	l, err := execute.Open(target, slices.Clone(opts.Skip))
	if err != nil {
		return nil, err
	}
	c := &report.Conformance{Seed: opts.Seed, Stats: *report.NewStats(), Asked: len(opts.numbers()), Shard: opts.Shard.String()}
	found := map[model.Invariant]*report.Failure{}
	var notStarted *execute.NotStarted
	runErr := conformIn(l, opts, c, found, &notStarted)
	if notStarted == nil && runErr == nil {
		// Where no check met it since: a start for a replay that shrank
		// the last check's failure, say.
		notStarted = labNotStarted(l)
	}
	notes, cerr := StopNotes(l.Close())
	runErr = errors.Join(runErr, cerr)
	if runErr != nil {
		// A failed run's notes go with its error.
		runErr = errors.Join(runErr, noteErr(notes))
		notes = nil
	}
	c.Notes = append(c.Notes, notes...)
	c.Elapsed = time.Since(start)
	restartable, watched := l.CanRestart(), l.CanWatch()
	if n := starts(l); n > 0 {
		c.Stats.Invariants[model.Start] += n
	} else {
		// No server started to show whether the harness can restart or
		// watch it: what the profile declares is judged, as not
		// exercised, rather than ruled out.
		restartable, watched = true, true
	}
	c.Verdicts = verdicts(target.Profile(), target, restartable, watched, opts.Skip, c.Stats, found)
	c.Notes = append(c.Notes, retried(l)...)
	if between := exitedBetween(l); len(between) > 0 {
		c.Notes = append(c.Notes, between...)
		crashUnshown(c.Verdicts, len(between))
	}
	out := l.Output()
	if notStarted != nil {
		didNotStart(c.Verdicts, notStarted)
		// What the server wrote as it failed to start says why; a server
		// that never started has no output of its own but that.
		out = cmp.Or(notStarted.Output(), out)
	}
	if runErr != nil && out != "" && !strings.Contains(runErr.Error(), out) {
		runErr = fmt.Errorf("%w\nthe server's last output:\n%s", runErr, out)
	}
	if runErr == nil && (len(found) > 0 || notStarted != nil || !slices.ContainsFunc(c.Verdicts, func(v report.Verdict) bool { return v.Status == report.Pass })) {
		c.ServerOutput = out
	}
	return c, runErr
}

// starts counts the starts of the server that got ready, in l and its
// workers: what a pass of the start verdict rests on.
func starts(l *execute.Lab) int {
	n := 0
	for _, lab := range l.All() {
		n += lab.Starts
	}
	return n
}

// labNotStarted is the first of l and its workers whose server did not
// start, nil if every one did.
func labNotStarted(l *execute.Lab) *execute.NotStarted {
	for _, lab := range l.All() {
		if lab.NotStarted != nil {
			return lab.NotStarted
		}
	}
	return nil
}

// retried are the notes of the starts l and its workers tried again.
func retried(l *execute.Lab) []string {
	var out []string
	for _, lab := range l.All() {
		out = append(out, lab.Retried...)
	}
	return out
}

// didNotStart makes the start verdict the FAIL of a server that did not
// start (ns): its reason says where, in how many tries, and what the
// server last wrote.
func didNotStart(vs []report.Verdict, ns *execute.NotStarted) {
	for i := range vs {
		if v := &vs[i]; v.Invariant == model.Start {
			v.Status, v.Failure, v.Reason = report.Fail, nil, ns.Error()
		}
	}
}

// stoppedAt says how many of the checks asked (nums, in order) ran,
// where a server that did not start (ns) stopped the run; "" if every
// one ran.
func stoppedAt(nums []int, ns *execute.NotStarted) string {
	i := slices.Index(nums, ns.Check)
	if i < 0 {
		return ""
	}
	var where string
	switch {
	case ns.Closing:
		i++ // the check ran, and closed
		where = fmt.Sprintf("the server did not start again after check %d", ns.Check)
	case ns.Step > 0:
		where = fmt.Sprintf("the server did not start again at step %d of check %d", ns.Step, ns.Check)
	default:
		where = fmt.Sprintf("the server did not start at check %d", ns.Check)
	}
	if i == len(nums) {
		return ""
	}
	return fmt.Sprintf("%d of %d checks asked ran: %s", i, len(nums), where)
}

// noRestarter says why a server the harness cannot restart is never
// checked for durability, and how a Go target gives it restarts.
const noRestarter = "the harness cannot restart this server: its target's Start returns a Server with no " +
	"Restart(crash bool, agents []string) error method (scenarios.Restarter), as scenarios.Handler's do; " +
	"to check T7 and T8, give Start a Server of your own that has one, stopping the server and starting it again " +
	"on the same data dir (README, \"From go test\"), or check it from a profile, as a process"

// noteErr is notes as an error, nil for none.
func noteErr(notes []string) error {
	if len(notes) == 0 {
		return nil
	}
	return errors.New(strings.Join(notes, "\n"))
}

// conformIn runs rounds of checks in l until the checks are spent, the
// context ends, a round finds nothing more, or the server does not start
// (said in notStarted, with how many checks ran in c.Stopped).
func conformIn(l *execute.Lab, opts Options, c *report.Conformance, found map[model.Invariant]*report.Failure, notStarted **execute.NotStarted) error {
	nums := opts.numbers()
	asked := nums
	// done counts every check of the rounds before, the ones run again in
	// a later round too, and last what this round has said so far: the
	// progress said is their sum, which only ever grows, but for its
	// count of checks, each counted once (below).
	done, last := report.NewStats(), report.NewStats()
	// A round's check counts its findings from the round's start; a
	// finding says how far into the whole run it came (Failure.FoundAfter).
	all, begin := len(nums), time.Now()
	for len(nums) > 0 {
		round := time.Now()
		o := opts
		o.checks, o.Skip = nums, slices.Clone(l.Skip)
		if opts.Progress != nil {
			o.Progress = func(s report.Stats) {
				last = &s
				sum := report.NewStats()
				sum.Add(*done)
				sum.Add(s)
				// Checks of an earlier round that ran past its finding run
				// again in this one: the checks done are those the rounds
				// before settled, and this round's, never more than asked.
				sum.Checks = min(all-len(nums)+s.Checks, all)
				sum.Shrinking = s.Shrinking
				opts.Progress(*sum)
			}
		}
		res, err := check(l, o)
		done.Add(*last)
		last = report.NewStats()
		if res != nil {
			c.Stats.Add(res.Stats)
		}
		if res != nil && res.Failure != nil && res.Failure.Violation != nil {
			f := res.Failure
			inRound := f.FoundAfter
			f.FoundAfter += all - len(nums)
			f.FoundIn += round.Sub(begin)
			found[f.Violation.Invariant] = f
			if opts.Found != nil {
				opts.Found(f, c.Stats)
			}
			l.Skip = append(l.Skip, f.Violation.Invariant)
			if k := f.Violation.Kind; k != "" && !slices.Contains(l.SkipKinds, k) {
				l.SkipKinds = append(l.SkipKinds, k)
			}
			// The checks after it go on, each from its own seed.
			nums = nums[min(max(inRound, 1), len(nums)):]
		}
		if err != nil && !errors.Is(err, ErrInterrupted) {
			// A server that stopped untidily after serving the checks is a
			// note, not an error that hides the verdicts.
			notes, rest := StopNotes(err)
			c.Notes, err = append(c.Notes, notes...), rest
		}
		if err == nil && opts.FailFast && res.Failure != nil && res.Failure.Violation != nil {
			c.Stopped = "the first failure was found (fail fast)"
			return nil
		}
		var ns *execute.NotStarted
		switch {
		case errors.As(err, &ns):
			// A finding, the start verdict's: what ran stands.
			*notStarted, c.Stopped = ns, stoppedAt(asked, ns)
			return nil
		case errors.Is(err, ErrInterrupted):
			c.Stopped = "interrupted"
			if errors.Is(o.Context.Err(), context.DeadlineExceeded) {
				c.Stopped = report.TimeBound
			}
			return nil
		case err != nil:
			return err
		case res.Failure == nil:
			return nil
		case res.Failure.Violation == nil:
			return fmt.Errorf("the harness failed, not the server (seed %d):\n%s", res.Seed, res.Failure.Report)
		}
	}
	return nil
}

// exitedBetween says how the shared servers of l and its workers exited
// on their own between two checks, where no step could be shown to have
// caused it (execute.Lab.ExitedBetween).
func exitedBetween(l *execute.Lab) []string {
	var out []string
	for _, lab := range l.All() {
		for _, e := range lab.ExitedBetween {
			out = append(out, "the server exited without being told to between two checks, after the last step of one "+
				"was answered and looked at, and was started again; no step shows what caused it: "+e)
		}
	}
	return out
}

// crashUnshown makes the crash verdict a FAIL where the server exited
// between two checks n times and no check's steps showed a crash: it
// went down, whatever the steps showed, and the notes say how.
func crashUnshown(vs []report.Verdict, n int) {
	for i := range vs {
		if v := &vs[i]; v.Invariant == model.Crash && (v.Status == report.Pass || v.Status == report.NotExercised) {
			v.Status, v.Failure = report.Fail, nil
			v.Reason = fmt.Sprintf("the server exited without being told to %d time(s) between two checks, where no step shows the cause: see the notes", n)
		}
	}
}

// verdicts judges each invariant of the contract, and whether the server
// stays up, from what the run saw.
func verdicts(p targets.Profile, target targets.Target, restartable, watched bool, skip []model.Invariant, s report.Stats, found map[model.Invariant]*report.Failure) []report.Verdict {
	var out []report.Verdict
	for _, inv := range report.Judged() {
		v := report.Verdict{Invariant: inv, Evaluations: s.Invariants[inv]}
		switch {
		case inv == model.Start:
			// Never skipped: a run whose server does not start ends there,
			// asked or not. A FAIL is said by didNotStart.
			v.Status, v.Reason = startVerdict(p, target, v.Evaluations)
		case found[inv] != nil:
			v.Status, v.Failure = report.Fail, found[inv]
		case s.SameCause[inv] > 0:
			v.Status = report.SameCause
			by := "the finding of " + kindFinding(found)
			if inv == model.Wire {
				// Breaches come beside another finding of their step.
				by = "a step whose turns another invariant's finding judged first"
			}
			v.Reason = fmt.Sprintf("broken %d time(s), each time in the way of %s: one root cause, reported there",
				s.SameCause[inv], by)
			if ex, ok := s.Folded[inv]; ok {
				v.Reason += fmt.Sprintf("; the first: on conversation %s, turn %s: %s", ex.Conv, ex.Turn, ex.Reason)
			}
		case alsoBroken(found, inv) != nil:
			f := alsoBroken(found, inv)
			v.Status = report.SameCause
			v.Reason = fmt.Sprintf("broken by the very request of the finding of %s (%s), by the same trigger: one root cause, reported there",
				f.Violation.Invariant, f.Violation.Kind)
		case notApplicable(p, target, restartable, watched, inv) != "":
			v.Status, v.Reason = report.NotApplicable, notApplicable(p, target, restartable, watched, inv)
		case slices.Contains(skip, inv):
			v.Status, v.Reason = report.Skipped, fmt.Sprintf("left out as a known failure; broken again %d time(s)", s.SetAside[inv])
		case v.Evaluations == 0 && inv == model.T4 && p.Supersede && s.Faults["concurrency"] > 0:
			// Bursts were sent, and each prompt cancelled the one before
			// it: none overlapped another on the model.
			v.Status, v.Reason = report.NotExercised, fmt.Sprintf("%d burst(s) sent, but no two prompts of one session both reached the model: under supersede (profile: policies.concurrency) each cancelled the one running, which is judged as an interruption (T10)", s.Faults["concurrency"])
		case v.Evaluations == 0:
			v.Status, v.Reason = report.NotExercised, preconditions[inv]
		case s.Steps > 0 && s.Outcomes["ok"] == 0 && inv != model.Crash && inv != model.Wire:
			// Whatever was evaluated, it was evaluated on a server that
			// committed nothing: no pass proves anything of its state.
			v.Status, v.Reason = report.NotExercised, "no turn ended ok: the server committed nothing a check could judge"
		default:
			v.Status = report.Pass
			if inv == model.Wire {
				v.Reason = wireKept[p.Protocol]
			}
			if inv == model.T2 && p.Eviction == targets.Forgets {
				v.Reason = fmt.Sprintf("%d turn(s) found their conversation forgotten (evicted, capacity %d) and started over", s.Evictions, p.Capacity)
				if s.Evictions == 0 {
					v.Reason = fmt.Sprintf("no conversation was forgotten: the server never evicted one (capacity %d), so T2 across an eviction was not exercised", p.Capacity)
				}
			}
			switch {
			case inv == model.T8 && p.OneSource:
				v.Reason = "two sources on one stable key not applicable: the server loads one agent source at a time (profile: server.one_source)"
			case inv == model.T8 && p.Protocol == targets.ACP:
				v.Reason = "two sources on one stable key not applicable: under ACP a refused session/load has no status that says the source is ambiguous"
			}
		}
		out = append(out, v)
	}
	return out
}

// startVerdict is the start verdict of a run whose server did start, n
// times, each ready within its tries: a pass, unless the harness starts
// no server (a fixed URL) or never started one.
func startVerdict(p targets.Profile, target targets.Target, n int) (report.Status, string) {
	if _, remote := target.(targets.Remote); remote {
		return report.NotApplicable, "the server runs at a fixed URL: the harness does not start it"
	}
	if n == 0 {
		return report.NotExercised, preconditions[model.Start]
	}
	if t := p.StartTriesOrDefault(); t > 1 {
		return report.Pass, fmt.Sprintf("each within %d tries (server.start_tries); the notes say each start tried again", t)
	}
	return report.Pass, ""
}

// alsoBroken is the finding whose violating request breaks inv too
// (model.Violation.Also), nil if none does.
func alsoBroken(found map[model.Invariant]*report.Failure, inv model.Invariant) *report.Failure {
	for _, i := range report.Judged() {
		if f := found[i]; f != nil && f.Violation != nil && slices.Contains(f.Violation.Also, inv) {
			return f
		}
	}
	return nil
}

// kindFinding names the findings that have a kind of wrong state.
func kindFinding(found map[model.Invariant]*report.Failure) string {
	var names []string
	for _, i := range report.Judged() {
		if f := found[i]; f != nil && f.Violation.Kind != "" {
			names = append(names, fmt.Sprintf("%s (%s)", i, f.Violation.Kind))
		}
	}
	return strings.Join(names, " or ")
}

// wireKept says, per protocol, what an agent that kept to it did: the
// wire finding's PASS, in the protocol's own words.
var wireKept = map[targets.Protocol]string{
	targets.ACP: "it called back only what the client advertised, and answered each cancelled prompt cancelled",
	targets.A2A: "each task stayed in its context, and tasks/get showed the task's own messages",
}

// preconditions say, for each invariant, what a run must reach to
// evaluate it: the reason it was not exercised.
var preconditions = map[model.Invariant]string{
	model.T1:  "no turn failed before a later turn of its conversation reached the model",
	model.T2:  "no turn ended ok before a later turn of its conversation reached the model",
	model.T3:  "no request without a usable user message was answered",
	model.T4:  "no two turns of one conversation were in flight at once",
	model.T5:  "no model call was made while two conversations existed",
	model.T6:  "no turn with an unknown outcome was followed by a turn that reached the model",
	model.T7:  "no conversation with a committed turn was continued after a restart",
	model.T8:  "no conversation with a committed turn was resumed after a restart that changed its agent source",
	model.T9:  "no model request carried a tool call or a tool result",
	model.T10: "no client interrupted a turn (left, or cancelled it) while the server waited on the model or a tool",
	model.T11: "no turn failed between two turns of a conversation with committed tool calls that both reached the model",

	model.Crash: "no step ran on a server whose process the harness watches, and no restart was drawn",
	model.Start: "the server was never started",
	model.Wire:  "no prompt or task was answered",
}

// notApplicable says why the server's declared policies, or the way it
// is run, exclude inv; "" if they do not.
func notApplicable(p targets.Profile, target targets.Target, restartable, watched bool, inv model.Invariant) string {
	if (inv == model.T9 || inv == model.T11) && !p.Tools {
		// T10 stays: a disconnect mid-turn is judged on any server.
		return "the server offers the model no tools (profile: tools)"
	}
	if inv == model.Wire && p.Protocol != targets.ACP && p.Protocol != targets.A2A {
		return "only an ACP agent calls its client back, and only an A2A agent's tasks are read back (profile: protocol)"
	}
	_, remote := target.(targets.Remote)
	if inv == model.Crash {
		switch {
		case remote:
			return "the server runs at a fixed URL: the harness neither watches its process nor restarts it (one that stops answering ends the run with an error)"
		case !restartable && !watched:
			return "the harness neither watches the server's process nor restarts it: it cannot see the server go down"
		}
		return ""
	}
	if inv != model.T7 && inv != model.T8 {
		return ""
	}
	switch {
	case remote:
		return "the server runs at a fixed URL: the harness cannot restart or crash it"
	case !restartable:
		return noRestarter
	case !p.Durability.Restart && !p.Durability.Crash:
		return "the profile declares no durability across restarts or crashes"
	case inv == model.T8 && p.Agent == "":
		return "the server loads no agent source from the fake model (profile: server.agent)"
	}
	return ""
}
