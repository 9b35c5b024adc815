package scenarios

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/turncheck/turncheck/model"
)

// FormatFailure renders a violation and the history that led to it for a
// person: the broken invariant first, then each step with its requests
// (several for a burst, with the order in which they were sent and
// answered), the injected faults, the outcomes, what the model saw, and a
// curl command that sends each request by hand.
func FormatFailure(v *model.Violation, history []Op, p Profile) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", v.Error())
	steps := 0
	if len(history) > 0 {
		steps = history[len(history)-1].Step - history[0].Step + 1
	}
	fmt.Fprintf(&b, "%d step(s), %d request(s):\n", steps, len(history))
	for i, op := range history {
		if i == 0 || op.Step != history[i-1].Step {
			writeStepHeader(&b, history, i)
		}
		writeOp(&b, op, p)
	}
	b.WriteString("\nThe curl commands send each request again to the server at $TURNCHECK_URL; they do not\n" +
		"inject the model's faults: replay the saved failure for those.\n")
	return b.String()
}

// writeStepHeader names the step that starts at history[i]; a burst also
// says in which order its requests were answered.
func writeStepHeader(b *strings.Builder, history []Op, i int) {
	first := history[i]
	var burst []Op
	for _, op := range history[i:] {
		if op.Step != first.Step {
			break
		}
		burst = append(burst, op)
	}
	fmt.Fprintf(b, "  %d. %s\n", first.Step, first.Action)
	if len(burst) < 2 {
		return
	}
	byReturn := slices.Clone(burst)
	slices.SortFunc(byReturn, func(x, y Op) int { return cmp.Compare(x.Turn.Return, y.Turn.Return) })
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

func writeOp(b *strings.Builder, op Op, p Profile) {
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
	if op.Request.Stream {
		b.WriteString(", streamed")
	}
	fmt.Fprintf(b, "\n        model does: %s\n", op.Send)
	fmt.Fprintf(b, "        outcome: %s", op.Response.Outcome)
	if op.Response.Status != 0 {
		fmt.Fprintf(b, " (status %d)", op.Response.Status)
	}
	if op.Response.Detail != "" {
		fmt.Fprintf(b, ": %s", op.Response.Detail)
	} else if op.Response.Reply != "" {
		fmt.Fprintf(b, ": reply %q", op.Response.Reply)
	}
	b.WriteString("\n")
	if len(op.Turn.Calls) == 0 {
		b.WriteString("        model saw: no call\n")
	}
	for _, c := range op.Turn.Calls {
		fmt.Fprintf(b, "        model saw: %s\n", model.FormatTokens(c.History))
		if len(c.Tools) > 0 {
			fmt.Fprintf(b, "          tool traffic: %s\n", formatTools(c.Tools))
		}
	}
	for _, r := range op.Turn.Runs {
		fmt.Fprintf(b, "        tool run: %s (at %d)\n", r.ID, r.At)
	}
	if op.Turn.Interrupted {
		fmt.Fprintf(b, "        interrupted: what the server still waited on was let go at %d, after the client dropped the connection\n", op.Turn.Released)
	}
	fmt.Fprintf(b, "        %s\n", curlCommand(op.Request, p))
}

// curlCommand is a shell command that sends r.
func curlCommand(r Request, p Profile) string {
	parts := []string{`curl -sS -N "$TURNCHECK_URL/v1/chat/completions"`, "-H 'Content-Type: application/json'"}
	if r.Conv.ID != "" {
		parts = append(parts, "-H "+shellQuote(p.header()+": "+r.Conv.ID))
	}
	if r.Conv.Key != "" {
		parts = append(parts, "-H "+shellQuote("Authorization: Bearer "+r.Conv.Key))
	}
	parts = append(parts, "-d "+shellQuote(string(r.Body)))
	return strings.Join(parts, " ")
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Stats counts what a run did.
type Stats struct {
	// Checks is how many state-machine runs were executed.
	Checks int `json:"checks"`
	// Steps is how many requests were sent.
	Steps int `json:"steps"`
	// Faults counts the injected faults by kind.
	Faults map[string]int `json:"faults"`
	// Outcomes counts the turns' outcomes: ok, fail, unknown.
	Outcomes map[string]int `json:"outcomes"`
	// Invariants counts how often each invariant was evaluated.
	Invariants map[model.Invariant]int `json:"invariants"`
	// ShrinkRuns counts the runs replayed to shrink a failure.
	ShrinkRuns int `json:"shrinkRuns"`
	// SetAside counts violations of skipped invariants (Options.Skip),
	// whose conversations were set aside.
	SetAside map[model.Invariant]int `json:"setAside,omitempty"`
}

func newStats() *Stats {
	return &Stats{Faults: map[string]int{}, Outcomes: map[string]int{}, Invariants: map[model.Invariant]int{},
		SetAside: map[model.Invariant]int{}}
}

// Summary renders the counts on a few lines.
func (s *Stats) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "checks: %d, steps: %d", s.Checks, s.Steps)
	fmt.Fprintf(&b, " (ok %d, fail %d, unknown %d)\n", s.Outcomes["ok"], s.Outcomes["fail"], s.Outcomes["unknown"])
	b.WriteString("faults injected: ")
	b.WriteString(countList(s.Faults))
	b.WriteString("\ninvariants checked: ")
	inv := map[string]int{}
	for k, v := range s.Invariants {
		inv[string(k)+" "+k.Title()] = v
	}
	b.WriteString(countList(inv))
	if len(s.SetAside) > 0 {
		aside := map[string]int{}
		for k, v := range s.SetAside {
			aside[string(k)] = v
		}
		b.WriteString("\nskipped invariants broken again (conversations set aside): ")
		b.WriteString(countList(aside))
	}
	return b.String()
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
