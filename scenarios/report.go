package scenarios

import (
	"fmt"
	"sort"
	"strings"

	"github.com/turncheck/turncheck/model"
)

// FormatFailure renders a violation and the steps that led to it for a
// person: the broken invariant first, then each step with its request, the
// injected fault, the outcome, what the model saw, and a curl command that
// sends the same request by hand.
func FormatFailure(v *model.Violation, steps []Step, p Profile) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", v.Error())
	fmt.Fprintf(&b, "%d step(s):\n", len(steps))
	for _, s := range steps {
		writeStep(&b, s, p)
	}
	b.WriteString("\nThe curl commands send each request again to the server at $TURNCHECK_URL; they do not\n" +
		"inject the model's faults: replay the seed for those.\n")
	return b.String()
}

func writeStep(b *strings.Builder, s Step, p Profile) {
	fmt.Fprintf(b, "  %d. %s on %s", s.N, s.Action, s.Request.Conv)
	if s.Token != "" {
		fmt.Fprintf(b, ", message %s", s.Token)
	}
	if s.Request.Stream {
		b.WriteString(", streamed")
	}
	fmt.Fprintf(b, "\n     fault: %s\n", s.Fault)
	fmt.Fprintf(b, "     outcome: %s", s.Outcome)
	if s.Status != 0 {
		fmt.Fprintf(b, " (status %d)", s.Status)
	}
	if s.Detail != "" {
		fmt.Fprintf(b, ": %s", s.Detail)
	} else if s.Reply != "" {
		fmt.Fprintf(b, ": reply %q", s.Reply)
	}
	b.WriteString("\n")
	if len(s.Calls) == 0 {
		b.WriteString("     model saw: no call\n")
	}
	for _, c := range s.Calls {
		fmt.Fprintf(b, "     model saw: %s\n", model.FormatTokens(c.History))
	}
	fmt.Fprintf(b, "     %s\n", curlCommand(s.Request, p))
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
	// Checks is how many state-machine runs were executed, shrinking
	// included.
	Checks int
	// Steps is how many requests were sent.
	Steps int
	// Faults counts the injected faults by kind.
	Faults map[string]int
	// Outcomes counts the turns' outcomes: ok, fail, unknown.
	Outcomes map[string]int
	// Invariants counts how often each invariant was evaluated.
	Invariants map[model.Invariant]int
}

func newStats() *Stats {
	return &Stats{Faults: map[string]int{}, Outcomes: map[string]int{}, Invariants: map[model.Invariant]int{}}
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
