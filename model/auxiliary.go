package model

import (
	"regexp"
	"slices"
	"strconv"
)

// A server may make model calls of its own while a turn runs, beside the
// ones that lead to the turn's answer: a title for the conversation, a
// summary, a memory extraction, a guardrail check (PROTOCOL.md,
// "Auxiliary model calls"). Such a call carries the turn's user message,
// so it names the turn, but not the history the turn runs on: judged as
// the turn's, it would read as history lost (T2) or as a second line
// (T4). A turn's own calls are those that led to the answer its client
// received; the others are auxiliary, checked for isolation (T5) and tool
// pairs (T9), never as the turn's history.

// markPattern matches a call's mark (CallMark) in a reply, with the space
// before it.
var markPattern = regexp.MustCompile(` ?\[call ([0-9]+)\]`)

// CallMark is the mark the fake model writes in its reply to the call that
// reached it at at (Call.At): the harness reads it in the answer the
// client received, to tell which call's reply that was.
func CallMark(at int64) string { return "[call " + strconv.FormatInt(at, 10) + "]" }

// NoTokenReply is what the fake model answers a call that carries no
// turn token: a reply the harness can tell in an answer even where the
// call was not recorded (it carried no message of the check's).
const NoTokenReply = "no new user message with a turn token to reply to"

// WithoutCallMarks is text without the call marks in it (CallMark), nor
// the space before each: what a reply says, whichever call wrote it.
func WithoutCallMarks(text string) string { return markPattern.ReplaceAllString(text, "") }

// endsWithMark matches text that ends with a call's mark, as the fake
// model ends each reply: the mark, then a full stop.
var endsWithMark = regexp.MustCompile(`\[call [0-9]+\]\.?\s*$`)

// EndsWithCallMark reports whether text ends as a whole reply of the fake
// model does: with the mark of the call it answers (CallMark). A reply cut
// short has no mark, and one an agent added an error text after does not
// end with it.
func EndsWithCallMark(text string) bool { return endsWithMark.MatchString(text) }

// answeredBy is when the calls whose marks text carries reached the model.
func answeredBy(text string) []int64 {
	var out []int64
	for _, m := range markPattern.FindAllStringSubmatch(text, -1) {
		if at, err := strconv.ParseInt(m[1], 10, 64); err == nil {
			out = append(out, at)
		}
	}
	return out
}

// titleShaped reports whether c shows user messages alone and offers the
// model no tools, as a title call does. Where it came before the turn's
// client left (the model holds a turn's first arrival, whichever it is),
// in a turn that names no answer, it is taken for a call made beside the
// turn, before any title was learned: the turn's own call shows the
// replies of the history it runs on, and the tools the server offers,
// and was perhaps never sent. A server that lost the replies shows it in
// the turns that follow; what the turn starts after its client left is
// judged whatever its shape.
func titleShaped(c Call) bool {
	return !c.Offers && len(c.History) > 0 && !slices.ContainsFunc(c.History, func(tok Token) bool { return !tok.IsUser() })
}

// SplitAuxiliary moves t's auxiliary calls from Calls to Aux, and returns
// the instructions (Call.Prompt) it learned to be auxiliary calls'. known
// reports those learned before (nil: none).
//
// Of the calls that carry t's user token, the one whose reply reached the
// client (its mark is in Reply) is the answer's. Without one (the turn
// failed, was cut, or its client left), a call with an instruction known
// to be an auxiliary call's is one, and of the others the answer's call is
// the one that showed the model the most, one that offered tools before
// one that did not, the earliest of those. The calls that lead to the
// answer's share its instruction and show the model a prefix of what it
// showed (a tool loop grows its history; a retried call shows the same):
// they are the turn's own. Any other call carrying t's token was made
// beside the turn, and is auxiliary; where the answer's call was known by
// its mark, the instruction of each such call is learned. A server that
// lost the turn's history shows that loss in the answer's own call, which
// stays the turn's.
func (t *Turn) SplitAuxiliary(known func(prompt uint32) bool) (learned []uint32) {
	if !t.Usable {
		return nil
	}
	anchor := -1
	longer := func(c Call) bool {
		a := t.Calls[anchor]
		return len(c.History) > len(a.History) || len(c.History) == len(a.History) && c.Offers && !a.Offers
	}
	for _, at := range answeredBy(t.Reply) {
		for i, c := range t.Calls {
			if c.Turn == t.User && c.At == at && (anchor < 0 || longer(c)) {
				anchor = i
			}
		}
	}
	marked := anchor >= 0
	auxiliary := func(c Call) bool {
		return !marked && (known != nil && known(c.Prompt) || t.Interrupted && c.At <= t.Dropped && titleShaped(c))
	}
	if !marked {
		for i, c := range t.Calls {
			if c.Turn == t.User && !auxiliary(c) && (anchor < 0 || longer(c)) {
				anchor = i
			}
		}
	}
	own := t.Calls[:0:0]
	for i, c := range t.Calls {
		switch {
		case c.Turn != t.User:
			own = append(own, c)
		case anchor < 0 || auxiliary(c):
			t.Aux = append(t.Aux, c)
		case i == anchor:
			own = append(own, c)
		default:
			a := t.Calls[anchor]
			if c.Prompt == a.Prompt && len(c.History) <= len(a.History) && slices.Equal(c.History, a.History[:len(c.History)]) {
				own = append(own, c)
				continue
			}
			t.Aux = append(t.Aux, c)
			if marked && c.Prompt != a.Prompt && !slices.Contains(learned, c.Prompt) {
				learned = append(learned, c.Prompt)
			}
		}
	}
	t.Calls = own
	return learned
}
