package scenarios

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// Status is the verdict on one invariant of a conformance run.
type Status string

// The verdicts.
const (
	// Pass: exercised, and never broken in the checks that ran. As with
	// any test, a pass finds no false positives but may miss a bug the
	// checks did not reach.
	Pass Status = "pass"
	// Fail: broken; the verdict carries the shrunk failure.
	Fail Status = "fail"
	// NotApplicable: the server's declared policies or the way it is run
	// exclude the invariant; the reason says which.
	NotApplicable Status = "not applicable"
	// NotExercised: never evaluated with its preconditions met (no ok
	// turn, no failed turn, no concurrent turns...): neither passed nor
	// failed.
	NotExercised Status = "not exercised"
	// Skipped: left out on request, as a known failure; its violations
	// set their conversations aside, and the rest is checked.
	Skipped Status = "skipped"
	// SameCause: broken, but only in the way another invariant's finding
	// is (the same kind of wrong state, model.Kind, under this
	// invariant's name): one root cause, reported once, under that
	// finding. Not a pass.
	SameCause Status = "same cause"
)

// Verdict is what a conformance run says of one invariant.
type Verdict struct {
	Invariant model.Invariant `json:"invariant"`
	Status    Status          `json:"status"`
	// Reason says why an invariant is not applicable, not exercised or
	// skipped.
	Reason string `json:"reason,omitempty"`
	// Evaluations counts the times it was evaluated where it could break.
	Evaluations int `json:"evaluations"`
	// Failure is the shrunk failure of a Fail.
	Failure *Failure `json:"failure,omitempty"`
}

// Conformance is the outcome of Conform: a verdict per invariant of
// PROTOCOL.md, and what the run did.
type Conformance struct {
	Seed     uint64        `json:"seed"`
	Stats    Stats         `json:"stats"`
	Elapsed  time.Duration `json:"-"` // elapsedMs in JSON
	Verdicts []Verdict     `json:"verdicts"`
	// Asked is how many checks were asked for; Stats.Checks says how
	// many ran.
	Asked int `json:"checksAsked"`
	// Stopped says why the run ended before all its checks ran (the time
	// bound, or an interruption); "" when they all ran.
	Stopped string `json:"stopped,omitempty"`
	// Notes are said beside the verdicts and change none: a server that
	// exited untidily on SIGTERM after the run, say.
	Notes []string `json:"notes,omitempty"`
	// ServerOutput is the last lines the server wrote, kept when an
	// invariant failed or none passed: its tracebacks often say why.
	ServerOutput string `json:"serverOutput,omitempty"`
}

// Passed reports whether the server conforms: every applicable invariant
// that turncheck checks and was not skipped was exercised and passed, in
// every check asked for. A run the time bound cut short has not passed,
// whatever it saw (see CutShort).
func (c *Conformance) Passed() bool {
	return c.Stopped == "" && c.clean()
}

// CutShort reports a run that broke nothing and left nothing unexercised
// in the checks it ran, but ran fewer than asked: it stopped early.
func (c *Conformance) CutShort() bool {
	return c.Stopped != "" && c.clean()
}

// clean reports that no verdict is a FAIL or NOT EXERCISED.
func (c *Conformance) clean() bool {
	for _, v := range c.Verdicts {
		if v.Status == Fail || v.Status == NotExercised {
			return false
		}
	}
	return true
}

// Verdict returns the verdict on inv.
func (c *Conformance) Verdict(inv model.Invariant) Verdict {
	for _, v := range c.Verdicts {
		if v.Invariant == inv {
			return v
		}
	}
	return Verdict{Invariant: inv} // not an invariant of the contract
}

// Failures returns the failures found, in invariant order.
func (c *Conformance) Failures() []*Failure {
	var out []*Failure
	for _, v := range c.Verdicts {
		if v.Failure != nil {
			out = append(out, v.Failure)
		}
	}
	return out
}

// Conform checks target against the whole contract and gives a verdict
// per invariant. Unlike Check, a broken invariant does not end the run:
// it is shrunk, recorded, and from then on skipped (as Options.Skip), and
// the remaining checks go on exploring the others. Options.Context bounds
// the whole run in wall-clock time; when it ends, the verdicts say what
// the checks run so far found, and Stopped says why the run is short.
//
// The error says the run could not be carried out: the server did not
// start, died during the run, or the harness failed.
func Conform(target targets.Target, opts Options) (*Conformance, error) {
	if opts.Checks <= 0 {
		opts.Checks = 100
	}
	if opts.Seed == 0 {
		opts.Seed = randomSeed()
	}
	start := time.Now()
	l, err := openLab(target, slices.Clone(opts.Skip))
	if err != nil {
		return nil, err
	}
	c := &Conformance{Seed: opts.Seed, Stats: *newStats(), Asked: opts.Checks}
	found := map[model.Invariant]*Failure{}
	runErr := conformIn(l, opts, c, found)
	notes, cerr := StopNotes(l.close())
	runErr = errors.Join(runErr, cerr)
	if runErr != nil {
		// A failed run's notes go with its error.
		runErr = errors.Join(runErr, noteErr(notes))
		notes = nil
	}
	c.Notes = append(c.Notes, notes...)
	c.Elapsed = time.Since(start)
	c.Verdicts = verdicts(target.Profile(), target, l.canRestart(), opts.Skip, c.Stats, found)
	out := l.output()
	if runErr != nil && out != "" && !strings.Contains(runErr.Error(), out) {
		runErr = fmt.Errorf("%w\nthe server's last output:\n%s", runErr, out)
	}
	if runErr == nil && (len(found) > 0 || !slices.ContainsFunc(c.Verdicts, func(v Verdict) bool { return v.Status == Pass })) {
		c.ServerOutput = out
	}
	return c, runErr
}

// noteErr is notes as an error, nil for none.
func noteErr(notes []string) error {
	if len(notes) == 0 {
		return nil
	}
	return errors.New(strings.Join(notes, "\n"))
}

// conformIn runs rounds of checks in l until the checks are spent, the
// context ends, or a round finds nothing more.
func conformIn(l *lab, opts Options, c *Conformance, found map[model.Invariant]*Failure) error {
	remaining, seed := opts.Checks, opts.Seed
	for remaining > 0 {
		o := opts
		o.Checks, o.Seed, o.Skip = remaining, seed, slices.Clone(l.skip)
		res, err := check(l, o)
		if res != nil {
			c.Stats.add(res.Stats)
		}
		if res != nil && res.Failure != nil && res.Failure.Violation != nil {
			f := res.Failure
			found[f.Violation.Invariant] = f
			if opts.Found != nil {
				opts.Found(f, c.Stats)
			}
			l.skip = append(l.skip, f.Violation.Invariant)
			if k := f.Violation.Kind; k != "" && !slices.Contains(l.skipKinds, k) {
				l.skipKinds = append(l.skipKinds, k)
			}
			used := max(f.FoundAfter, 1)
			remaining -= used
			seed = checkSeed(seed, used+1)
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
		switch {
		case errors.Is(err, ErrInterrupted):
			c.Stopped = "interrupted"
			if errors.Is(o.Context.Err(), context.DeadlineExceeded) {
				c.Stopped = "the time bound was reached"
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

// verdicts judges each invariant of the contract from what the run saw.
func verdicts(p targets.Profile, target targets.Target, restartable bool, skip []model.Invariant, s Stats, found map[model.Invariant]*Failure) []Verdict {
	var out []Verdict
	for _, inv := range model.Invariants() {
		v := Verdict{Invariant: inv, Evaluations: s.Invariants[inv]}
		switch {
		case found[inv] != nil:
			v.Status, v.Failure = Fail, found[inv]
		case s.SameCause[inv] > 0:
			v.Status = SameCause
			v.Reason = fmt.Sprintf("broken %d time(s), each time in the way of the finding of %s: one root cause, reported there",
				s.SameCause[inv], kindFinding(found))
		case notApplicable(p, target, restartable, inv) != "":
			v.Status, v.Reason = NotApplicable, notApplicable(p, target, restartable, inv)
		case slices.Contains(skip, inv):
			v.Status, v.Reason = Skipped, fmt.Sprintf("left out as a known failure; broken again %d time(s)", s.SetAside[inv])
		case v.Evaluations == 0:
			v.Status, v.Reason = NotExercised, preconditions[inv]
		default:
			v.Status = Pass
		}
		out = append(out, v)
	}
	return out
}

// kindFinding names the findings that have a kind of wrong state.
func kindFinding(found map[model.Invariant]*Failure) string {
	var names []string
	for _, i := range model.Invariants() {
		if f := found[i]; f != nil && f.Violation.Kind != "" {
			names = append(names, fmt.Sprintf("%s (%s)", i, f.Violation.Kind))
		}
	}
	return strings.Join(names, " or ")
}

// exercises say, for each invariant, what one evaluation that counts is:
// a PASS line says how many of them the run saw.
var exercises = map[model.Invariant]string{
	model.T1:  "model request(s) of conversations with a failed turn, never showing it",
	model.T2:  "model request(s) of conversations with committed turns, showing them whole",
	model.T3:  "request(s) without a usable message answered on conversations with history, none replayed",
	model.T4:  "time(s) turns of one conversation overlapped and ran, or a refusal was judged by the declared policy",
	model.T5:  "model request(s) made while other conversations held turns, none leaking",
	model.T6:  "model request(s) after a turn with an unknown outcome, showing it whole or not at all",
	model.T7:  "resume(s) after a restart or crash, history intact",
	model.T8:  "resume(s) after the agent's source changed or became ambiguous",
	model.T9:  "model request(s) carrying tool calls or results, all paired",
	model.T10: "judgement(s) of a turn whose client disconnected mid-turn",
	model.T11: "first request(s) compared across turns that failed",
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
	model.T10: "no client disconnected mid-turn while the server waited on the model or a tool",
	model.T11: "no turn failed between two turns of a conversation with committed tool calls that both reached the model",
}

// notApplicable says why the server's declared policies, or the way it
// is run, exclude inv; "" if they do not.
func notApplicable(p targets.Profile, target targets.Target, restartable bool, inv model.Invariant) string {
	if (inv == model.T9 || inv == model.T11) && !p.Tools {
		// T10 stays: a disconnect mid-turn is judged on any server.
		return "the server offers the model no tools (profile: tools)"
	}
	if inv != model.T7 && inv != model.T8 {
		return ""
	}
	_, remote := target.(targets.Remote)
	switch {
	case remote:
		return "the server runs at a fixed URL: the harness cannot restart or crash it"
	case !restartable:
		return "the harness cannot restart this server (its target has no Restarter)"
	case !p.Durability.Restart && !p.Durability.Crash:
		return "the profile declares no durability across restarts or crashes"
	case inv == model.T8 && p.Agent == "":
		return "the server loads no agent source from the fake model (profile: server.agent)"
	}
	return ""
}

// add adds o's counts to s.
func (s *Stats) add(o Stats) {
	s.Checks += o.Checks
	s.Steps += o.Steps
	s.ShrinkRuns += o.ShrinkRuns
	addCounts(s.Faults, o.Faults)
	addCounts(s.Outcomes, o.Outcomes)
	addCounts(s.Causes, o.Causes)
	addCounts(s.TimeMS, o.TimeMS)
	for _, m := range []struct{ to, from map[model.Invariant]int }{{s.Invariants, o.Invariants},
		{s.SetAside, o.SetAside}, {s.Consequences, o.Consequences}, {s.SameCause, o.SameCause}} {
		addCounts(m.to, m.from)
	}
	for _, a := range o.FirstAnswers {
		if len(s.FirstAnswers) < maxFirstAnswers {
			s.FirstAnswers = append(s.FirstAnswers, a)
		}
	}
}

// addCounts adds the counts of from to those of to.
func addCounts[K comparable, N int | int64](to, from map[K]N) {
	for k, v := range from {
		to[k] += v
	}
}

// Text renders the verdicts for a person: a table, then each failure's
// report, then what the run did.
func (c *Conformance) Text(p targets.Profile) string {
	var b strings.Builder
	b.WriteString(c.Table())
	for _, f := range c.Failures() {
		b.WriteString("\n" + FindingText(f))
	}
	b.WriteString("\n" + c.Closing())
	return b.String()
}

// Table is one line per invariant: its verdict, and what it rests on.
func (c *Conformance) Table() string {
	var b strings.Builder
	for _, v := range c.Verdicts {
		fmt.Fprintf(&b, "%-4s %-31s %-15s%s\n", v.Invariant, v.Invariant.Title(), strings.ToUpper(string(v.Status)), v.rests())
	}
	return b.String()
}

// rests says what a verdict rests on: how often a pass was exercised,
// what a failure broke, or why the invariant was not judged.
func (v Verdict) rests() string {
	switch {
	case v.Status == Pass:
		return fmt.Sprintf("%d %s", v.Evaluations, exercises[v.Invariant])
	case v.Failure != nil:
		return firstLine(v.Failure.Violation.Error())
	}
	return v.Reason
}

// Outcome is the run's verdict in a word or three: CONFORMS, DOES NOT
// CONFORM, INCOMPLETE (a run the time bound cut short that broke
// nothing) or INTERRUPTED.
func (c *Conformance) Outcome() string {
	switch {
	case c.Stopped == "interrupted":
		return "INTERRUPTED"
	case c.Passed():
		return "CONFORMS"
	case c.CutShort():
		return "INCOMPLETE"
	}
	return "DOES NOT CONFORM"
}

// FindingText renders one failure for a person: the broken invariant, the
// shrunk steps, and how it was found and shrunk.
func FindingText(f *Failure) string {
	var b strings.Builder
	fmt.Fprintf(&b, "=== %s (%s) ===\n", f.Violation.Invariant, f.Violation.Invariant.Title())
	if f.Flaky {
		b.WriteString("(broken once, but the same steps did not break it again: the server does not behave the same way under the same steps)\n")
	}
	b.WriteString(strings.TrimRight(f.Report, "\n"))
	fmt.Fprintf(&b, "\n%s\n", f.ShrinkStats())
	return b.String()
}

// Closing is what the run did: its counts and warnings, why it stopped
// early, notes, the server's last output where it helps, the seed.
func (c *Conformance) Closing() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", c.Stats.Summary())
	if c.Stopped != "" {
		fmt.Fprintf(&b, "stopped early: %s\n", c.Stopped)
	}
	for _, n := range c.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	if c.ServerOutput != "" {
		fmt.Fprintf(&b, "the server's last output:\n%s\n", c.ServerOutput)
	}
	fmt.Fprintf(&b, "seed %d, elapsed %s\n", c.Seed, c.Elapsed.Round(time.Millisecond))
	return b.String()
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
