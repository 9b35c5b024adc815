// Package report holds what a run found (Result, Failure, Stats,
// Conformance and its verdicts) and renders it for a person and for
// machines: text, JSON, JUnit and HTML.
package report

import (
	"cmp"
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

// Verdict is what a conformance run says of one invariant.
type Verdict struct {
	Invariant model.Invariant `json:"invariant"`
	Status    Status          `json:"status"`
	// Reason says why an invariant is not applicable, not exercised or
	// skipped; for one that passed, what part of it did not apply.
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
	// Shard is the share of a run's checks these verdicts are about, as
	// K/N; "" for a whole run. Merge joins a run's shards.
	Shard string `json:"shard,omitempty"`
	// Stopped says why the run ended before all its checks ran (the time
	// bound, or an interruption); "" when they all ran.
	Stopped string `json:"stopped,omitempty"`
	// Notes are said beside the verdicts and change none: a server that
	// exited untidily on SIGTERM after the run, say.
	Notes []string `json:"notes,omitempty"`
	// BaselineFrom names the baseline the verdicts were judged against
	// (ApplyBaseline), "" for none.
	BaselineFrom string `json:"baselineFrom,omitempty"`
	// ServerOutput is the last lines the server wrote, kept when an
	// invariant failed or none passed: its tracebacks often say why.
	ServerOutput string `json:"serverOutput,omitempty"`
}

// A run has one of three outcomes, each with its word and exit status:
// broken (a FAIL: DOES NOT CONFORM), not proven (nothing broke, but an
// invariant was not exercised or the run was cut short: NOT PROVEN), or
// conforms (CONFORMS, perhaps but for known findings). An interrupted
// run has none of them.

// Passed reports whether the server conforms: every applicable invariant
// that turncheck checks and was not skipped was exercised and passed
// (or is a known finding), in every check asked for. A run the time bound
// cut short has not passed, whatever it saw (see NotProven).
func (c *Conformance) Passed() bool {
	return c.Stopped == "" && !c.Broken() && len(c.Unexercised()) == 0
}

// Broken reports a run that found an invariant broken: a FAIL.
func (c *Conformance) Broken() bool {
	return slices.ContainsFunc(c.Verdicts, func(v Verdict) bool { return v.Status == Fail })
}

// NotProven reports a run that broke nothing and yet proves no
// conformance: an invariant was not exercised, or fewer checks ran than
// were asked (the time bound). An interrupted run is neither.
func (c *Conformance) NotProven() bool {
	return c.Stopped != "interrupted" && !c.Broken() && !c.Passed()
}

// CutShort reports a run that broke nothing and left nothing unexercised
// in the checks it ran, but ran fewer than asked: it stopped early.
func (c *Conformance) CutShort() bool {
	return c.Stopped != "" && !c.Broken() && len(c.Unexercised()) == 0
}

// Unexercised are the verdicts NOT EXERCISED: what keeps a run that broke
// nothing from proving conformance.
func (c *Conformance) Unexercised() []Verdict {
	var out []Verdict
	for _, v := range c.Verdicts {
		if v.Status == NotExercised {
			out = append(out, v)
		}
	}
	return out
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

// KeepFolded keeps, of the examples in folded, those of invariants s has
// none of yet (Stats.Folded).
func (s *Stats) KeepFolded(folded map[model.Invariant]model.Violation) {
	for inv, v := range folded {
		if _, ok := s.Folded[inv]; !ok {
			if s.Folded == nil {
				s.Folded = map[model.Invariant]model.Violation{}
			}
			s.Folded[inv] = v
		}
	}
}

// add adds o's counts to s.
func (s *Stats) Add(o Stats) {
	s.Checks += o.Checks
	s.Steps += o.Steps
	s.ShrinkRuns += o.ShrinkRuns
	s.KeepFolded(o.Folded)
	s.Auxiliary += o.Auxiliary
	s.Evictions += o.Evictions
	s.Rationed += o.Rationed
	s.Steered += o.Steered
	if o.Pace != "" {
		// The latest measure, with the most behind it.
		s.Pace = o.Pace
	}
	s.RestartShare = cmp.Or(o.RestartShare, s.RestartShare)
	s.Ration = max(s.Ration, o.Ration)
	AddCounts(s.Faults, o.Faults)
	if len(o.Unreached) > 0 && s.Unreached == nil {
		s.Unreached = map[string]int{}
	}
	AddCounts(s.Unreached, o.Unreached)
	if len(o.Drawn) > 0 && s.Drawn == nil {
		s.Drawn = map[string]int{}
	}
	AddCounts(s.Drawn, o.Drawn)
	AddCounts(s.Outcomes, o.Outcomes)
	AddCounts(s.Causes, o.Causes)
	AddCounts(s.TimeMS, o.TimeMS)
	for _, m := range []struct{ to, from map[model.Invariant]int }{{s.Invariants, o.Invariants},
		{s.SetAside, o.SetAside}, {s.Consequences, o.Consequences}, {s.SameCause, o.SameCause}} {
		AddCounts(m.to, m.from)
	}
	for c, n := range o.Uninjected {
		s.CountUninjected(c, o.UninjectedSaid[c])
		s.Uninjected[c] += n - 1
	}
	for _, a := range o.FirstAnswers {
		if len(s.FirstAnswers) < MaxFirstAnswers {
			s.FirstAnswers = append(s.FirstAnswers, a)
		}
	}
}

// AddCounts adds the counts of from to those of to.
func AddCounts[K comparable, N int | int64](to, from map[K]N) {
	for k, v := range from {
		to[k] += v
	}
}

// Text renders the verdicts for a person: a table, then each failure's
// report, then what the run did.
func (c *Conformance) Text(p targets.Profile) string {
	var b strings.Builder
	b.WriteString(c.Table())
	for _, v := range c.Verdicts {
		f := v.Failure
		if f == nil {
			// A FAIL with no failure (a crash between two checks) is said
			// whole by its line of the table and the notes.
			continue
		}
		b.WriteString("\n" + findingText(v.Invariant, f))
		if v.Status == Known {
			fmt.Fprintf(&b, "KNOWN: the baseline %s lists this finding; it fails nothing.\n", c.BaselineFrom)
		}
		if a := p.Assumed[policyOf[v.Invariant]]; a != "" {
			fmt.Fprintf(&b, "Judged by a policy not declared: %s.\n", a)
		}
	}
	b.WriteString("\n" + c.Closing())
	return b.String()
}

// policyOf is, for each invariant a declared policy decides, that policy.
var policyOf = map[model.Invariant]string{model.T4: "concurrency", model.T2: "eviction", model.T10: "interruption"}

// Table is one line per invariant: its verdict, and what it rests on.
func (c *Conformance) Table() string {
	var b strings.Builder
	for _, v := range c.Verdicts {
		// A longer name (crash) takes from its title's column.
		title := 31 - max(len(v.Invariant)-4, 0)
		fmt.Fprintf(&b, "%-4s %-*s %-15s%s\n", v.Invariant, title, v.Invariant.Title(), strings.ToUpper(string(v.Status)), v.rests())
	}
	return b.String()
}

// rests says what a verdict rests on: how often a pass was exercised,
// what a failure broke, or why the invariant was not judged.
func (v Verdict) rests() string {
	switch {
	case v.Status == Pass && v.Reason != "":
		// What of the invariant its preconditions left out.
		return fmt.Sprintf("%d %s; %s", v.Evaluations, Exercises[v.Invariant], v.Reason)
	case v.Status == Pass:
		return fmt.Sprintf("%d %s", v.Evaluations, Exercises[v.Invariant])
	case v.Status == Known:
		return "in the baseline: " + firstLine(v.message())
	case v.Status == Fixed:
		return fmt.Sprintf("%d %s; %s", v.Evaluations, Exercises[v.Invariant], v.Reason)
	case v.Status == Fail || v.Failure != nil:
		return firstLine(v.message())
	}
	return v.Reason
}

// message says why a FAIL failed: its violation; else its reason (a crash
// seen between two checks has no failure, as no step shows it, only a
// reason); else the first line of its failure's report (a failure that
// names no violation). Never "": a FAIL always says something.
func (v Verdict) message() string {
	switch {
	case v.Failure != nil && v.Failure.Violation != nil:
		return v.Failure.Violation.Error()
	case v.Reason != "":
		return v.Reason
	case v.Failure != nil && strings.TrimSpace(v.Failure.Report) != "":
		return firstLine(strings.TrimSpace(v.Failure.Report))
	}
	return "broken; nothing was kept to say how"
}

// Outcome is the run's verdict in a word or three: CONFORMS (perhaps
// but for known findings), NOT PROVEN (nothing broke, but something was
// not exercised, or the time bound cut the run short), DOES NOT
// CONFORM, or INTERRUPTED.
func (c *Conformance) Outcome() string {
	switch {
	case c.Stopped == "interrupted":
		return "INTERRUPTED"
	case c.Passed() && c.knownCount() > 0:
		return fmt.Sprintf("CONFORMS, BUT FOR %d KNOWN FINDING(S)", c.knownCount())
	case c.Passed():
		return "CONFORMS"
	case c.NotProven():
		return "NOT PROVEN"
	}
	return "DOES NOT CONFORM"
}

// FindingText renders one failure for a person: the broken invariant, the
// shrunk steps, and how it was found and shrunk. A failure that names no
// violation is the harness's own, and says so.
func FindingText(f *Failure) string {
	var inv model.Invariant
	if f.Violation != nil {
		inv = f.Violation.Invariant
	}
	return findingText(inv, f)
}

// findingText is FindingText of a failure found of inv: the verdict's
// invariant names it even where the failure names no violation.
func findingText(inv model.Invariant, f *Failure) string {
	var b strings.Builder
	if f.Violation != nil {
		inv = f.Violation.Invariant
	}
	if inv == "" {
		b.WriteString("=== the harness failed, not the server ===\n")
	} else {
		fmt.Fprintf(&b, "=== %s (%s) ===\n", inv, inv.Title())
	}
	if f.Flaky {
		b.WriteString("(broken once, but the same steps did not break it again: the server does not behave the same way under the same steps)\n")
	}
	b.WriteString(strings.TrimRight(f.Report, "\n"))
	fmt.Fprintf(&b, "\n%s\n", f.ShrinkStats())
	return b.String()
}

// fullRun says, for a run its time bound ended, how long all the checks
// asked would take at the pace of those that ran (their time, shrinks
// apart, which a run spends once per finding): what --timeout a full run
// needs. "" for any other run.
func (c *Conformance) fullRun() string {
	if c.Stopped != TimeBound || c.Stats.Checks == 0 || c.Asked <= c.Stats.Checks {
		return ""
	}
	shrinking := time.Duration(c.Stats.TimeMS[spentShrink]) * time.Millisecond
	each := max(c.Elapsed-shrinking, 0) / time.Duration(c.Stats.Checks)
	need := each*time.Duration(c.Asked) + shrinking
	return fmt.Sprintf(" after %d of the %d checks asked; at the %s a check took here (shrinks apart), all %d would need about %s: --timeout %s",
		c.Stats.Checks, c.Asked, each.Round(100*time.Millisecond), c.Asked, need.Round(time.Minute), (need + time.Minute - 1).Truncate(time.Minute))
}

// spentShrink is the time summary's key for shrinking
// (execute.SpentShrink).
const spentShrink = "shrinking"

// Closing is what the run did: its counts and warnings, why it stopped
// early, notes, the server's last output where it helps, the seed.
func (c *Conformance) Closing() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", c.Stats.Summary())
	if c.Stopped != "" {
		fmt.Fprintf(&b, "stopped early: %s%s\n", c.Stopped, c.fullRun())
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
	// Aside: not exercised in a run with known findings (a baseline's),
	// whose conversations were set aside as soon as each was seen, and
	// with them what would have exercised it: nothing was proven of it,
	// and nothing new broke. It does not keep the run from passing its
	// gate.
	Aside Status = "set aside"
	// SameCause: broken, but only in the way another invariant's finding
	// is (the same kind of wrong state, model.Kind, under this
	// invariant's name): one root cause, reported once, under that
	// finding. Not a pass.
	SameCause Status = "same cause"
)

// Judged lists what a run gives a verdict on, in the order of its
// verdicts: the invariants T1 to T11, then whether the server stays up
// (model.Crash) and starts (model.Start), and whether an agent keeps to
// its protocol (model.Wire), findings of their own kinds beside them.
func Judged() []model.Invariant {
	return append(model.Invariants(), model.Crash, model.Start, model.Wire)
}

// Exercises say, for each invariant, what one evaluation that counts is:
// a PASS line says how many of them the run saw.
var Exercises = map[model.Invariant]string{
	model.T1:  "model request(s) of conversations with a failed turn, never showing it",
	model.T2:  "model request(s) of conversations with committed turns, showing them whole",
	model.T3:  "request(s) without a usable message answered on conversations with history, none replayed",
	model.T4:  "time(s) turns of one conversation overlapped and ran, or a refusal was judged by the declared policy",
	model.T5:  "model request(s) made while other conversations held turns, none leaking",
	model.T6:  "model request(s) after a turn with an unknown outcome, showing it whole or not at all",
	model.T7:  "resume(s) after a restart or crash, history intact",
	model.T8:  "resume(s) after the agent's source changed or became ambiguous",
	model.T9:  "model request(s) carrying tool calls or results, all paired",
	model.T10: "judgement(s) of a turn whose client interrupted it mid-turn (left, or cancelled it)",
	model.T11: "first request(s) compared across turns that failed",

	// The crash finding: not an invariant of a conversation, beside them.
	model.Crash: "step(s) after which the server was seen up: its process watched, or back from a restart drawn",
	model.Start: "start(s) of the server, each ready: its first, restarts drawn, and starts between checks",
	model.Wire:  "prompt(s) or task(s) answered by an agent that kept to its protocol",
}

// TimeBound is Stopped for a run its time bound (--timeout) ended.
const TimeBound = "the time bound was reached"

// WouldExercise says, for each invariant, what a run needs to exercise
// it: what a NOT PROVEN run names beside each invariant it did not.
var WouldExercise = map[model.Invariant]string{
	model.T1:  "a turn that fails (the fake model's faults are drawn) followed by a turn of its conversation: more checks, or a server that runs the model for each turn",
	model.T2:  "turns that end ok: a server that answers the harness's turns (the summary's first answers say why it did not)",
	model.T3:  "a request without a usable user message on a conversation with history: more checks",
	model.T4:  "requests sent at once on one conversation (bursts): more checks",
	model.T5:  "model calls while two conversations exist: more checks",
	model.T6:  "a turn whose outcome is unknown (a crash mid-turn, a client that gives up) followed by a turn of its conversation: more checks, and durability declared for crashes",
	model.T7:  "a conversation continued after a restart or crash: more checks, with durability declared and a server the harness starts (profiles/README.md, server.restart_share)",
	model.T8:  "a resume after a restart that changes the agent's source: server.agent in the profile, durability declared, and more checks",
	model.T9:  "tool calls reaching the model: tools: true in the profile, and a server that offers the model the echo and lookup tools",
	model.T10: "a client that disconnects while the model holds its turn: more checks",
	model.T11: "a turn that fails between two tool turns of one conversation: tools: true and more checks",

	model.Crash: "a server the harness starts and watches (server.command)",
	model.Wire:  "prompts or tasks answered: more checks",
}

// NotProvenText says why a run that broke nothing proves no
// conformance: the checks it did not run, and each invariant it did not
// exercise, with what would exercise it. "" when the run is not NOT
// PROVEN.
func (c *Conformance) NotProvenText() string {
	if !c.NotProven() {
		return ""
	}
	var b strings.Builder
	b.WriteString("NOT PROVEN: nothing broke")
	switch {
	case c.Stopped == TimeBound:
		fmt.Fprintf(&b, " in the %d of %d checks asked that ran, but %s first: run longer (--timeout) or ask fewer checks (--checks) for a verdict", c.Stats.Checks, c.Asked, c.Stopped)
	case c.Stopped != "":
		fmt.Fprintf(&b, " in the checks that ran, but the run stopped early: %s", c.Stopped)
	}
	if un := c.Unexercised(); len(un) > 0 {
		names := make([]string, len(un))
		for i, v := range un {
			names[i] = string(v.Invariant)
		}
		fmt.Fprintf(&b, "; not exercised: %s. What would exercise each:", strings.Join(names, ", "))
		for _, v := range un {
			fmt.Fprintf(&b, "\n  %-5s %s", v.Invariant, WouldExercise[v.Invariant])
		}
	}
	return b.String() + "\n"
}

// Merge joins the verdicts of the shards of one run (Conformance.Shard,
// all N of them, from one seed) into the run's: an invariant fails if it
// failed in a shard, with the failure of the earliest check; it passes if
// it passed in one and failed in none; evaluations and counts add up. A
// shard does not know what the others found, so an invariant broken in
// two shards is reported once, from the earliest check, a failure of a
// kind found at an earlier check is a same cause, and a run whose shards
// did not all run is refused: its merge would pass what never ran. Past
// a finding, a whole run goes on past the violations it sets aside, where
// a shard that had not found it stops a check: what else the merge says
// was exercised may then differ from the whole run's, never what it found.
func Merge(shards []*Conformance) (*Conformance, error) {
	if len(shards) == 0 {
		return nil, errors.New("no shards to merge")
	}
	if err := checkShards(shards); err != nil {
		return nil, err
	}
	out := &Conformance{Seed: shards[0].Seed, Stats: *NewStats()}
	for _, s := range shards {
		out.Stats.Add(s.Stats)
		out.Asked += s.Asked
		out.Elapsed = max(out.Elapsed, s.Elapsed) // shards run side by side
		if s.Stopped != "" {
			out.Stopped = strings.TrimPrefix(out.Stopped+"; ", "; ") + "shard " + s.Shard + ": " + s.Stopped
		}
		for _, note := range s.Notes {
			out.Notes = append(out.Notes, "shard "+s.Shard+": "+note)
		}
		out.ServerOutput = cmp.Or(out.ServerOutput, s.ServerOutput)
	}
	for i := range shards[0].Verdicts {
		v, err := mergeVerdicts(shards, i)
		if err != nil {
			return nil, err
		}
		out.Verdicts = append(out.Verdicts, v)
	}
	sameCause(out.Verdicts)
	return out, nil
}

// sameCause makes a failure that is the same kind of wrong state as one
// found at an earlier check a same cause: one root cause, one finding, as
// a whole run, which sets a kind aside once found, reports it. A shard
// that did not find the earlier one could not know.
func sameCause(vs []Verdict) {
	first := map[model.Kind]*Verdict{}
	for i := range vs {
		v := &vs[i]
		if v.Status != Fail || v.Failure == nil || v.Failure.Violation == nil || v.Failure.Violation.Kind == "" {
			continue
		}
		if f := first[v.Failure.Violation.Kind]; f == nil || v.Failure.Check < f.Failure.Check {
			first[v.Failure.Violation.Kind] = v
		}
	}
	for i := range vs {
		v := &vs[i]
		if v.Status != Fail || v.Failure == nil || v.Failure.Violation == nil {
			continue
		}
		if f := first[v.Failure.Violation.Kind]; f != nil && f != v {
			v.Status = SameCause
			v.Reason = fmt.Sprintf("broken only as %s is, the same kind of wrong state (%s), found at an earlier check", f.Invariant, v.Failure.Violation.Kind)
			v.Failure = nil
		}
	}
}

// checkShards checks that shards are the N shards of one run, once each.
func checkShards(shards []*Conformance) error {
	seen := map[int]bool{}
	n := 0
	for _, s := range shards {
		var k, of int
		if _, err := fmt.Sscanf(s.Shard, "%d/%d", &k, &of); err != nil || k < 1 || k > of {
			return fmt.Errorf("a run that is no shard (shard %q): merge the verdicts of 'conform --shard K/N'", s.Shard)
		}
		switch {
		case n != 0 && of != n:
			return fmt.Errorf("shards of %d and of %d: merge the shards of one run", n, of)
		case s.Seed != shards[0].Seed:
			return fmt.Errorf("shard %s ran from seed %d, shard %s from seed %d: merge the shards of one run", s.Shard, s.Seed, shards[0].Shard, shards[0].Seed)
		case seen[k]:
			return fmt.Errorf("shard %s twice", s.Shard)
		case len(s.Verdicts) != len(shards[0].Verdicts):
			return fmt.Errorf("shard %s has %d verdicts, shard %s %d", s.Shard, len(s.Verdicts), shards[0].Shard, len(shards[0].Verdicts))
		}
		n, seen[k] = of, true
	}
	var missing []string
	for k := 1; k <= n; k++ {
		if !seen[k] {
			missing = append(missing, fmt.Sprintf("%d/%d", k, n))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("shard(s) %s missing: a merge without them would pass what never ran", strings.Join(missing, ", "))
	}
	return nil
}

// mergeVerdicts is the run's verdict on the i-th invariant of the shards:
// the strongest of theirs (a failure, then a same cause, a pass, not
// exercised; not applicable and skipped are the profile's, the same in
// every shard), its evaluations summed.
func mergeVerdicts(shards []*Conformance, i int) (Verdict, error) {
	rank := map[Status]int{Fail: 0, Known: 1, SameCause: 2, Fixed: 3, Pass: 4, NotExercised: 5, NotApplicable: 6, Skipped: 7}
	out := shards[0].Verdicts[i]
	out.Evaluations = 0
	for _, s := range shards {
		v := s.Verdicts[i]
		if v.Invariant != out.Invariant {
			return Verdict{}, fmt.Errorf("shard %s judges %s where shard %s judges %s", s.Shard, v.Invariant, shards[0].Shard, out.Invariant)
		}
		out.Evaluations += v.Evaluations
		better := rank[v.Status] < rank[out.Status]
		earlier := v.Status == Fail && out.Status == Fail && v.Failure != nil && out.Failure != nil && v.Failure.Check < out.Failure.Check
		if better || earlier {
			evals := out.Evaluations
			out = v
			out.Evaluations = evals
		}
	}
	return out, nil
}
