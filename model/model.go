package model

import (
	"fmt"
	"slices"
	"strings"
)

// Invariant names one of the properties of PROTOCOL.md.
type Invariant string

// The invariants this package checks.
const (
	T1 Invariant = "T1" // atomic turns
	T2 Invariant = "T2" // committed turns stay
	T3 Invariant = "T3" // no replay
	T5 Invariant = "T5" // isolation
	T6 Invariant = "T6" // unknown outcomes
)

var invariantTitles = map[Invariant]string{
	T1: "atomic turns",
	T2: "committed turns stay",
	T3: "no replay",
	T5: "isolation",
	T6: "unknown outcomes",
}

// Title is the invariant's short name, as PROTOCOL.md gives it.
func (i Invariant) Title() string { return invariantTitles[i] }

// Invariants lists the invariants this package checks, in order.
func Invariants() []Invariant { return []Invariant{T1, T2, T3, T5, T6} }

// Violation is a broken invariant: which one, on which conversation, why,
// and the token sequences that show it.
type Violation struct {
	Invariant Invariant
	Conv      ConversationRef
	// Turn is the user token of the turn during which it was seen.
	Turn   Token
	Reason string
	// Expected and Observed are histories as token sequences; Expected is
	// nil where no single history was expected.
	Expected []Token
	Observed []Token
}

// Error says which invariant broke, where, why, and shows the expected and
// observed histories.
func (v *Violation) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s) violated on conversation %s", v.Invariant, v.Invariant.Title(), v.Conv)
	if v.Turn != "" {
		fmt.Fprintf(&b, ", turn %s", v.Turn)
	}
	fmt.Fprintf(&b, ": %s", v.Reason)
	if v.Expected != nil {
		fmt.Fprintf(&b, "\n  expected: %s", FormatTokens(v.Expected))
	}
	if v.Observed != nil {
		fmt.Fprintf(&b, "\n  observed: %s", FormatTokens(v.Observed))
	}
	return b.String()
}

// FormatTokens renders a token sequence for people: space-separated, or
// "(empty)".
func FormatTokens(ts []Token) string {
	if len(ts) == 0 {
		return "(empty)"
	}
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = string(t)
	}
	return strings.Join(s, " ")
}

// Turn is one request the client sent on a conversation and what came of it.
type Turn struct {
	Conv ConversationRef
	// User is the token of the request's new user message. It is reused
	// only when the client retries a failed turn.
	User Token
	// Usable reports whether the request carried a usable new user message
	// (PROTOCOL.md); a request without one must be refused (T3).
	Usable  bool
	Outcome Outcome
	// Status is the HTTP status the client got, 0 if none.
	Status int
	// Reply is the assistant text the client received.
	Reply string
	// Calls are the model requests the server made while the turn ran.
	Calls []Call
}

// segment is one turn in a conversation's line: its user message and its
// reply. A pending segment is a turn with an unknown outcome, not resolved yet.
type segment struct {
	user    Token
	pending bool
}

type conversation struct {
	segs []segment
}

// Model is the reference state of every conversation the client has touched.
// The zero value is not ready; use New.
type Model struct {
	convs map[ConversationRef]*conversation
	// owner records which conversation each token was sent on or written
	// for, to tell leaks between conversations (T5).
	owner map[Token]ConversationRef
	// failed holds the user tokens of turns whose latest attempt failed.
	failed map[Token]bool
	// dropped holds the user tokens of unknown turns that later histories
	// showed were not committed: they may never appear again (T6).
	dropped map[Token]bool
	checked map[Invariant]int
}

// New returns a model with no conversations.
func New() *Model {
	return &Model{
		convs:   map[ConversationRef]*conversation{},
		owner:   map[Token]ConversationRef{},
		failed:  map[Token]bool{},
		dropped: map[Token]bool{},
		checked: map[Invariant]int{},
	}
}

// Checked returns how many times each invariant has been evaluated.
func (m *Model) Checked() map[Invariant]int {
	out := make(map[Invariant]int, len(m.checked))
	for k, v := range m.checked {
		out[k] = v
	}
	return out
}

// Committed returns the history the server must hold for c, as far as the
// model knows it: committed turns, and unknown turns not yet resolved.
func (m *Model) Committed(c ConversationRef) []Token {
	conv, ok := m.convs[c]
	if !ok {
		return nil
	}
	return flatten(conv.segs, true)
}

// Apply records turn t and checks every invariant it bears on against the
// model calls the server made during it. It returns the first violation, or
// nil. After a violation the model's state is unspecified.
func (m *Model) Apply(t Turn) *Violation {
	if !t.Usable {
		return m.applyInvalid(t)
	}
	m.owner[t.User] = t.Conv
	m.owner[t.User.Reply()] = t.Conv
	c := m.convs[t.Conv]
	if c == nil {
		c = &conversation{}
		m.convs[t.Conv] = c
	}

	// The first call of the turn resolves the unknown turns before it; every
	// further call (a server's retry of the model call) must carry the very
	// same history.
	var resolved []segment
	reached := false // a call of this turn reached the model
	for _, call := range t.Calls {
		if call.Turn != t.User {
			// An auxiliary call (a title, a summary): not read as history,
			// but it may not mix conversations either.
			if v := m.checkMixed(t, call); v != nil {
				return v
			}
			continue
		}
		m.checked[T1]++
		m.checked[T2]++
		m.checked[T5]++
		if hasPending(c.segs) {
			m.checked[T6]++
		}
		if v := m.checkForeign(t, call); v != nil {
			return v
		}
		segs := c.segs
		if reached {
			segs = resolved
		}
		got, ok := match(segs, call.History, t.User)
		if !ok {
			return m.explain(t, segs, call)
		}
		if !reached {
			// What the first call left out of the unknown turns before it was
			// not committed, and may not appear later, not even in a retry
			// of this very call.
			for _, s := range c.segs {
				if s.pending && !slices.Contains(got, segment{user: s.user}) {
					m.dropped[s.user] = true
				}
			}
		}
		resolved, reached = got, true
	}
	if reached {
		c.segs = resolved
	}

	switch t.Outcome {
	case OK:
		if !reached {
			return &Violation{Invariant: T2, Conv: t.Conv, Turn: t.User,
				Reason: "the turn ended ok, but no model request of this turn was made"}
		}
		if !slices.Contains(Tokens(t.Reply), t.User.Reply()) {
			return &Violation{Invariant: T2, Conv: t.Conv, Turn: t.User,
				Reason:   fmt.Sprintf("the turn ended ok, but the reply the client got (%q) is not the model's reply %s", clip(t.Reply), t.User.Reply()),
				Observed: Tokens(t.Reply)}
		}
		c.segs = append(c.segs, segment{user: t.User})
		delete(m.failed, t.User)
	case Fail:
		m.failed[t.User] = true
	case Unknown:
		c.segs = append(c.segs, segment{user: t.User, pending: true})
		delete(m.failed, t.User)
	}
	return nil
}

func (m *Model) applyInvalid(t Turn) *Violation {
	m.checked[T3]++
	for _, call := range t.Calls {
		if v := m.checkMixed(t, call); v != nil {
			return v
		}
		if reason := m.turnShaped(t.Conv, call); reason != "" {
			return &Violation{Invariant: T3, Conv: t.Conv, Turn: t.User,
				Reason:   "a request without a usable new user message reached the model, " + reason + "; it must be refused with 400",
				Observed: call.History}
		}
	}
	if t.Outcome != Fail || t.Status != 400 {
		return &Violation{Invariant: T3, Conv: t.Conv, Turn: t.User,
			Reason: fmt.Sprintf("a request without a usable new user message ended %s with status %d; want 400", t.Outcome, t.Status)}
	}
	return nil
}

// turnShaped tells a call that runs the refused request as a turn from an
// auxiliary one (a title, a summary, another conversation's background
// work): it carries conv's line, then either an earlier message of conv
// replayed as the new one, or a message with no token (the blank one passed
// on). It returns how, or "" for an auxiliary call.
func (m *Model) turnShaped(conv ConversationRef, call Call) string {
	c := m.convs[conv]
	if c == nil || len(call.History) == 0 {
		return ""
	}
	if owner, ok := m.owner[call.Turn]; ok && owner == conv {
		if _, ok := match(c.segs, call.History, call.Turn); ok {
			return fmt.Sprintf("replaying %s as the new message", call.Turn)
		}
		return ""
	}
	if call.Turn == "" {
		const blank = Token("tc-u-blank") // stands for the tokenless message
		if _, ok := match(c.segs, append(slices.Clone(call.History), blank), blank); ok {
			return "passing on a message without a token as the new one"
		}
	}
	return ""
}

// checkMixed finds a call that carries tokens of more than one conversation
// (T5): whatever the call is for, one conversation leaks into another.
func (m *Model) checkMixed(t Turn, call Call) *Violation {
	var first ConversationRef
	seen := false
	for _, tok := range call.History {
		owner, ok := m.owner[tok]
		switch {
		case !ok:
		case !seen:
			first, seen = owner, true
		case owner != first:
			return &Violation{Invariant: T5, Conv: t.Conv, Turn: t.User,
				Reason: fmt.Sprintf("a model request made during this step carries tokens of conversation %s and of conversation %s (%s)",
					first, owner, tok),
				Observed: call.History}
		}
	}
	return nil
}

// checkForeign finds a token of another conversation in call (T5).
func (m *Model) checkForeign(t Turn, call Call) *Violation {
	for _, tok := range call.History {
		if owner, ok := m.owner[tok]; ok && owner != t.Conv {
			return &Violation{Invariant: T5, Conv: t.Conv, Turn: t.User,
				Reason:   fmt.Sprintf("the model request carries %s, which belongs to conversation %s", tok, owner),
				Expected: expected(m.convs[t.Conv].segs, t.User),
				Observed: call.History}
		}
	}
	return nil
}

// explain says why history does not match segs followed by the turn's user
// token, naming the most specific invariant broken.
func (m *Model) explain(t Turn, segs []segment, call Call) *Violation {
	v := &Violation{Conv: t.Conv, Turn: t.User,
		Expected: expected(segs, t.User), Observed: call.History}
	allowed := map[Token]int{t.User: 1}
	for _, s := range segs {
		allowed[s.user]++
		allowed[s.user.Reply()]++
	}
	seen := map[Token]int{}
	for _, tok := range call.History {
		seen[tok]++
	}
	for _, tok := range call.History {
		if seen[tok] <= allowed[tok] {
			continue
		}
		user := tok.User()
		switch {
		case m.dropped[user]:
			v.Invariant = T6
			v.Reason = fmt.Sprintf("%s belongs to a turn with an unknown outcome that an earlier history showed was not committed; it may not appear later", tok)
		case m.failed[user] && seen[tok] > 1:
			v.Invariant = T1
			v.Reason = fmt.Sprintf("%s, of a turn that failed, appears %d times: a retry must see the last committed history, with no duplicate", tok, seen[tok])
		case m.failed[user]:
			v.Invariant = T1
			v.Reason = fmt.Sprintf("%s, of a turn that failed, reached the model in a later turn: a failed turn must leave the conversation as it was", tok)
		case pendingIn(segs, user):
			v.Invariant = T6
			v.Reason = fmt.Sprintf("%s, of a turn whose outcome was unknown, appears %d times: it may be committed at most once", tok, seen[tok])
		case allowed[tok] > 0 && user != t.User:
			v.Invariant = T2
			v.Reason = fmt.Sprintf("%s, of a committed turn, appears %d times: a committed turn appears exactly once", tok, seen[tok])
		case allowed[tok] > 0:
			v.Invariant = T1
			v.Reason = fmt.Sprintf("%s appears %d times; the conversation holds it %d time(s)", tok, seen[tok], allowed[tok])
		default:
			v.Invariant = T1
			v.Reason = fmt.Sprintf("%s is in the history, but no committed turn of this conversation holds it", tok)
		}
		return v
	}
	for _, s := range segs {
		if s.pending {
			continue
		}
		for _, tok := range []Token{s.user, s.user.Reply()} {
			if seen[tok] == 0 {
				v.Invariant = T2
				v.Reason = fmt.Sprintf("%s, of a committed turn, is missing from the history", tok)
				return v
			}
		}
	}
	for _, s := range segs {
		if s.pending && (seen[s.user] > 0) != (seen[s.user.Reply()] > 0) {
			v.Invariant = T6
			v.Reason = fmt.Sprintf("the turn %s, whose outcome was unknown, appears in part: it must be committed whole or not at all", s.user)
			return v
		}
	}
	v.Invariant = T2
	v.Reason = "the history holds the committed turns out of order, or does not end with this turn's message"
	return v
}

// match reports whether history is segs followed by user, each committed
// segment present whole and each pending one present whole or absent. It
// returns the segments with the pending ones resolved: kept as committed
// where present, dropped where absent. Tokens are distinct across segments,
// so a greedy walk decides.
func match(segs []segment, history []Token, user Token) ([]segment, bool) {
	var out []segment
	i := 0
	for _, s := range segs {
		whole := i+1 < len(history) && history[i] == s.user && history[i+1] == s.user.Reply()
		switch {
		case whole:
			out = append(out, segment{user: s.user})
			i += 2
		case !s.pending:
			return nil, false
		}
	}
	if i != len(history)-1 || history[i] != user {
		return nil, false
	}
	return out, true
}

// pendingIn reports whether user is the turn of a pending segment of segs.
func pendingIn(segs []segment, user Token) bool {
	return slices.Contains(segs, segment{user: user, pending: true})
}

func hasPending(segs []segment) bool {
	for _, s := range segs {
		if s.pending {
			return true
		}
	}
	return false
}

// flatten returns the tokens of segs; pending segments only if withPending.
func flatten(segs []segment, withPending bool) []Token {
	out := []Token{}
	for _, s := range segs {
		if s.pending && !withPending {
			continue
		}
		out = append(out, s.user, s.user.Reply())
	}
	return out
}

// expected is the history a turn's call must carry when no unknown turn was
// committed: the committed turns, then the turn's own user message.
func expected(segs []segment, user Token) []Token {
	return append(flatten(segs, false), user)
}

func clip(s string) string {
	if r := []rune(s); len(r) > 80 {
		return string(r[:77]) + "..."
	}
	return s
}
