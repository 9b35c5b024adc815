package report

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/protocol"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// FormatFailure renders a violation and the history that led to it for a
// person: the broken invariant first, then each step with its requests
// (several for a burst, with the order in which they were sent and
// answered), the injected faults, the outcomes, what the model saw, and a
// curl command that sends each request by hand.
func FormatFailure(v *model.Violation, history []history.Op, p targets.Profile) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", v.Error())
	fmt.Fprintf(&b, "%s:\n", historySize(history))
	b.WriteString(earlierSteps(history))
	// Where requests went to several replicas, each says which.
	replicated := false
	for _, op := range history {
		replicated = replicated || op.Send.Replica != 0 && op.Served == nil
	}
	for i, op := range history {
		if i == 0 || op.Step != history[i-1].Step {
			writeStepHeader(&b, history, i)
		}
		writeOp(&b, op, p, replicated)
	}
	if p.Protocol == targets.ACP {
		b.WriteString("\nThe JSON-RPC lines are the prompts as written to the agent's stdin (after its initialize\n" +
			"and session/new); they do not inject the model's faults: replay the saved failure for those.\n")
	} else {
		b.WriteString("\nThe curl commands send each request again to the server at $TURNCHECK_URL; they do not\n" +
			"inject the model's faults: replay the saved failure for those.\n")
	}
	if strings.Contains(b.String(), "tick ") {
		b.WriteString("A tick numbers the run's events (requests sent and answered, model calls, tool runs) in the\n" +
			"order the harness saw them: a later tick is a later event.\n")
	}
	return serverIDs(history).Replace(b.String())
}

// historySize counts a failing run's steps and requests, as every
// rendering of it says them: "2 step(s), 3 request(s)".
func historySize(history []history.Op) string {
	steps := 0
	if len(history) > 0 {
		steps = history[len(history)-1].Step - history[0].Step + 1
	}
	return fmt.Sprintf("%d step(s), %d request(s)", steps, len(history))
}

// earlierSteps says which steps of a failing run are earlier checks'
// (history.Op.Earlier), whose messages the failing check met on the
// server the run's checks shared, and how a replay runs them; or, where
// the history starts after step 1, that the steps before it, not shown,
// are such steps (the run as it failed holds its own steps only). ""
// where there are none.
func earlierSteps(history []history.Op) string {
	const how = ": earlier checks' steps on the same server, whose messages the failing check met (a leak\n" +
		"  between checks). A replay runs them first, each check's in a session of its own on one server, then\n" +
		"  the failing check's own steps.\n"
	if len(history) > 0 && history[0].Step > 1 {
		return fmt.Sprintf("  %s (not shown)%s", stepSpan(1, history[0].Step-1, true), how)
	}
	var spans []string
	for i, op := range history {
		if op.Earlier == (plan.Origin{}) || i > 0 && history[i-1].Earlier == op.Earlier {
			continue
		}
		last := op.Step
		for _, o := range history[i:] {
			if o.Earlier != op.Earlier {
				break
			}
			last = o.Step
		}
		spans = append(spans, fmt.Sprintf("%s (%s)", stepSpan(op.Step, last, len(spans) == 0), op.Earlier))
	}
	if len(spans) == 0 {
		return ""
	}
	return "  " + strings.Join(spans, ", ") + how
}

// stepSpan names steps first to last: "step 2", "steps 1-3"; capitalised
// to start a sentence.
func stepSpan(first, last int, capital bool) string {
	word := "step"
	if capital {
		word = "Step"
	}
	if last > first {
		return fmt.Sprintf("%ss %d-%d", word, first, last)
	}
	return fmt.Sprintf("%s %d", word, first)
}

// serverIDs names the ids the server made in a history (response ids,
// session ids) by where they came from: they differ on every run, and a
// failure must read the same every time it replays. A request that
// chains from a response, or runs in a session, then shows which.
func serverIDs(history []history.Op) *strings.Replacer {
	var pairs []string
	named := map[string]bool{}
	name := func(id, as string) {
		if id != "" && !named[id] {
			named[id] = true
			pairs = append(pairs, id, as)
		}
	}
	for _, op := range history {
		label := fmt.Sprintf("%d%s", op.Step, letters(op.Index + 1)[op.Index])
		if op.Request.A2A() {
			name(op.Response.ID, "<task of "+label+">")
		}
		name(op.Response.ID, "<response of "+label+">")
		// No quotes in a name: it stands inside a JSON body too.
		session := "<session of " + op.Request.Conv.ID
		if op.Request.A2A() {
			session = "<context of " + op.Request.Conv.ID
		}
		if op.Request.Conv.Key != "" {
			session += ", key " + op.Request.Conv.Key
		}
		name(op.Request.Session, session+">")
		name(op.Request.ChainedFrom, fmt.Sprintf("<response #%d>", len(pairs)/2+1))
	}
	return strings.NewReplacer(pairs...)
}

// writeStepHeader names the step that starts at ops[i]; a burst also
// says in which order its requests were answered.
func writeStepHeader(b *strings.Builder, ops []history.Op, i int) {
	first := ops[i]
	var burst []history.Op
	for _, op := range ops[i:] {
		if op.Step != first.Step {
			break
		}
		burst = append(burst, op)
	}
	fmt.Fprintf(b, "  %d. %s", first.Step, history.Title(ops, i))
	if first.Earlier != (plan.Origin{}) {
		fmt.Fprintf(b, " (a step of %s)", first.Earlier)
	}
	b.WriteString("\n")
	if len(burst) < 2 {
		return
	}
	byReturn := slices.Clone(burst)
	slices.SortFunc(byReturn, func(x, y history.Op) int { return cmp.Compare(x.Turn.Return, y.Turn.Return) })
	answered := make([]string, len(byReturn))
	for k, op := range byReturn {
		answered[k] = string(rune('a' + op.Index))
	}
	fmt.Fprintf(b, "     sent at once, in order %s; answered in order %s\n",
		strings.Join(letters(len(burst)), ", "), strings.Join(answered, ", "))
}

func letters(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = string(rune('a' + i))
	}
	return out
}

func writeOp(b *strings.Builder, op history.Op, p targets.Profile, replicated bool) {
	if op.Restart != nil {
		fmt.Fprintf(b, "     %s", op.Restart)
		if op.Response.Detail != "" {
			fmt.Fprintf(b, ": %s", op.Response.Detail)
		}
		b.WriteString("\n")
		return
	}
	fmt.Fprintf(b, "     %s) on %s", string(rune('a'+op.Index)), op.Request.Conv)
	if op.Send.Token != "" {
		fmt.Fprintf(b, ", message %s", op.Send.Token)
	}
	acp := p.Protocol == targets.ACP
	switch {
	case acp:
		b.WriteString(", a prompt") // ACP's turns all stream: it says nothing
	case op.Request.Stream:
		b.WriteString(", streamed")
	}
	switch {
	case op.Served != nil:
		// Behind a front, which picked it.
		fmt.Fprintf(b, ", served by replica %d", *op.Served)
	case replicated:
		fmt.Fprintf(b, ", to replica %d", op.Send.Replica)
	}
	send := op.Send
	send.Net = nil
	fmt.Fprintf(b, "\n        model does: %s\n", send.In(p.Protocol))
	if f := op.Send.Net; f != nil {
		// What the harness did to the replica's link, and whether it did.
		what := op.Net
		if what == "" {
			what = "not applied: the turn never reached the model"
		}
		fmt.Fprintf(b, "        network: %s, from the turn's first model call to its end: %s\n", f, what)
	}
	fmt.Fprintf(b, "        outcome: %s", op.Response.Outcome)
	if op.Response.Status != 0 && !acp {
		// An ACP answer has no status: what the harness read it as is
		// its own business.
		fmt.Fprintf(b, " (status %d)", op.Response.Status)
	}
	if op.Response.Detail != "" {
		fmt.Fprintf(b, ": %s", op.Response.Detail)
	} else if op.Response.Reply != "" {
		fmt.Fprintf(b, ": reply %q", model.WithoutCallMarks(op.Response.Reply))
	}
	b.WriteString("\n")
	if len(op.Turn.Calls)+len(op.Turn.Aux) == 0 {
		b.WriteString("        model saw: " + noCall(op) + "\n")
	}
	for _, c := range op.Turn.Calls {
		fmt.Fprintf(b, "        model saw: %s\n", model.FormatTokens(c.History))
		if len(c.Tools) > 0 {
			fmt.Fprintf(b, "          tool traffic: %s\n", formatTools(c.Tools))
		}
	}
	for _, c := range op.Turn.Aux {
		fmt.Fprintf(b, "        model saw, beside the turn (a title, a summary): %s\n", model.FormatTokens(c.History))
	}
	for _, r := range op.Turn.Runs {
		fmt.Fprintf(b, "        tool run: %s (tick %d)\n", r.ID, r.At)
	}
	if op.Turn.Interrupted || op.Turn.Abandoned {
		fmt.Fprintf(b, "        interrupted: %s\n", interruption(op))
	}
	if op.Request.Replay != nil {
		fmt.Fprintf(b, "        session/load replayed: %s\n", model.FormatTokens(op.Request.Replay))
	}
	for _, br := range op.Response.Breaches {
		fmt.Fprintf(b, "        breach: %s\n", br)
	}
	if acp {
		for _, line := range op.Request.Setup {
			fmt.Fprintf(b, "        -> agent: %s\n", line)
		}
	}
	fmt.Fprintf(b, "        %s\n", curlCommand(op.Request, p))
	if acp && op.Response.Cancelled && op.Request.Session != "" {
		fmt.Fprintf(b, "        -> agent: %s\n", protocol.RPCLine("session/cancel", map[string]string{"sessionId": op.Request.Session}))
	}
	if op.Request.A2A() && op.Response.Cancelled && op.Response.ID != "" {
		// The client's tasks/cancel, as it went, beside the message.
		cancel := protocol.Request{Conv: op.Request.Conv, Path: op.Request.Path, Body: protocol.RPCBody("tasks/cancel", map[string]string{"id": op.Response.ID}), Named: op.Request.Named}
		fmt.Fprintf(b, "        then %s\n", curlCommand(cancel, p))
	}
}

// noCall says that the model received no call of op's turn: none at
// all, or, where the reply the client got names a call of the model's
// ([call N]), one that carried none of the check's messages.
func noCall(op history.Op) string {
	switch {
	case strings.Contains(op.Response.Reply, "[call "):
		return "no call that carried this check's messages (the reply names a call of the model's: one that carried none of them)"
	case strings.Contains(op.Response.Reply, model.NoTokenReply):
		return "no call that carried this check's messages (the reply is the model's answer to a call that carried no message with a token: one was made)"
	}
	return "no call"
}

// curlCommand is a shell command that sends r.
func curlCommand(r protocol.Request, p targets.Profile) string {
	if r.Unsent != "" {
		return "(not sent: " + r.Unsent + ")"
	}
	if p.Protocol == targets.ACP {
		// Stdio has no URL to send to: the line the agent was written.
		return "-> agent: " + string(r.Body)
	}
	path, method := cmp.Or(r.Path, "/v1/chat/completions"), cmp.Or(r.Method, "POST")
	parts := []string{`curl -sS -N "$TURNCHECK_URL` + path + `"`, "-H 'Content-Type: application/json'"}
	if method != "POST" {
		parts = append(parts, "-X "+method)
	}
	if r.Conv.ID != "" && r.Path == "" && r.Named == nil {
		// A request saved before it kept its headers as sent.
		parts = append(parts, "-H "+ShellQuote(p.HeaderName()+": "+r.Conv.ID))
	}
	for _, h := range slices.Sorted(maps.Keys(r.Named)) {
		// The header that named the server's conversation, as sent.
		parts = append(parts, "-H "+ShellQuote(h+": "+r.Named[h]))
	}
	if r.Conv.Key != "" {
		parts = append(parts, "-H "+ShellQuote("Authorization: Bearer "+r.Conv.Key))
	}
	parts = append(parts, "-d "+ShellQuote(string(r.Body)))
	return strings.Join(parts, " ")
}

// ShellQuote is s as one word of a POSIX shell command line, in single
// quotes.
func ShellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Stats counts what a run did.
type Stats struct {
	// Checks is how many state-machine runs were executed.
	Checks int `json:"checks"`
	// Steps is how many requests were sent.
	Steps int `json:"steps"`
	// Faults counts the injected faults by kind: those that took effect,
	// the turn having got as far as the point each was drawn for.
	Faults map[string]int `json:"faults"`
	// Unreached counts by kind the faults drawn for turns that ended
	// before the point each was drawn for (refused, or failed, before the
	// model call it was to hit): drawn, never injected.
	Unreached map[string]int `json:"unreached,omitempty"`
	// Drawn counts what the run carried out, by action and by fault that
	// took effect (history.Op.Drawn): what a baseline's finding must see
	// drawn before it can be called fixed.
	Drawn map[string]int `json:"drawn,omitempty"`
	// Outcomes counts the turns' outcomes: ok, fail, unknown.
	Outcomes map[string]int `json:"outcomes"`
	// Invariants counts how often each invariant was evaluated.
	Invariants map[model.Invariant]int `json:"invariants"`
	// ShrinkRuns counts the runs replayed to shrink a failure.
	ShrinkRuns int `json:"shrinkRuns"`
	// Evictions counts the turns that found their conversation forgotten
	// by a server that forgets, and started over (model.Model.Evictions).
	Evictions int `json:"evictions,omitempty"`
	// Auxiliary counts the model calls a server made beside its turns (a
	// title, a summary), set apart from the turns' histories
	// (model.Turn.SplitAuxiliary).
	Auxiliary int `json:"auxiliary,omitempty"`
	// SetAside counts violations of skipped invariants (Options.Skip),
	// whose conversations were set aside.
	SetAside map[model.Invariant]int `json:"setAside,omitempty"`
	// Consequences counts what was seen of a violation already found
	// (its conversations, their tokens elsewhere), by the invariant it
	// would otherwise have been named under: one root cause, one FAIL.
	Consequences map[model.Invariant]int `json:"consequences,omitempty"`
	// SameCause counts violations of a kind of wrong state already found
	// (model.Kind), by the invariant that named them: one root cause.
	SameCause map[model.Invariant]int `json:"sameCause,omitempty"`
	// Folded is, for each invariant counted in SameCause, the first such
	// violation seen: an example of what was folded into a finding.
	Folded map[model.Invariant]model.Violation `json:"folded,omitempty"`
	// Causes counts the turns that did not end ok by why (Response.Cause).
	Causes map[string]int `json:"causes,omitempty"`
	// TimeMS says where the run's wall time went, in milliseconds: starting
	// servers, restarts and crashes, waiting for a server to come to
	// rest, quiet periods given a server that reports no activity, held
	// calls left to the server's own model timeout, shrinking; the rest
	// went to the turns themselves.
	TimeMS map[string]int64 `json:"timeMs,omitempty"`
	// Shrinking names, while a failure is being shrunk, its invariant and
	// how many steps it is down to: what a progress line shows. "" once
	// it is done.
	Shrinking string `json:"-"`
	// FirstAnswers are the first few answers of the server that were not
	// ok and not a fault the harness injected, for a run where nothing
	// works.
	FirstAnswers []string `json:"firstAnswers,omitempty"`
	// Uninjected counts the turns with a user message that did not end ok
	// for a cause the harness did not inject (no fault drawn took effect,
	// no abort, no broken link), by cause; UninjectedSaid keeps the first
	// detail the server gave for each: what failed the run's turns
	// (Warnings).
	Uninjected     map[string]int    `json:"uninjected,omitempty"`
	UninjectedSaid map[string]string `json:"uninjectedSaid,omitempty"`
	// Pace says what the server cost, as measured (execute.Pace), where
	// a start, restart or step cost a second or more: said for a person
	// planning a run, never acted on. Ration is the most a check rationed
	// its restarts (1 in Ration carried out), RestartShare the share of
	// the steps drawn that the profile allows them
	// (server.restart_share); Rationed counts the restarts drawn that
	// gave way to a turn, and Steered the steps drawn that gave way to
	// one that exercises what its check had not yet.
	Pace         string  `json:"pace,omitempty"`
	Ration       int     `json:"ration,omitempty"`
	RestartShare float64 `json:"restartShare,omitempty"`
	Rationed     int     `json:"rationed,omitempty"`
	Steered      int     `json:"steered,omitempty"`
}

// CountUninjected counts a turn not ended ok for cause, which the harness
// did not inject, the server saying detail.
func (s *Stats) CountUninjected(cause, detail string) {
	if s.Uninjected == nil {
		s.Uninjected, s.UninjectedSaid = map[string]int{}, map[string]string{}
	}
	s.Uninjected[cause]++
	if _, ok := s.UninjectedSaid[cause]; !ok && detail != "" && detail != cause {
		s.UninjectedSaid[cause] = protocol.ClipText(detail, 160)
	}
}

// MaxFirstAnswers bounds Stats.FirstAnswers.
const MaxFirstAnswers = 3

// NewStats returns empty Stats, every count ready to add to.
func NewStats() *Stats {
	return &Stats{Faults: map[string]int{}, Unreached: map[string]int{}, Outcomes: map[string]int{}, Invariants: map[model.Invariant]int{},
		SetAside: map[model.Invariant]int{}, Consequences: map[model.Invariant]int{}, SameCause: map[model.Invariant]int{},
		Causes: map[string]int{}, TimeMS: map[string]int64{}, Drawn: map[string]int{}}
}

// Summary renders the counts on a few lines.
func (s *Stats) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "checks: %d, requests: %d", s.Checks, s.Steps)
	// Turns that failed did so mostly as the faults drawn asked: not
	// failures of the check.
	fmt.Fprintf(&b, " (turns ok %d, answered with an error %d, outcome unknown %d)\n",
		s.Outcomes["ok"], s.Outcomes["fail"], s.Outcomes["unknown"])
	faults, shapes := map[string]int{}, map[string]int{}
	for k, v := range s.Faults {
		if name, ok := drawnShapes[k]; ok {
			shapes[name] = v
		} else {
			faults[k] = v
		}
	}
	b.WriteString("faults injected: ")
	b.WriteString(countList(faults))
	if len(s.Unreached) > 0 {
		b.WriteString("\nfaults drawn, not reached (the turn ended before the point each was drawn for): ")
		b.WriteString(countList(s.Unreached))
	}
	if len(shapes) > 0 {
		b.WriteString("\nalso drawn: ")
		b.WriteString(countList(shapes))
	}
	if s.Auxiliary > 0 {
		fmt.Fprintf(&b, "\nauxiliary model calls (made beside a turn, judged for isolation and tool pairs, not as its history): %d", s.Auxiliary)
	}
	b.WriteString("\ninvariants checked: ")
	b.WriteString(invariantList(s.Invariants, true))
	for _, line := range []struct {
		label  string
		counts map[model.Invariant]int
	}{
		{"skipped invariants broken again (conversations set aside; a server that went down started again)", s.SetAside},
		{"the same wrong state as a finding, under other names (one root cause)", s.SameCause},
		{"also seen, as consequences of a violation already found (not counted as findings)", s.Consequences},
	} {
		if len(line.counts) > 0 {
			fmt.Fprintf(&b, "\n%s: %s", line.label, invariantList(line.counts, false))
		}
	}
	if len(s.Causes) > 0 {
		b.WriteString("\nturns not ok, by cause: ")
		b.WriteString(countList(s.Causes))
	}
	if len(s.TimeMS) > 0 {
		// Checks run at once each count their own time: the sums may
		// pass the run's wall time.
		b.WriteString("\ntime spent (summed over the checks): ")
		parts := []string{}
		for _, k := range slices.Sorted(maps.Keys(s.TimeMS)) {
			parts = append(parts, fmt.Sprintf("%s %s", k, (time.Duration(s.TimeMS[k])*time.Millisecond).Round(10*time.Millisecond)))
		}
		b.WriteString(strings.Join(parts, ", "))
	}
	if s.Pace != "" {
		b.WriteString("\npace: " + s.Pace)
	}
	if s.Ration > 1 {
		fmt.Fprintf(&b, "\nrestarts: carried out 1 in %d times drawn, to keep restarts and crashes to at most %g of the steps drawn (server.restart_share), %d given way to a turn; %d step(s) steered towards what their check had not exercised yet",
			s.Ration, s.RestartShare, s.Rationed, s.Steered)
	}
	for _, w := range s.Warnings() {
		b.WriteString("\nWARNING: " + w)
	}
	return b.String()
}

// drawnShapes are the counts of Stats.Faults that are shapes of traffic,
// not faults, by the name a summary gives them.
var drawnShapes = map[string]string{"concurrency": "bursts", "tool-turn": "tool turns"}

// invariantList renders counts by invariant in the contract's order (T1,
// T2, ... T11, crash), with titles if asked.
func invariantList(m map[model.Invariant]int, titled bool) string {
	var parts []string
	for _, inv := range Judged() {
		if n, ok := m[inv]; ok {
			name := string(inv)
			if titled {
				name += " " + inv.Title()
			}
			parts = append(parts, fmt.Sprintf("%s %d", name, n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// weakCauses are the causes of an unknown outcome the harness did not
// inject, each with what it likely means.
var weakCauses = map[string]string{
	protocol.CauseNoStop:                          `the server's streams end with [DONE] but no chunk carries finish_reason "stop": the contract counts such a turn as unknown, so little can be judged`,
	protocol.CauseNoDone:                          "the server's streams end, or break, without data: [DONE]",
	protocol.CauseTimedOut:                        "the server takes requests and never answers them",
	protocol.CauseMalformed:                       "the server sends chunks that are not chat.completion.chunk JSON",
	protocol.CauseNoBody:                          "the server answers 200 without a chat.completion body",
	protocol.CauseRefused:                         "the server refuses connections",
	protocol.CauseNoAnswer:                        "the server drops connections without an answer",
	"stream never ended within the client's time": "the server's streams never end",
	protocol.CauseRunEnded:                        "no response had ended when the run's time bound did: the server's responses may never end",
}

// Warnings say why a run is weak, whatever its verdicts: no turn ended ok,
// unknown outcomes the harness did not inject dominate, or one refusal
// does. Each names the likely cause.
func (s *Stats) Warnings() []string {
	if s.Steps == 0 {
		return nil
	}
	var out []string
	if s.Outcomes["ok"] == 0 {
		w := fmt.Sprintf("no turn of %d ended ok: nothing committed could be checked. Check that the server calls the model URL "+
			"it was given (the fake model's), accepts the keys and the model name the profile gives, and reads the conversation "+
			"from the header the profile names", s.Steps)
		if len(s.FirstAnswers) > 0 {
			w += "; its first answers: " + strings.Join(s.FirstAnswers, "; ")
		}
		out = append(out, w)
	}
	weak, why := 0, map[string]int{}
	for c, n := range s.Causes {
		if _, ok := weakCauses[c]; ok {
			weak += n
			why[c] = n
		}
	}
	if weak*5 > s.Steps {
		var hints []string
		for _, c := range slices.Sorted(maps.Keys(why)) {
			hints = append(hints, fmt.Sprintf("%s (%d): %s", c, why[c], weakCauses[c]))
		}
		out = append(out, fmt.Sprintf("%d of %d turns (%d%%) ended unknown for reasons the harness did not inject: %s",
			weak, s.Steps, 100*weak/s.Steps, strings.Join(hints, "; ")))
	}
	for c, n := range s.Causes {
		if strings.HasPrefix(c, "status 4") && c != "status 400" && c != "status 409" && n*2 > s.Steps {
			out = append(out, fmt.Sprintf("%d of %d turns were refused with %s: check the keys, the model name and the conversation header the profile gives", n, s.Steps, c))
		}
	}
	// Every cause the harness did not inject that failed a large share
	// (a tenth) of the turns, with what the server said, and the profile
	// field that would change it, where one does.
	for _, c := range slices.Sorted(maps.Keys(s.Uninjected)) {
		n := s.Uninjected[c]
		if n*10 < s.Steps || weakCauses[c] != "" {
			continue
		}
		w := fmt.Sprintf("%d of %d turns did not end ok for a cause the harness did not inject: %s", n, s.Steps, c)
		if said := s.UninjectedSaid[c]; said != "" {
			w += fmt.Sprintf(" (%q)", said)
		}
		if hint := profileHint(c, s.UninjectedSaid[c]); hint != "" {
			w += "; " + hint
		}
		out = append(out, w)
	}
	return out
}

// profileHint names the profile field that would change what failed
// turns for cause, the server saying said, where one does.
func profileHint(cause, said string) string {
	lower := strings.ToLower(said)
	switch {
	case strings.Contains(lower, "conversation") && (strings.Contains(lower, "unrecognized") || strings.Contains(lower, "unknown")):
		return "a server that does not take the conversation parameter declares no responses.named_by: conversation"
	case strings.Contains(lower, "store"):
		return "a server that ignores store: false declares responses.store_false: ignored"
	case strings.Contains(lower, "superseded") || strings.Contains(cause, "stopReason cancelled"):
		return "an agent that cancels the running prompt for the next one by design declares policies.concurrency: supersede"
	case cause == "status 409":
		return "a server that refuses a request on a busy conversation by design declares policies.concurrency: reject"
	case strings.Contains(lower, "previous") && strings.Contains(lower, "not found"):
		return "a server whose response ids do not outlive a restart declares responses.ids_survive_restart: false"
	case cause == "status 401" || cause == "status 403":
		return "check keys"
	}
	return ""
}

func countList(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// formatTools renders a call's tool traffic: "call ID", "result ID" and
// "user" for each user message, in message order.
func formatTools(events []model.ToolEvent) string {
	parts := make([]string, len(events))
	for i, e := range events {
		parts[i] = string(e.Kind)
		if e.ID != "" {
			parts[i] += " " + e.ID
		}
	}
	return strings.Join(parts, ", ")
}

// interruption says what became of what the server waited on for a turn
// whose client dropped the connection: the model held it, unanswered,
// until the server gave up on it or the harness let go of it.
func interruption(op history.Op) string {
	t := op.Turn
	if op.Response.Preempted {
		return "the agent cancelled the prompt itself when the next prompt of the session came, as it declares it does (supersede)"
	}
	if t.Abandoned {
		return "the client's own time ran out, and it closed the connection, at no point the harness chose"
	}
	if !op.Send.Abort && op.Response.Cancelled {
		return "the client cancelled the prompt (session/cancel) at the end of its time, or with another prompt of the session; the model did not hold the turn for it"
	}
	s := "the client dropped the connection"
	switch {
	case op.Request.ACP():
		s = "the client cancelled the prompt (session/cancel)"
	case op.Send.DropsTask():
		s = "the client dropped the task's connection"
	case op.Send.TaskAbort == plan.AbortCancel:
		s = "the client cancelled the task (tasks/cancel)"
	}
	if t.Dropped != 0 {
		s += fmt.Sprintf(" at tick %d, and from then the model answered nothing of the turn", t.Dropped)
	}
	if t.Released != 0 {
		return s + fmt.Sprintf(" until the harness let go of what the server still waited on at tick %d", t.Released)
	}
	return s + "; the server gave up on all of it"
}
