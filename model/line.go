package model

import (
	"cmp"
	"fmt"
	"slices"
)

// Line is one conversation's reference state: the turns it must hold, in
// commit order, with the turns whose outcome is still unknown in their
// place. It is a value with a pure Step, in the shape porcupine's Model and
// etcd's EtcdState take: a Line stands for every history its unknown turns
// allow (each committed whole or not at all), so one Line is the whole set
// of possible states. The zero value is an empty conversation.
//
// A Line knows only its own conversation: tokens of other conversations
// (T5) are Model's business, checked before Step.
type Line struct {
	// last is the newest segment; each points to the one before. Lines
	// share their older segments: a step adds one node, where a copied
	// slice would cost the whole line every step. A call's history is
	// compared against the list itself, newest segment first, so no line
	// keeps a flat copy of its tokens.
	last *node
	// rare holds what few steps change: turns that failed, unknown turns
	// dropped; nil while there are none. Behind one pointer it keeps a Line
	// two words, which matters because porcupine boxes the Line of every
	// step it tries into an interface. Like the nodes it is never changed
	// once made: a step that changes it makes a new one.
	rare *rare
}

// rare is the part of a Line that steps seldom change.
type rare struct {
	// failed holds the user tokens of this conversation whose latest
	// attempt failed, and how (a 409 is T4's business, not T1's): a list,
	// newest first, that lines share as they share segments, so that a
	// failed turn adds one entry rather than copying all the others.
	failed *failure
	// dropped holds unknown turns that a later history showed were not
	// committed: they may never appear again (T6).
	dropped []Token
	// interrupted holds the turns whose client disconnected mid-turn: what
	// of them may stand in a later history is T10's business.
	interrupted []Token
	// forks are the dropped turns a call of another turn left out while
	// their model requests show they ran (segment.runningAt): should one
	// appear later after all, it was committed, so it ran beside that
	// turn on one history (T4), not a turn shown not committed that came
	// back (T6).
	forks []fork
}

// fork is a dropped turn, user, that the model request of the turn by
// left out while user's own request was at the model, unanswered.
type fork struct{ user, by Token }

// segment is one turn in a line: its user message and its reply. A pending
// segment is a turn with an unknown outcome, not resolved yet. A segment
// without a reply holds the user message alone: an interrupted turn that a
// keep-consistent server kept (with its completed tool pairs, which the
// line does not follow).
type segment struct {
	user, reply Token
	pending     bool
	// partial marks a pending segment of an interrupted turn: it resolves
	// to nothing, or to its user message alone, never to a reply (T10).
	partial bool
	// abandoned marks a segment of a turn whose client gave up waiting
	// (Turn.Abandoned): pending, it resolves to the whole turn, to
	// nothing, or to its user message alone, which only the rollback
	// policy forbids (checkKept); kept, a loss of it later is T10's.
	abandoned bool
	// detached marks a pending segment of a turn whose client disconnected
	// from a server that runs such a turn to its end (the complete
	// policy): whole or nothing, as any unknown turn, and a part of it is
	// T10's.
	detached bool
	// unsure marks a segment of a turn that never ended ok, kept because
	// a history showed it (an unknown turn committed, an interrupted turn
	// kept): one missing later was lost by a turn that never promised it,
	// T6's or T10's, never a committed turn lost (T2, T7) or a fork (T4).
	unsure bool
	// done is when the turn that put it there completed, on the run's
	// timeline. A turn sent before then ran alongside it, so a history of
	// that turn without it is a fork (T4), not a lost turn (T2).
	done int64
	// left is when the client of an interrupted turn left it (Turn.Held;
	// 0 if unknown, where another turn may take over from it, or where
	// no call of the turn's own reached the model). Until then the turn
	// ran, at the model, holding its conversation: a call of another
	// turn that came before then and left it out ran beside it on one
	// history (T4), and shows nothing of whether it was rolled back. A
	// turn whose only call at the model was made beside it (a title, held
	// where the harness holds the turn's first arrival) may have waited
	// for its conversation all that time: no fork.
	left int64
	// calls are the times of the model requests of a turn whose outcome
	// is unknown (not interrupted): when it ran, as far as the model saw
	// (runningAt).
	calls []callTime
}

// runningAt reports whether the model shows s's turn still running at
// tick at (Turn.runningAt, by its calls): its client's end says nothing
// of the server's, as a server that runs one turn at a time may end one
// in part (commit-on-stream-error, an interruption kept in part) and
// only then run the next, before that client hears of it.
func (s segment) runningAt(at int64) bool { return runningBy(s.calls, at) }

// node is a segment in a line's list.
type node struct {
	segment
	prev *node
	// Up to and including this segment: how many segments, how many of
	// them pending, how many tokens, and the hash of what Equal compares
	// (porcupine asks for it far more often than a line changes).
	n, pend, toks int
	hash          uint64
}

// size is how many tokens the segment stands for in a history.
func (s segment) size() int {
	if s.reply == "" {
		return 1
	}
	return 2
}

// failed is the line's failed turns (see rare).
func (l Line) failed() *failure {
	if l.rare == nil {
		return nil
	}
	return l.rare.failed
}

// dropped is the line's dropped unknown turns (see rare).
func (l Line) dropped() []Token {
	if l.rare == nil {
		return nil
	}
	return l.rare.dropped
}

// interrupted is the line's interrupted turns (see rare).
func (l Line) interrupted() []Token {
	if l.rare == nil {
		return nil
	}
	return l.rare.interrupted
}

// withRare returns l with failed and dropped, sharing l's rare part when
// neither changed (both are only ever replaced, never changed in place, so
// the same list, or the same first element and length, mean the same).
func (l Line) withRare(failed *failure, dropped []Token) Line {
	if failed == l.failed() && sameSlice(dropped, l.dropped()) {
		return l
	}
	interrupted, forks := l.interrupted(), l.forks()
	if failed == nil && len(dropped) == 0 && len(interrupted) == 0 && len(forks) == 0 {
		l.rare = nil
	} else {
		l.rare = &rare{failed: failed, dropped: dropped, interrupted: interrupted, forks: forks}
	}
	return l
}

// withInterrupted returns l with user added to its interrupted turns.
func (l Line) withInterrupted(user Token) Line {
	r := rare{interrupted: append(slices.Clip(l.interrupted()), user)}
	if l.rare != nil {
		r.failed, r.dropped, r.forks = l.rare.failed, l.rare.dropped, l.rare.forks
	}
	l.rare = &r
	return l
}

// forks is the line's dropped turns left out while at the model (see
// rare).
func (l Line) forks() []fork {
	if l.rare == nil {
		return nil
	}
	return l.rare.forks
}

// withForks returns l with fs added to its forks.
func (l Line) withForks(fs []fork) Line {
	if len(fs) == 0 {
		return l
	}
	r := rare{forks: append(slices.Clip(l.forks()), fs...)}
	if l.rare != nil {
		r.failed, r.dropped, r.interrupted = l.rare.failed, l.rare.dropped, l.rare.interrupted
	}
	l.rare = &r
	return l
}

// forkedBy is the turn that left user out while it was at the model, ""
// if none did.
func (l Line) forkedBy(user Token) Token {
	for _, f := range l.forks() {
		if f.user == user {
			return f.by
		}
	}
	return ""
}

// wasInterrupted reports whether user's turn was interrupted on this line.
func (l Line) wasInterrupted(user Token) bool { return slices.Contains(l.interrupted(), user) }

// sameSlice reports whether a and b are the same slice of the same array.
func sameSlice[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// pending counts the line's segments whose turn's outcome is unknown.
func (l Line) pending() int {
	if l.last == nil {
		return 0
	}
	return l.last.pend
}

// segs returns the line's segments, oldest first.
func (l Line) segs() []segment {
	if l.last == nil {
		return nil
	}
	out := make([]segment, l.last.n)
	for nd := l.last; nd != nil; nd = nd.prev {
		out[nd.n-1] = nd.segment
	}
	return out
}

// failure is an entry of a line's list of failed turns.
type failure struct {
	user   Token
	status int
	next   *failure
	// users has the bit (tokenBit) of every user token of the list from
	// here on set: where a token's bit is clear the list does not hold it,
	// and a step, which asks that of every turn, need not walk the list.
	users uint64
}

// newFailure returns an entry for user's failure with status, before next.
func newFailure(user Token, status int, next *failure) *failure {
	f := &failure{user: user, status: status, next: next, users: tokenBit(user)}
	if next != nil {
		f.users |= next.users
	}
	return f
}

// tokenBit is one of 64 bits, chosen by tok's FNV-1a hash.
func tokenBit(tok Token) uint64 {
	h := uint64(hashBasis)
	for i := 0; i < len(tok); i++ {
		h = (h ^ uint64(tok[i])) * fnvPrime
	}
	return 1 << (h >> 58)
}

// Tokens returns the history the line stands for when every unknown turn
// was committed: committed turns, and unknown turns not yet resolved.
func (l Line) Tokens() []Token { return flatten(l.segs(), true) }

// Equal reports whether two lines stand for the same set of histories: the
// same segments, pending or not. It does not compare the failed and
// dropped turns, which name violations and let a refused request's call
// be told from a replay (T3); porcupine, which uses Equal to remember
// states, may therefore take two lines that differ only there for one.
// Refused requests and retries are sent on their own, so they never meet
// in one search.
func (l Line) Equal(o Line) bool {
	if l.Hash() != o.Hash() {
		return false
	}
	a, b := l.last, o.last
	for a != nil && b != nil && a != b {
		if a.n != b.n || a.user != b.user || a.pending != b.pending {
			return false
		}
		a, b = a.prev, b.prev
	}
	return a == b
}

// Hash is a hash of what Equal compares.
func (l Line) Hash() uint64 {
	if l.last == nil {
		return hashBasis
	}
	return l.last.hash
}

// hashSegment extends h by s (FNV-1a over its user token and whether it
// is pending).
func hashSegment(h uint64, s segment) uint64 {
	for i := 0; i < len(s.user); i++ {
		h = (h ^ uint64(s.user[i])) * fnvPrime
	}
	mark := uint64(' ')
	if s.pending {
		mark = '?'
	}
	return (h ^ mark) * fnvPrime
}

// FNV-1a's offset basis (the hash of an empty line) and prime.
const (
	hashBasis = 14695981039346656037
	fnvPrime  = 1099511628211
)

// appended returns l with s appended, extending its hash.
func (l Line) appended(s segment) Line {
	nd := &node{segment: s, prev: l.last, n: 1, toks: s.size(), hash: hashSegment(l.Hash(), s)}
	if l.last != nil {
		nd.n, nd.pend, nd.toks = l.last.n+1, l.last.pend, l.last.toks+s.size()
	}
	if s.pending {
		nd.pend++
	}
	l.last = nd
	return l
}

// String renders the line for people: its tokens, unknown turns marked
// with "?".
func (l Line) String() string {
	if l.last == nil {
		return "(empty)"
	}
	out := make([]Token, 0, 2*l.last.n)
	for _, s := range l.segs() {
		mark := Token("")
		if s.pending {
			mark = "?"
		}
		out = append(out, s.user+mark)
		if s.reply != "" {
			out = append(out, s.reply+mark)
		}
	}
	return FormatTokens(out)
}

// Step applies turn t, sent on this line's conversation, and checks what
// the model calls of t show against it. It returns the next line, or the
// violation t shows and l unchanged. Auxiliary calls (whose last user token
// is not t's) are not read as history here.
func (l Line) Step(t Turn) (Line, *Violation) { return l.step(&t, true) }

// Next is Step for a search that only asks whether t can follow l: the same
// next line and the same verdict, without saying why t cannot. Porcupine
// tries turns in orders that mostly fail, and explaining each failure
// would cost more than the search. It takes t by pointer, as porcupine
// holds it, to spare copying it at every try.
func (l Line) Next(t *Turn) (Line, bool) {
	next, v := l.step(t, false)
	return next, v == nil
}

// Known is a step taken ahead of time: l.Next(t) for one line l and one
// turn t, kept so that a check that takes the same step later finds where
// it leads instead of reading the turn's calls again. Checking a history
// takes each step at least twice (the chain check, then porcupine's
// search), and conversations are independent, so the steps can be taken
// ahead, for several conversations at once, and each only once. The zero
// Known is no step.
type Known struct {
	from, to Line
	// turn is the turn the step was taken with. Known keeps it, not a
	// copy: it must not change while the step is used.
	turn *Turn
}

// Know takes the step l.Next(t) and returns it, known, with where it leads
// and whether t can follow l at all. Only a step t can take is kept: a
// failed one is left for Step to explain.
func (l Line) Know(t *Turn) (Known, Line, bool) {
	next, ok := l.Next(t)
	if !ok {
		return Known{}, next, false
	}
	return Known{from: l, to: next, turn: t}, next, true
}

// Next is l.Next(t), which k may know already: it does when k was taken
// from l itself (the very line, not merely an Equal one: lines never
// change, so it takes the very same step) with t, or with a turn the same
// as far as a step reads it. A nil k knows nothing.
func (k *Known) Next(l Line, t *Turn) (Line, bool) {
	if k.knows(l, t) {
		return k.to, true
	}
	return l.Next(t)
}

// knows reports whether k is the step from l with t. A Line is its two
// pointers and what they point to never changes, so lines with the same
// pointers are the very same line.
func (k *Known) knows(l Line, t *Turn) bool {
	if k == nil || k.turn == nil || l.last != k.from.last || l.rare != k.from.rare {
		return false
	}
	if k.turn == t {
		return true
	}
	// A copy of the turn k was taken with (as ApplyStep gets turns): what
	// step reads, with the calls, histories included, compared by identity.
	o := k.turn
	return t.User == o.User && t.Usable == o.Usable && t.Appends == o.Appends && t.Unstored == o.Unstored && t.Outcome == o.Outcome && t.Status == o.Status && t.TimedOut == o.TimedOut &&
		t.Interrupted == o.Interrupted && t.Abandoned == o.Abandoned && t.Held == o.Held &&
		t.Return == o.Return && t.Reply == o.Reply && sameSlice(t.Calls, o.Calls)
}

// rejected is what step returns, when not asked why, for a history that
// explain would have had to explain.
var rejected = &Violation{Reason: "rejected (not explained)"}

// step is Step, and Next when why is false.
func (l Line) step(t *Turn, why bool) (Line, *Violation) {
	if t.Unsent {
		return l, nil // it never reached the server
	}
	if !t.Usable {
		if v := l.refuse(*t); v != nil {
			return l, v
		}
		return l.continued(t), nil
	}
	// The first call of the turn resolves the unknown turns before it; every
	// further call (a server's retry of the model call) must carry the very
	// same history.
	next := l
	reached := false // a call of this turn reached the model
	var dropped []Token
	var forks []fork
	for _, call := range t.Calls {
		if call.Turn != t.User {
			continue
		}
		got, ok := next.match(call.History, t.User)
		if !ok {
			if !why {
				return l, rejected
			}
			return l, l.explain(*t, next.segs(), call, dropped)
		}
		if !reached && l.pending() > 0 {
			// What the first call left out of the unknown turns before it was
			// not committed, and may not appear later, not even in a retry
			// of this very call. Only the segments from the oldest pending
			// one on can be pending; they are listed oldest first.
			for nd := l.last; nd != nil && nd.pend > 0; nd = nd.prev {
				if !nd.pending || got.holds(nd.user) {
					continue
				}
				if nd.left != 0 && call.At < nd.left {
					// Not rolled back: it was at the model, its client still
					// there, when this call came.
					if !why {
						return l, rejected
					}
					return l, &Violation{Invariant: T4, Conv: t.Conv, Turn: t.User, Observed: call.History,
						Expected: expected(l.segs(), t.User),
						Reason: fmt.Sprintf("the turn %s was still at the model, its client not gone (it left at tick %d), when this turn's model "+
							"request came (at tick %d) without it: the two ran at once on one history, a fork; turns on one conversation "+
							"must form one line", nd.user, nd.left, call.At)}
				}
				dropped = append(dropped, nd.user)
				if nd.runningAt(call.At) {
					forks = append(forks, fork{user: nd.user, by: t.User})
				}
			}
			slices.Reverse(dropped)
		}
		next, reached = got, true
	}
	if len(dropped) > 0 {
		next = next.withRare(next.failed(), append(slices.Clip(next.dropped()), dropped...)).withForks(forks)
	}
	switch t.Outcome {
	case OK:
		if !reached {
			return l, &Violation{Invariant: T2, Conv: t.Conv, Turn: t.User,
				Reason: "the turn ended ok, but no model request of this turn was made"}
		}
		// The reply token is kept as it stands in the reply the client got
		// (which the history holds anyway), rather than built anew.
		reply, ok := replyIn(t.Reply, t.User)
		if !ok {
			return l, &Violation{Invariant: T2, Conv: t.Conv, Turn: t.User,
				Reason:   fmt.Sprintf("the turn ended ok, but the reply the client got (%q) is not the model's reply %s", clip(t.Reply), t.User.Reply()),
				Observed: Tokens(t.Reply)}
		}
		if t.Unstored {
			// Answered, and kept by no one: as a failed turn, nothing of
			// it may reach the model again (T1).
			next = next.withRare(newFailure(t.User, unstoredStatus, withoutFailure(next.failed(), t.User)), next.dropped())
			break
		}
		next = next.appended(segment{user: t.User, reply: reply, done: t.Return})
		next = next.withRare(withoutFailure(next.failed(), t.User), next.dropped())
	case Fail:
		failed := newFailure(t.User, t.Status, withoutFailure(next.failed(), t.User))
		next = next.withRare(failed, next.dropped())
	case Unknown:
		s := segment{user: t.User, reply: t.User.Reply(), pending: true, done: t.Return}
		switch {
		case t.Interrupted:
			// Rolled back, or kept as its user message and completed tool
			// pairs (keep-consistent): which of them the policy allows is
			// Model's to judge; a reply is never kept.
			s.reply, s.partial = "", true
			if t.reached() {
				s.left = t.Held
			}
			next = next.withInterrupted(t.User)
		case t.Detached:
			// Whole or nothing, as any unknown turn (T6); only a part of
			// it is T10's.
			s.detached, s.calls = true, t.callTimes()
		case t.Abandoned:
			// Whole, nothing, or its user message alone (see match).
			s.abandoned = true
		default:
			s.calls = t.callTimes()
		}
		next = next.appended(s)
		next = next.withRare(withoutFailure(next.failed(), t.User), next.dropped())
	}
	return next, nil
}

// continued is the line after t, a request without a usable new user
// message that the server appended and ran (Turn.Appends). Its input
// carries no token, so it leaves nothing to follow, but for one thing: a
// model call of it that ran on a message with no reply after it (an
// interrupted turn's, kept by keep-consistent, with t's input merged in
// or after it) gets the fake model's reply to that message. A reply
// belongs to the request whose model call made it: when t ended ok with
// that reply, the kept message and the reply are committed as t left
// them, and a later turn that sees the reply sees t's, not a leftover of
// the interrupted turn (T10).
func (l Line) continued(t *Turn) Line {
	if !t.Appends || t.Outcome != OK {
		return l
	}
	for i := len(t.Calls) - 1; i >= 0; i-- {
		call := t.Calls[i]
		if call.Turn == "" || !call.Tail || !l.holds(call.Turn) {
			continue
		}
		reply, ok := replyIn(t.Reply, call.Turn)
		if !ok {
			continue
		}
		const none = Token("tc-u-none") // stands for the input, tokenless
		got, ok := l.match(append(slices.Clone(call.History), none), none)
		if !ok || got.last == nil || got.last.user != call.Turn || got.last.reply != "" {
			continue
		}
		s := got.last.segment
		s.reply, s.done = reply, t.Return
		next := got
		next.last = got.last.prev
		return next.appended(s)
	}
	return l
}

// unstoredStatus is the status a turn that ended ok without being stored
// (Turn.Unstored) is kept under among the failed turns: no HTTP status, so
// that no failure that was answered (a 200 with an error event, say) is
// taken for one.
const unstoredStatus = 1000

// withoutFailure returns fs without user's entry, copying only the entries
// before it, and only if it has one: lines share their lists, so none is
// changed in place.
func withoutFailure(fs *failure, user Token) *failure {
	if fs == nil || fs.users&tokenBit(user) == 0 {
		return fs
	}
	if fs.user == user {
		return fs.next
	}
	if rest := withoutFailure(fs.next, user); rest != fs.next {
		return newFailure(fs.user, fs.status, rest)
	}
	return fs
}

// refuse checks a request without a usable new user message (T3): it must
// get 400 and reach no model as a turn; or, where the server appends the
// input whole (Turn.Appends), make the model see no committed user
// message again as new, whatever it is answered.
func (l Line) refuse(t Turn) *Violation {
	// A request refused with 400 ran no turn: a call carrying the line as
	// it stands then is another's (a summary of the conversation).
	ran := !(t.Outcome == Fail && t.Status == 400)
	for _, call := range t.Calls {
		reason := l.turnShaped(call, !t.Appends, ran)
		switch {
		case reason == "":
		case t.Appends:
			return &Violation{Invariant: T3, Conv: t.Conv, Turn: t.User,
				Reason: "a request whose input holds no new user message made the model see a committed one again as new, " + reason +
					"; its input is appended as it stands, after the history it continues",
				Observed: call.History}
		default:
			want := "with 400"
			if t.AnyRefusal {
				want = "(" + cmp.Or(t.RefusalSays, "a JSON-RPC error, or stopReason refusal") + ")"
			}
			return &Violation{Invariant: T3, Conv: t.Conv, Turn: t.User,
				Reason:   "a request without a usable new user message reached the model, " + reason + "; it must be refused " + want,
				Observed: call.History}
		}
	}
	if t.Appends {
		return nil
	}
	if t.Outcome == Unknown && t.Status == 0 && !t.TimedOut || t.Gateway {
		// No answer at all because the client could not reach the server,
		// or gave up on it, or a front's answer for a replica it lost:
		// nothing to judge the server's status by.
		return nil
	}
	if t.TimedOut {
		return &Violation{Invariant: T3, Conv: t.Conv, Turn: t.User,
			Reason: "a request without a usable new user message got no answer within the client's time; want 400 at once"}
	}
	if t.Outcome == Fail && t.Status >= 500 && !l.committed() {
		// Only a conversation with a committed turn has something to
		// replay: a server error there is no evidence of T3, and from a
		// server that answers everything so, nothing to judge at all.
		return nil
	}
	if t.Outcome != Fail || t.Status != 400 && !t.AnyRefusal {
		how := fmt.Sprintf("ended %s with status %d; want 400", t.Outcome, t.Status)
		switch {
		case t.AnyRefusal:
			how = fmt.Sprintf("ended %s; want it refused (%s)", t.Outcome, cmp.Or(t.RefusalSays, "a JSON-RPC error, or stopReason refusal"))
		case t.Status == 0:
			how = fmt.Sprintf("ended %s, with no status; want 400", t.Outcome)
		}
		return &Violation{Invariant: T3, Conv: t.Conv, Turn: t.User,
			Reason: "a request without a usable new user message " + how + l.replayed(t)}
	}
	return nil
}

// replayed says which user message a turn without one of its own sent the
// model as its new one, "" if none: what T3 forbids, shown where the
// conversation had nothing committed for it to repeat. A message the
// conversation holds is a replay of an earlier turn; any other (an earlier
// element of the request itself) is no earlier message of the
// conversation, and is not called one.
func (l Line) replayed(t Turn) string {
	for _, call := range t.Calls {
		switch {
		case call.Turn == "":
		case l.holds(call.Turn):
			return fmt.Sprintf("; the model was sent %s, an earlier user message of the conversation, as the new one: a replay", call.Turn)
		default:
			return fmt.Sprintf("; the model was sent %s as the new user message, though the request did not send it as one", call.Turn)
		}
	}
	return ""
}

// committed reports whether the line holds a turn that ended ok.
func (l Line) committed() bool {
	for nd := l.last; nd != nil; nd = nd.prev {
		if !nd.pending {
			return true
		}
	}
	return false
}

// turnShaped tells a call that runs a refused request as a turn from an
// auxiliary one (a title, a summary, another conversation's background
// work): it carries the line, then either an earlier message of this
// conversation replayed as the new one, or, if blank, a message with no
// token (the blank one passed on), or, where the request ran (was not
// refused with 400), the line as it stands with nothing after it (the
// conversation run with no input: its last user message is the newest
// again). It returns how, or "" for an auxiliary call.
func (l Line) turnShaped(call Call, blank, ran bool) string {
	if l.last == nil || len(call.History) == 0 {
		return ""
	}
	// Under appended input (blank false), a tokenless user message after
	// the call's last token (Tail) is the input appended, the newest
	// message: the earlier one is not run again as new.
	if l.sent(call.Turn) && (blank || !call.Tail) {
		if _, ok := l.match(call.History, call.Turn); ok {
			return fmt.Sprintf("replaying %s as the new message", call.Turn)
		}
		const none = Token("tc-u-none") // stands for the input it lacks
		if ran && !call.Trailing {
			if _, ok := l.match(append(slices.Clone(call.History), none), none); ok {
				return fmt.Sprintf("running the conversation as it stands with nothing appended, so that its last user message, %s, is the newest again", call.Turn)
			}
		}
	}
	if blank && (call.Turn == "" || call.Tail) {
		const blank = Token("tc-u-blank") // stands for the tokenless message
		if _, ok := l.match(append(slices.Clone(call.History), blank), blank); ok {
			return "passing on a message without a token as the new one"
		}
	}
	return ""
}

// sent reports whether user is the token of a turn sent on this line.
func (l Line) sent(user Token) bool {
	return user != "" && (l.holds(user) || l.failedWith(user) != 0 || slices.Contains(l.dropped(), user))
}

// holds reports whether user's turn is a segment of the line.
func (l Line) holds(user Token) bool {
	for nd := l.last; nd != nil; nd = nd.prev {
		if nd.user == user {
			return true
		}
	}
	return false
}

// failedWith is the status of user's latest failed attempt, 0 if it has
// none (or none with a status).
func (l Line) failedWith(user Token) int {
	for f := l.failed(); f != nil; f = f.next {
		if f.user == user {
			return max(f.status, 1)
		}
	}
	return 0
}

// explain says why call's history does not match segs followed by the
// turn's user token, naming the most specific invariant broken. dropped are
// the unknown turns an earlier call of this same turn showed not committed.
func (l Line) explain(t Turn, segs []segment, call Call, dropped []Token) *Violation {
	v := &Violation{Conv: t.Conv, Turn: t.User,
		Expected: expected(segs, t.User), Observed: call.History}
	allowed := map[Token]int{t.User: 1}
	for _, s := range segs {
		allowed[s.user]++
		if s.reply != "" {
			allowed[s.reply]++
		}
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
		status := l.failedWith(user)
		switch {
		case l.wasInterrupted(user) && !tok.IsUser() && allowed[tok] == 0:
			// (A reply the line holds is a continuation's own, committed
			// on the interrupted turn's kept message (continued): shown
			// twice, a committed reply shown twice.)
			v.Invariant, v.Kind = T10, LeftoverInterrupted
			v.Reason = fmt.Sprintf("%s, the reply of a turn whose client interrupted it mid-turn (left, or cancelled it), reached the model in a later turn: "+
				"an interrupted turn is rolled back, or keeps at most its user message and completed tool pairs", tok)
		case l.wasInterrupted(user) && tok.IsUser():
			v.Invariant, v.Kind = T10, LeftoverInterrupted
			v.Reason = fmt.Sprintf("%s, of a turn whose client interrupted it mid-turn (left, or cancelled it), appears %d times, or again after an earlier history "+
				"showed it rolled back: an interrupted turn is rolled back, or kept once as a consistent prefix", tok, seen[tok])
		case l.forkedBy(user) != "":
			v.Invariant = T4
			v.Reason = fmt.Sprintf("the turn %s, whose outcome was unknown, was still at the model when the model request of %s came without it; "+
				"it was committed after all, as %s here shows: the two ran at once on one history, a fork; turns on one conversation must form one line",
				user, l.forkedBy(user), tok)
		case slices.Contains(l.dropped(), user) || slices.Contains(dropped, user):
			v.Invariant, v.Kind = T6, LeftoverUnknown
			v.Reason = fmt.Sprintf("%s belongs to a turn with an unknown outcome that an earlier history showed was not committed; it may not appear later", tok)
		case status == unstoredStatus:
			v.Invariant, v.Kind = T1, LeftoverFailed
			v.Reason = fmt.Sprintf("%s, of a response the client asked not to store (store: false), reached the model in a later turn: "+
				"such a response is no one's base", tok)
		case status == 409:
			v.Invariant, v.Kind = T4, LeftoverRefused
			v.Reason = fmt.Sprintf("%s, of a turn refused with 409, reached the model in a later turn: a refused concurrent request must change nothing", tok)
		case status != 0 && seen[tok] > 1:
			v.Invariant, v.Kind = T1, LeftoverFailed
			v.Reason = fmt.Sprintf("%s, of a turn that failed, appears %d times: a retry must see the last committed history, with no duplicate", tok, seen[tok])
		case status != 0:
			v.Invariant, v.Kind = T1, LeftoverFailed
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
		for _, tok := range []Token{s.user, s.reply} {
			if tok == "" || seen[tok] > 0 {
				continue
			}
			if s.unsure {
				// Never promised: the turn did not end ok. It was shown
				// kept, and is gone now.
				v.Invariant = T6
				what := "whose outcome was unknown"
				if l.wasInterrupted(s.user) || s.abandoned {
					v.Invariant = T10
					what = "whose client interrupted it mid-turn (left, or cancelled it)"
				}
				v.Reason = fmt.Sprintf("%s, of a turn %s, was in an earlier history of the conversation and is missing now: "+
					"such a turn is kept whole, once and for good, or not at all", tok, what)
				return v
			}
			if s.done > t.Invoke {
				// The turn that committed it had not completed when this one
				// was sent: the two ran at once on one history.
				v.Invariant = T4
				v.Reason = fmt.Sprintf("%s, of a turn that ran at the same time as this one and was committed, is missing: "+
					"both turns ran on the same history, a fork; turns on one conversation must form one line", tok)
				return v
			}
			v.Invariant, v.Kind = T2, Lost
			v.Reason = fmt.Sprintf("%s, of a committed turn, is missing from the history", tok)
			return v
		}
	}
	for _, s := range segs {
		// A turn whose client gave up waiting may stand as its user
		// message alone: the policy's to judge (checkKept), not a part.
		keptUser := s.abandoned && seen[s.user] > 0
		if s.pending && !s.partial && !keptUser && (seen[s.user] > 0) != (seen[s.reply] > 0) {
			if s.done > t.Invoke && !s.abandoned && s.runningAt(call.At) {
				// The other turn's client had not learned its end when
				// this one was sent, and the model shows it still ran
				// when this one's call came: this one saw it half done,
				// on one history with it, whatever it came to. Its
				// client's end alone says nothing of the server's: a
				// server that runs one turn at a time may end it in part
				// (T6; T10 for one that runs on after its client left)
				// and only then run this one.
				v.Invariant = T4
				v.Reason = fmt.Sprintf("the turn %s, which ran at the same time as this one, appears in part: "+
					"this turn ran on its history half done, a fork; turns on one conversation must form one line", s.user)
				return v
			}
			v.Invariant = T6
			v.Reason = fmt.Sprintf("the turn %s, whose outcome was unknown, appears in part: it must be committed whole or not at all", s.user)
			switch {
			case s.detached:
				v.Invariant = T10
				v.Reason = fmt.Sprintf("the turn %s, whose client interrupted it mid-turn (left, or cancelled it), appears in part: the server runs such a turn to its end, "+
					"as it declares (the complete policy; an A2A task that outlives its connection), and commits it whole or not at all", s.user)
			case s.abandoned:
				v.Invariant = T10
				v.Reason = fmt.Sprintf("the turn %s, whose client gave up waiting and left, appears in part: it is kept whole (committed before "+
					"the server saw the client go), or as the interruption policy leaves an interrupted turn", s.user)
			}
			return v
		}
	}
	v.Invariant = T2
	v.Reason = "the history holds the committed turns out of order, or does not end with this turn's message"
	return v
}

// match reports whether history is the line followed by user, each
// committed segment present whole and each pending one present whole or
// absent. It returns the line with the pending segments resolved: kept as
// committed where present, dropped where absent (the line itself when none
// is pending). Tokens are distinct across segments, so a greedy walk,
// from the newest segment back, decides.
func (l Line) match(history []Token, user Token) (Line, bool) {
	i := len(history) - 1 // history[:i] must be the line
	if i < 0 || history[i] != user {
		return l, false
	}
	if l.pending() == 0 {
		// Nothing to resolve: the history must be exactly the line.
		if l.last == nil {
			return l, i == 0
		}
		if i != l.last.toks {
			return l, false
		}
		for nd := l.last; nd != nil; nd = nd.prev {
			if nd.reply == "" {
				i--
				if history[i] != nd.user {
					return l, false
				}
				continue
			}
			i -= 2
			if history[i] != nd.user || history[i+1] != nd.reply {
				return l, false
			}
		}
		return l, true
	}
	// Resolve the pending segments; what is older than all of them is
	// shared with l, once checked.
	var buf [8]segment
	kept := buf[:0] // newest first
	var base *node
	for nd := l.last; nd != nil; nd = nd.prev {
		if nd.pend == 0 && base == nil {
			base = nd
		}
		var whole, user bool
		if nd.reply == "" {
			whole = i >= 1 && history[i-1] == nd.user
		} else {
			whole = i >= 2 && history[i-2] == nd.user && history[i-1] == nd.reply
			// A turn whose client gave up waiting may have been stopped
			// with its user message kept (keep-consistent).
			user = !whole && nd.pending && nd.abandoned && i >= 1 && history[i-1] == nd.user
		}
		switch {
		case !whole && !user && !nd.pending:
			return l, false
		case whole, user:
			s := nd.segment
			if user {
				s.reply = ""
			}
			i -= s.size()
			if base == nil {
				s.unsure = s.unsure || s.pending
				s.pending, s.partial, s.detached = false, false, false
				kept = append(kept, s)
			}
		}
	}
	if i != 0 {
		return l, false
	}
	next := l
	next.last = base
	for k := len(kept) - 1; k >= 0; k-- {
		next = next.appended(kept[k])
	}
	return next, true
}

// without returns l without the segments of the turns whose user tokens
// users holds (as keys), the others as they stand, in order.
func (l Line) without(users map[Token]Token) Line {
	out := Line{rare: l.rare}
	changed := false
	for _, s := range l.segs() {
		if _, ok := users[s.user]; ok {
			changed = true
			continue
		}
		out = out.appended(s)
	}
	if !changed {
		return l
	}
	return out
}

// pendingIn reports whether user is the turn of a pending segment of segs.
func pendingIn(segs []segment, user Token) bool {
	return slices.ContainsFunc(segs, func(s segment) bool { return s.pending && s.user == user })
}

// flatten returns the tokens of segs; pending segments only if withPending.
func flatten(segs []segment, withPending bool) []Token {
	out := []Token{}
	for _, s := range segs {
		if s.pending && !withPending {
			continue
		}
		out = append(out, s.user)
		if s.reply != "" {
			out = append(out, s.reply)
		}
	}
	return out
}

// expected is the history a turn's call must carry when no unknown turn was
// committed: the committed turns, then the turn's own user message.
func expected(segs []segment, user Token) []Token {
	return append(flatten(segs, false), user)
}
