package model

import (
	"cmp"
	"fmt"
	"maps"
	"math"
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
	T4 Invariant = "T4" // one conversation, one line
	T5 Invariant = "T5" // isolation
	T6 Invariant = "T6" // unknown outcomes
)

// T7 and T8 are checked across restarts the client reports (Restart).
const (
	T7 Invariant = "T7" // durability
	T8 Invariant = "T8" // stable source resume
)

// Crash names the finding of a server that went down without being told
// to: its process exited on its own while it served (PROTOCOL.md, "A
// server stays up"); one that does not come back from a restart or crash
// the harness drew is Start's. It is no property
// of a conversation's history, and this package never evaluates it: the
// harness sees it, and gives it a verdict beside T1 to T11.
const Crash Invariant = "crash"

// Start names the finding of a server that did not start: its process
// ran and did not get ready within the tries its profile allows, at the
// run's first start, a start between two checks, or a restart or crash
// the harness drew (PROTOCOL.md, "A server starts"). A crash is a
// server that went down while it served; this is one that never came up
// to serve. Like Crash, this package never evaluates it.
const Start Invariant = "start"

// Wire names the finding of an ACP or A2A agent that does what the
// protocol does not allow it: it calls back a method the client did not
// advertise, or answers a cancelled prompt otherwise than cancelled
// (PROTOCOL.md, "The Agent Client Protocol"); it answers a message with a
// task of another context, or shows in a task's history messages the
// task did not send the model ("The Agent2Agent protocol"). It is no property of a
// conversation's history, and this package never evaluates it: the
// harness sees it on the wire.
const Wire Invariant = "wire"

// T9 to T11 are checked on the tool traffic of model requests (Call.Tools)
// and on turns whose client disconnected (Turn.Interrupted).
const (
	T9  Invariant = "T9"  // tool pairs
	T10 Invariant = "T10" // interruption
	T11 Invariant = "T11" // no leaks from the working copy
)

var invariantTitles = map[Invariant]string{
	T1:  "atomic turns",
	T2:  "committed turns stay",
	T3:  "no replay",
	T4:  "one conversation, one line",
	T5:  "isolation",
	T6:  "unknown outcomes",
	T7:  "durability",
	T8:  "stable source resume",
	T9:  "tool pairs",
	T10: "interruption",
	T11: "no leaks from the working copy",

	Crash: "the server stays up",
	Start: "the server starts",
	Wire:  "the agent keeps to the protocol",
}

// Title is the invariant's short name, as PROTOCOL.md gives it.
func (i Invariant) Title() string { return invariantTitles[i] }

// Invariants lists the invariants of PROTOCOL.md, T1 to T11, in order:
// this package checks every one.
func Invariants() []Invariant { return slices.Clone(invariants[:]) }

// invariants is Invariants(), the order counters keeps its counts in.
var invariants = [...]Invariant{T1, T2, T3, T4, T5, T6, T7, T8, T9, T10, T11}

// counters counts how many times each invariant was evaluated, in the order
// of invariants: an array, not a map, because the checker counts three or
// four invariants for every call of every turn.
type counters [len(invariants)]int

// add counts one evaluation of i.
func (c *counters) add(i Invariant) {
	switch i {
	case T1:
		c[0]++
	case T2:
		c[1]++
	case T3:
		c[2]++
	case T4:
		c[3]++
	case T5:
		c[4]++
	case T6:
		c[5]++
	case T7:
		c[6]++
	case T8:
		c[7]++
	case T9:
		c[8]++
	case T10:
		c[9]++
	case T11:
		c[10]++
	default:
		panic("model: unknown invariant " + string(i))
	}
}

// Violation is a broken invariant: which one, on which conversation, why,
// and the token sequences that show it.
type Violation struct {
	Invariant Invariant       `json:"invariant"`
	Conv      ConversationRef `json:"conversation"`
	// Turn is the user token of the turn during which it was seen.
	Turn   Token  `json:"turn,omitempty"`
	Reason string `json:"reason"`
	// Expected and Observed are histories as token sequences; Expected is
	// nil where no single history was expected.
	Expected []Token `json:"expected,omitempty"`
	Observed []Token `json:"observed,omitempty"`
	// Kind names the wrong state the violation shows where more than one
	// invariant names its forms (Leftover, Lost): one root cause, shown
	// again under another name, is still one finding.
	Kind Kind `json:"kind,omitempty"`
	// Also are the other invariants the same request breaks by the same
	// trigger (Kind): an interrupted turn's orphaned tool call (T9) whose
	// request also carries the turn's message, which rollback was to drop
	// (T10). They are this finding's SAME CAUSE, never a pass.
	Also []Invariant `json:"also,omitempty"`
}

// Kind is a wrong state that several invariants name, each for its own
// kind of turn.
type Kind string

// The kinds. Each names what set the wrong state off as well as the wrong
// state: a failed turn's message kept and an interrupted turn's message
// kept are two triggers, and the evidence of one is none of the other
// (PROTOCOL.md, "One root cause, one finding").
const (
	// LeftoverFailed: a turn that failed left its message or output in
	// the conversation (T1; T9 for a tool call it left without its
	// result).
	LeftoverFailed Kind = "leftover of a failed turn"
	// LeftoverRefused: a request refused for a busy conversation left its
	// message (T4).
	LeftoverRefused Kind = "leftover of a refused turn"
	// LeftoverUnknown: a turn whose outcome was unknown, shown not
	// committed, left its message or output (T6; T9).
	LeftoverUnknown Kind = "leftover of an unknown turn"
	// LeftoverInterrupted: a turn whose client disconnected left what it
	// had to roll back (T10; T9).
	LeftoverInterrupted Kind = "leftover of an interrupted turn"
	// Lost: a committed turn went missing (T2, and T7 after a restart:
	// a loss seen after a restart may have come before it).
	Lost Kind = "lost"
)

// Error says which invariant broke, where, why, and shows the expected and
// observed histories.
func (v *Violation) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s) violated", v.Invariant, v.Invariant.Title())
	if v.Conv != (ConversationRef{}) {
		// A server that went down broke no one conversation (Crash).
		fmt.Fprintf(&b, " on conversation %s", v.Conv)
	}
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

// Turn is one request the client sent on a conversation and what came of
// it: one operation of a history.
type Turn struct {
	Conv ConversationRef `json:"conversation"`
	// User is the token of the request's new user message. It is reused
	// only when the client retries a failed turn.
	User Token `json:"user,omitempty"`
	// Usable reports whether the request carried a usable new user message
	// (PROTOCOL.md); a request without one must be refused (T3).
	Usable bool `json:"usable"`
	// Appends reports that the server appends the request's input whole
	// to the history it continues, as OpenAI's Responses API does: a
	// request without a usable new user message (a client tool's output
	// alone, a blank message) then need not be refused; it must only never
	// make the model see a committed user message again as new (T3).
	Appends bool `json:"appends,omitempty"`
	// Unstored reports a turn that asked the server not to store it (the
	// Responses API's store: false): it runs and is answered as any turn,
	// and becomes no one's base. As a failed turn's, nothing of it may
	// reach the model in a later turn (T1).
	Unstored bool    `json:"unstored,omitempty"`
	Outcome  Outcome `json:"outcome"`
	// Status is the HTTP status the client got, 0 if none.
	Status int `json:"status,omitempty"`
	// TimedOut reports a request the server took and never answered within
	// the client's time: no status, but not for want of a server.
	TimedOut bool `json:"timedOut,omitempty"`
	// Reply is the assistant text the client received.
	Reply string `json:"reply,omitempty"`
	// Calls are the model requests attributed to the turn: those whose last
	// user token is the turn's, and, for a request without a usable new
	// message, any other call made while it ran. Once SplitAuxiliary has
	// run, the auxiliary calls are in Aux instead.
	Calls []Call `json:"calls"`
	// Aux are the turn's auxiliary calls (SplitAuxiliary): made beside
	// the turn, not on its way to the answer. They are checked for
	// isolation (T5) and tool pairs (T9), never as the turn's history.
	Aux []Call `json:"aux,omitempty"`
	// Invoke and Return are when the client sent the request and when it
	// learned its outcome, on the run's timeline (Call.At counts on the same
	// one). Two turns overlap unless one returned before the other was
	// invoked.
	Invoke int64 `json:"invoke"`
	Return int64 `json:"return"`
	// Interrupted reports that the client disconnected while the server
	// was waiting at a point the fake model held (a model call, a tool
	// run): the server must stop the turn and roll it back, or, under
	// the keep-consistent policy, keep at most its user message and its
	// completed tool pairs (T10). Its Outcome is Unknown.
	Interrupted bool `json:"interrupted,omitempty"`
	// Released is when, after an interruption, the harness let go of
	// what the server was still waiting on, on the run's timeline: once
	// the server said it saw the disconnect, or held on to it for the
	// harness's whole bound. A model call or tool run of the turn that
	// starts after it started after the disconnect was seen (T10).
	Released int64 `json:"released,omitempty"`
	// Dropped is when the client disconnected, on the run's timeline:
	// from then on the model answers nothing of the turn until Released.
	Dropped int64 `json:"dropped,omitempty"`
	// Held is, for an interrupted turn of a server that runs a
	// conversation's turns one at a time (serialize or reject; not an
	// agent that supersedes), when its client left it: until then it held
	// its conversation at the model, where a call of its own reached it
	// (not only one made beside it, a title), and a model request of
	// another turn of the conversation that came before then ran beside
	// it (T4). 0 where another turn may take over from it.
	Held int64 `json:"held,omitempty"`
	// CarriedOn is when a model call or tool run of the turn arrived
	// after the server gave up on one the model held for it since the
	// disconnect, with nothing of the turn answered in between: the
	// server went on with the turn without what it had waited for (T10).
	// 0 if none did.
	CarriedOn int64 `json:"carriedOn,omitempty"`
	// CarriedAfter are when the arrivals the server had given up on by
	// CarriedOn arrived. Only a give-up on one of the turn's own calls or
	// tool runs makes CarriedOn evidence: a server that gave up only on a
	// call made beside the turn (a title) may have had the turn's own
	// call on its way when it saw the disconnect.
	CarriedAfter []int64 `json:"carriedAfter,omitempty"`
	// ReleasedAfter are, where the harness let go of the turn (Released)
	// because its server gave up on all the model held of it, when those
	// arrived. As with CarriedAfter, a give-up only on calls made beside
	// the turn (a title) leaves the turn's own call, on its way, to come
	// after the release: it is not judged as started after it. Nil where
	// the harness let go for another reason.
	ReleasedAfter []int64 `json:"releasedAfter,omitempty"`
	// Runs are the tool runs of the turn the harness saw start.
	Runs []ToolRun `json:"runs,omitempty"`
	// LateRuns are tool runs the harness saw start while this turn's step
	// ran that belong to no turn of the step: a turn of an earlier step's
	// run, started after its step ended. One of an interrupted turn the
	// harness had let go of is T10's, however late it came.
	LateRuns []ToolRun `json:"lateRuns,omitempty"`
	// Detached reports that the client disconnected mid-turn from a
	// server that declares the complete policy: the turn runs on to its
	// end, and is committed whole or not at all, as an unknown turn is
	// (T6); a part of it kept is T10. Its Outcome is Unknown.
	Detached bool `json:"detached,omitempty"`
	// Abandoned reports that the client gave up waiting (its own time ran
	// out, TimedOut) and closed the connection, under a server that stops
	// a turn whose client left: an interruption at a point the harness
	// did not choose. The server may have committed the turn whole before
	// it saw the client go, or stopped it as its interruption policy
	// says: nothing, or (keep-consistent) its user message. A part of it
	// kept otherwise is T10, as of any interrupted turn; no stop is
	// judged, since nothing held the turn (PROTOCOL.md, T10). Its Outcome
	// is Unknown.
	Abandoned bool `json:"abandoned,omitempty"`
	// Open reports that the client stopped reading the response before
	// the server ended it (after an error chunk, say): the server may
	// still be finishing the turn, and a 409 to the next request is no
	// deviation.
	Open bool `json:"open,omitempty"`
	// WaitedOut reports that the answer came only after the server's
	// declared bound on a serialized turn's wait (its queue timeout, by
	// default its model timeout) had passed since the request was sent:
	// a refusal then may be a serializing server's bounded wait ending,
	// not a refusal to wait (T4). It only ever excuses.
	WaitedOut bool `json:"waitedOut,omitempty"`
	// InTakeover reports that the request was sent within the server's
	// declared takeover bound after a kill of the server (or its
	// replica) under a turn of its conversation (its profile's
	// takeover_after): the conversation may still be the dead turn's, and
	// a refusal then says neither that it did not resume (T7) nor that
	// the server refused to wait (T4). It only ever excuses.
	InTakeover bool `json:"inTakeover,omitempty"`
	// Gateway reports a failure whose status (502, 504) a front in front
	// of the server's replicas answers for itself, when it loses its
	// connection to a replica or gives up on one: such a refusal says
	// nothing of how the server orders turns (T4). It only ever excuses.
	Gateway bool `json:"gateway,omitempty"`
	// Replay, where Replayed, is the history the server showed the
	// client before the turn, as tokens, on a second window beside the
	// model's: an ACP agent's session/load replays its session so. It
	// must be the conversation's committed history, each unknown turn
	// whole or absent (T7), hold no failed turn (T1) and no other
	// conversation's token (T5).
	Replay   []Token `json:"replay,omitempty"`
	Replayed bool    `json:"replayed,omitempty"`
	// ReplayForeign are tokens the replay showed of another check's
	// conversations, left out of Replay: a leak (T5), as a model call's
	// Foreign tokens are.
	ReplayForeign []Token `json:"replayForeign,omitempty"`
	// Preempted reports a turn the server gave up, unasked, once a later
	// request of its conversation came, and ran that one instead: it
	// neither queued the later request nor refused it (T4). An ACP agent
	// that answers a running prompt cancelled when a second comes does.
	Preempted bool `json:"preempted,omitempty"`
	// AnyRefusal reports a protocol whose refusals carry no HTTP status
	// (ACP: a JSON-RPC error, or stopReason refusal; A2A: a JSON-RPC
	// error, or a task rejected or failed): any failure of a request
	// without a usable message, before any model call, refuses it (T3),
	// whatever status it was read as.
	AnyRefusal bool `json:"anyRefusal,omitempty"`
	// RefusalSays is how such a protocol refuses, in its own words, for a
	// T3 violation to say what it wanted; "" says ACP's.
	RefusalSays string `json:"refusalSays,omitempty"`
	// Unsent reports a request that never reached the server: the
	// protocol's call before it failed (a session's creation, an ACP
	// session/load), or no server ran to send it to. It is evidence of
	// nothing, and changes nothing. Status, if not 0, is the status the
	// call before it was refused with: a refused session/load after a
	// restart is judged as the resume it was (T7, T8), never as the
	// outcome of the turn that was to follow.
	Unsent bool `json:"unsent,omitempty"`
}

// overlaps reports whether t and o were in flight at the same time.
func (t Turn) overlaps(o Turn) bool { return t.Invoke < o.Return && o.Invoke < t.Return }

// Concurrency is what a server declares it does with a request on a
// conversation whose turn is still running (PROTOCOL.md T4).
type Concurrency int

// The concurrency policies.
const (
	// Serialize: the request waits its turn.
	Serialize Concurrency = iota
	// Reject: the request gets 409 at once, and nothing changes.
	Reject
)

// String is "serialize" or "reject".
func (c Concurrency) String() string {
	if c == Reject {
		return "reject"
	}
	return "serialize"
}

// Policies are what a server declares of itself (PROTOCOL.md, "Profiles"):
// the model judges it by them, and by nothing it did not claim.
type Policies struct {
	Concurrency Concurrency
	// KeepConsistent is the keep-consistent interruption policy: an
	// interrupted turn may keep its user message and completed tool
	// pairs. Otherwise it is rolled back (T10), unless Complete.
	KeepConsistent bool
	// Complete is the complete interruption policy: a turn whose client
	// disconnected runs to its end and is committed whole or not at all.
	// The client then sends such a turn as Detached, not Interrupted.
	Complete bool
	// Forgets, if not 0, is the capacity of a server whose cache forgets
	// the conversations it evicts (least recently used first): one that
	// this many others were used after it may be gone whole, and its next
	// turn start over on an empty history (PROTOCOL.md, "forgets").
	Forgets int
}

// Model is the reference state of every conversation a run has touched: a
// Line per conversation, and what ties conversations together (which
// conversation each token belongs to, for T5). It is not safe for
// concurrent use. The zero value is not ready; use New.
type Model struct {
	policies Policies
	// released holds each interrupted turn the harness let go of (its
	// Released set), by its token, for a tool run of it that starts in a
	// later step (Turn.LateRuns).
	released map[Token]Turn
	// convs holds what the model knows of each conversation a step has
	// touched: one map, looked up once for each turn.
	convs map[ConversationRef]*conv
	// owner records which conversation each token was sent on or written
	// for, to tell leaks between conversations (T5). It points to the
	// conversation's entry in convs: a smaller map than one holding
	// references, and owners compare as pointers. Use ownerOf, not owner:
	// sent holds turns not entered in owner yet.
	owner map[Token]*conv
	// sent holds the usable turns of the steps applied so far, in order,
	// whose tokens owner does not hold yet. Only calls that are not a
	// turn's own, and calls that break a line, are looked up in owner, and
	// many steps have none: those steps' turns are entered when one does,
	// not every turn as it comes.
	sent    []sentTurn
	checked counters
	// ambiguous is set while the server loads several agent sources that
	// share the stable key every conversation was bound under: a resume
	// must then be refused with 409, and nothing change (T8).
	ambiguous bool
	// live counts the conversations with a turn that ended ok or unknown.
	live int
	// steps counts the steps applied, for conv.touched and conv.lastUse;
	// evictions the turns that found their conversation forgotten
	// (Policies.Forgets).
	steps, evictions int
	// survived is set once a conversation resumed after a restart that
	// kept its agent's source: the server keeps conversations across a
	// plain restart, so one lost after a change of source is the change's
	// (T8), not durability's (T7).
	survived bool
}

// Survived reports whether a conversation has resumed after a restart
// that kept its agent's source: until one has, a conversation that does
// not resume after a restart that changed the source is judged T7, as it
// may not survive a plain restart either.
func (m *Model) Survived() bool { return m.survived }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sentTurn is a usable turn's user token and its conversation.
type sentTurn struct {
	user Token
	cv   *conv
}

// conv is the model's state of one conversation.
type conv struct {
	ref  ConversationRef
	line Line
	// lined is set once a turn has been applied to line: before, the model
	// holds no history for the conversation (Committed is nil).
	lined bool
	// mayRun is set when the latest turn ended unknown: it may still be
	// running on the server, so a 409 there is no deviation.
	mayRun bool
	// ranInStep counts the turns on the conversation in the step being
	// applied that reached the model; reset before any of them is applied.
	ranInStep int
	// failed and committed are set once a usable turn of the conversation
	// has failed, or ended ok: only then can a later call show a failed
	// turn's leftovers (T1) or a committed turn gone (T2).
	failed, committed bool
	// restarted is set when the server restarted after the conversation
	// had a committed turn, until a call of its shows the history whole:
	// a committed turn missing meanwhile was lost across the restart (T7).
	restarted bool
	// resume is the invariant the conversation's next turn must resume
	// under after a restart: T8 when the restart changed its source's
	// reference, T7 otherwise; "" when no resume is due.
	resume Invariant
	// ambiguous is set while the server loads several sources sharing the
	// stable key this conversation was bound under: every resume must be
	// refused. A conversation started during such a spell binds to one of
	// them, and is not.
	ambiguous bool
	// live is set once a turn of the conversation ended ok or unknown:
	// its tokens may then be in the server's state, to leak (T5).
	live bool
	// interrupted is set once a turn of the conversation was interrupted:
	// a later call shows whether it was rolled back (T10).
	interrupted bool
	// shown is what the first call of the latest turn that reached the
	// model showed of the committed tool calls (sorted ids), and
	// unchanged that only turns that failed came since: the committed
	// conversation is then the same, and so must be what a turn's first
	// call shows of it (T11).
	shown     []string
	unchanged bool
	// family is the conversation at the root of the branches this one is
	// one of (Fork), nil for a conversation that never branched; inherited
	// are the tokens its history held when it branched off, which it
	// carries as its own.
	family    *conv
	inherited map[Token]bool
	// touched is the last step a request named the conversation in, and
	// lastUse the last one a turn of it surely used it in (it reached the
	// model, or ended ok): on Model.steps's count, how recently a cache
	// may have used it, and how recently it surely did.
	touched, lastUse int
}

// New returns a model with no conversations, for a server that serializes.
func New() *Model { return NewWith(Policies{}) }

// NewWith returns a model with no conversations, for a server that
// declares p.
func NewWith(p Policies) *Model {
	return &Model{
		policies: p,
		convs:    map[ConversationRef]*conv{},
		owner:    map[Token]*conv{},
		released: map[Token]Turn{},
	}
}

// Checked returns how many times each invariant has been evaluated where
// it could have been broken: T1 on a call of a conversation that has seen
// a failed turn, T2 on one with a committed turn, T3 on every request
// without a usable message that got an answer, T4 where turns on one
// conversation overlapped and one was served, or one was refused with 409, T5 on a call made while other
// conversations exist, T6 on a call made while an unknown turn is
// unresolved. An invariant never evaluated was not exercised.
func (m *Model) Checked() map[Invariant]int {
	out := map[Invariant]int{}
	for k, v := range m.checked {
		if v > 0 { // only invariants evaluated at least once, as ever
			out[invariants[k]] = v
		}
	}
	return out
}

// Committed returns the history the server must hold for c, as far as the
// model knows it: committed turns, and unknown turns not yet resolved.
func (m *Model) Committed(c ConversationRef) []Token {
	if cv := m.convs[c]; cv == nil || !cv.lined {
		return nil
	}
	return m.Line(c).Tokens()
}

// Line returns conversation c's reference state.
func (m *Model) Line(c ConversationRef) Line {
	if cv := m.convs[c]; cv != nil {
		return cv.line
	}
	return Line{}
}

// Apply records a turn sent on its own and checks every invariant it bears
// on: a step of one.
func (m *Model) Apply(t Turn) *Violation { return m.ApplyStep([]Turn{t}) }

// ApplyStep records the turns of one step, sent at once and all complete,
// and checks every invariant they bear on against the model calls
// attributed to them. It returns the first violation, or nil. After a
// violation the model's state is unspecified.
//
// The turns of a conversation are applied in the order the server ran
// them, as the model saw it: by the arrival of each turn's first call (a
// turn that reached no model, by when it was sent), that is by RanAt,
// turns that ran at the same time in the order given; those a model call
// of the step shows, in the order it shows them (placeShown). Where a
// serializing server ran them one by one, each must then see the one
// before; where
// two ran at once on one history, the second is the fork (T4). Every such
// order is consistent with real time, so a history this accepts is
// linearizable; linearizability is checked on its own all the same.
func (m *Model) ApplyStep(turns []Turn) *Violation { return m.ApplyStepKnown(turns, nil) }

// ApplyStepKnown is ApplyStep with steps known ahead: known[i], if not
// zero, is a step taken with turns[i] (or the turn it was copied from), by
// Line.Know. Where ApplyStep would step a turn's conversation from the
// very line known[i] was taken from, it takes the known step, and reads
// the turn's calls only for what else it checks: a known step leads where
// Step leads, so the outcome is ApplyStep's. Steps known from other lines,
// or for other turns, are not used.
func (m *Model) ApplyStepKnown(turns []Turn, known []Known) *Violation {
	for _, t := range turns {
		if t.Preempted {
			// What the later turn then saw follows from this: the most
			// specific finding comes first.
			m.checked.add(T4)
			return &Violation{Invariant: T4, Conv: t.Conv, Turn: t.User,
				Reason: fmt.Sprintf("the server gave %s up, unasked, once a later request of the conversation came, and ran that one: "+
					"a request on a busy conversation must wait its turn or be refused, as declared", t.User)}
		}
	}
	for _, t := range turns {
		if t.Interrupted && t.Released != 0 {
			m.released[t.User] = t
		}
	}
	for _, t := range turns {
		if v := m.checkLateRuns(t); v != nil {
			return v
		}
	}
	// Each turn's conversation is looked up once, here, and each turn's
	// RanAt found once, not at every comparison of the sort: it walks the
	// turn's calls.
	type ran struct {
		at int64
		// before: placed just before the turn whose place it took
		// (placeBefore).
		before bool
		i      int
		cv     *conv
	}
	order := make([]ran, len(turns))
	m.sent = slices.Grow(m.sent, len(turns))
	m.steps++
	var touched []*conv
	for i := range turns {
		t := &turns[i]
		cv := m.convs[t.Conv]
		if cv == nil {
			cv = &conv{ref: t.Conv}
			m.convs[t.Conv] = cv
		}
		if !slices.Contains(touched, cv) {
			touched = append(touched, cv)
		}
		cv.touched = m.steps
		if t.Usable && t.reached() {
			cv.ranInStep++
		}
		if t.Usable {
			m.sent = append(m.sent, sentTurn{t.User, cv})
		}
		order[i] = ran{at: t.RanAt(), i: i, cv: cv}
	}
	if len(turns) > 1 {
		// Only turns of one step can stand out of RanAt's order: a step
		// of one turn, most of them, is spared the search.
		for _, cv := range touched {
			for i, at := range placeShown(turns, cv.ref) {
				order[i].at = at
			}
		}
		at := func(i int) int64 { return order[i].at }
		for i, y := range placeBefore(turns, at) {
			order[i].at, order[i].before = order[y].at, true
		}
	}
	branches := map[*conv]int{}
	for _, cv := range touched {
		// Concurrent turns exercise T4 only where two of them reached the
		// model (a refusal is counted where it is judged, checkConflict):
		// a server that answers by itself, or refuses everything, proves
		// nothing of one line. Two branches of one conversation that
		// reached it at once exercise it too: each must see only its own.
		if cv.ranInStep > 1 {
			m.checked.add(T4)
		}
		if cv.family != nil && cv.ranInStep > 0 {
			branches[cv.family]++
		}
		cv.ranInStep = 0
	}
	for _, n := range branches {
		if n > 1 {
			m.checked.add(T4)
		}
	}
	for _, r := range order {
		// A replay (an ACP session/load) was shown before any turn of the
		// step was sent: it is judged against the history the step began
		// with, whatever order the server then ran the turns in. Judged
		// at its turn's place, it would miss a turn the server ran first.
		if v := m.checkReplay(turns[r.i], r.cv); v != nil {
			return v
		}
	}
	slices.SortStableFunc(order, func(a, b ran) int {
		return cmp.Or(cmp.Compare(a.at, b.at), -cmp.Compare(b2i(a.before), b2i(b.before)))
	})
	for _, r := range order {
		var k *Known
		if r.i < len(known) {
			k = &known[r.i]
		}
		if v := m.apply(turns[r.i], r.cv, turns, k); v != nil {
			return v
		}
	}
	return nil
}

// Fork records that conversation to starts as a branch of conversation
// from, for a server whose conversations branch by design (the Responses
// API, where two requests chained from one response each start a branch
// of their own): to holds from's history as it stands, and goes on on its
// own. A turn of to must see that history and its own turns, never a turn
// of from made after the fork, nor one of a sibling branch: that would be
// two branches run as one line, a fork (T4). Fork does nothing if to has
// been seen already.
func (m *Model) Fork(from, to ConversationRef) {
	if _, ok := m.convs[to]; ok {
		return
	}
	src := m.convs[from]
	if src == nil {
		src = &conv{ref: from}
		m.convs[from] = src
	}
	if src.family == nil {
		src.family = src
	}
	cv := *src
	cv.ref, cv.live, cv.ranInStep = to, false, 0
	cv.shown = slices.Clone(src.shown)
	cv.inherited = maps.Clone(src.inherited)
	if cv.inherited == nil {
		cv.inherited = map[Token]bool{}
	}
	for _, tok := range src.line.Tokens() {
		cv.inherited[tok] = true
	}
	m.convs[to] = &cv
}

// sameFamily reports whether a and b are branches of one conversation.
func sameFamily(a, b *conv) bool { return a == b || a.family != nil && a.family == b.family }

// reached reports whether a call of t's own reached the model.
func (t *Turn) reached() bool {
	for _, c := range t.Calls {
		if c.Turn == t.User {
			return true
		}
	}
	return false
}

// placeShown orders the turns of conversation c in the step turns as the
// step's model call of c that shows the most of them shows them: a
// server took them in that order, whatever order they were sent in, and
// whenever their own model calls reached the model. An agent that takes a
// burst of prompts out of the order sent, and keeps those it cancels
// (keep-consistent), keeps them in the order it took them, and a prompt
// it took, stored, then cancelled for the next may reach the model after
// that next one's call. The turns shown keep the places RanAt gave them
// as a set; only who stands where among them changes. It returns, by
// index into turns, the place each shown turn takes.
func placeShown(turns []Turn, c ConversationRef) map[int]int64 {
	byUser := map[Token]int{}
	for i := range turns {
		if t := &turns[i]; t.Conv == c && t.Usable {
			byUser[t.User] = i
		}
	}
	// The call that shows the most of the step's turns: the conversation
	// as the server last had it in the step (of two, the later).
	var shown []int
	var at int64
	for _, i := range byUser {
		t := &turns[i]
		for j := range t.Calls {
			call := &t.Calls[j]
			if call.Turn != t.User {
				continue
			}
			var these []int
			for _, tok := range call.History {
				if k, ok := byUser[tok]; ok && !slices.Contains(these, k) {
					these = append(these, k)
				}
			}
			if len(these) > len(shown) || len(these) == len(shown) && call.At > at {
				shown, at = these, call.At
			}
		}
	}
	if len(shown) < 2 {
		return nil
	}
	places := make([]int64, len(shown))
	for k, i := range shown {
		places[k] = turns[i].RanAt()
	}
	slices.Sort(places)
	out := make(map[int]int64, len(shown))
	for k, i := range shown {
		out[i] = places[k]
	}
	return out
}

// placeBefore finds the interrupted turns of the step turns whose own
// model request reached the model, by at (their places so far), after
// that of another turn of their conversation that ended ok, where neither
// shows the other (and after every turn its own request shows): the
// interrupted one ran first, on the history before the other, and was
// then stopped and rolled back (its request stamped late, on a busy
// machine), or taken over by the other (an agent that supersedes).
// Run after the other, it would have seen it. It returns, for each, the
// index of the earliest such turn, whose place it takes, just before it.
func placeBefore(turns []Turn, at func(int) int64) map[int]int {
	var out map[int]int
	for x := range turns {
		t := &turns[x]
		first := slices.IndexFunc(t.Calls, func(c Call) bool { return c.Turn == t.User })
		if !t.Usable || !t.Interrupted || first < 0 {
			continue
		}
		// Never before a turn its own request shows: it ran after that.
		after := int64(math.MinInt64)
		for y := range turns {
			if o := &turns[y]; y != x && o.Conv == t.Conv && slices.Contains(t.Calls[first].History, o.User) {
				after = max(after, at(y))
			}
		}
		best := -1
		for y := range turns {
			o := &turns[y]
			if y == x || o.Conv != t.Conv || !o.Usable || o.Outcome != OK || at(y) >= at(x) || at(y) <= after ||
				slices.Contains(t.Calls[first].History, o.User) {
				continue
			}
			shows := false
			reached := false
			for _, c := range o.Calls {
				if c.Turn == o.User {
					reached = true
					shows = shows || slices.Contains(c.History, t.User)
				}
			}
			if reached && !shows && (best < 0 || at(y) < at(best)) {
				best = y
			}
		}
		if best >= 0 {
			if out == nil {
				out = map[int]int{}
			}
			out[x] = best
		}
	}
	return out
}

// RanAt is when the server ran t, as far as the client can tell: when its
// first call reached the model, or, without one, when it was sent. It is
// what ApplyStep orders a step's turns by.
func (t Turn) RanAt() int64 {
	for _, c := range t.Calls {
		if c.Turn == t.User && t.Usable {
			return c.At
		}
	}
	return t.Invoke
}

// Restart records that the server was stopped and started again on the
// same data, gracefully or by a crash, between steps. changed says that
// the agent source every conversation was bound under is now loaded from
// a reference with another query (the same stable key), and ambiguous
// that several loaded references now share that stable key. Every
// committed turn must still be there (T7); a conversation with one must
// resume through its stable key after a change, and be refused with 409
// while the key is ambiguous (T8). Nothing is running after a restart.
func (m *Model) Restart(changed, ambiguous bool) {
	m.ambiguous = ambiguous
	for _, cv := range m.convs {
		cv.mayRun = false
		cv.unchanged = false
		cv.ambiguous = ambiguous && cv.committed
		if !cv.committed {
			continue
		}
		cv.restarted = true
		if changed || ambiguous {
			cv.resume = T8
		} else if cv.resume == "" {
			cv.resume = T7
		}
	}
}

// checkReplay judges what the server replayed of t's conversation before
// t (Turn.Replay): another conversation's token in it is T5's, a failed
// turn's message T1's, and any other difference from the committed
// history, each unknown turn whole or absent, T7's (a replay comes only
// after a restart). The replay resolves nothing: the model's own window
// does.
func (m *Model) checkReplay(t Turn, cv *conv) *Violation {
	if !t.Replayed {
		return nil
	}
	m.checked.add(T7)
	if len(t.ReplayForeign) > 0 {
		return &Violation{Invariant: T5, Conv: t.Conv, Turn: t.User, Observed: t.ReplayForeign,
			Reason: fmt.Sprintf("the session's replay (session/load) shows %s, of a conversation of an earlier check on the same agent: "+
				"conversations leak into each other", FormatTokens(t.ReplayForeign))}
	}
	for _, tok := range t.Replay {
		if owner, ok := m.ownerOf(tok); ok && !sameFamily(owner, cv) {
			return &Violation{Invariant: T5, Conv: t.Conv, Turn: t.User, Observed: t.Replay,
				Reason: fmt.Sprintf("the session's replay (session/load) shows %s, a token of another conversation", tok)}
		}
	}
	if _, ok := cv.line.match(append(slices.Clone(t.Replay), replayEnd), replayEnd); ok {
		return nil
	}
	for _, tok := range t.Replay {
		if cv.line.holds(tok) {
			continue
		}
		leftover := func(inv Invariant, kind Kind, what string) *Violation {
			return &Violation{Invariant: inv, Conv: t.Conv, Turn: tok, Kind: kind, Observed: t.Replay, Expected: cv.line.Tokens(),
				Reason: fmt.Sprintf("the session's replay (session/load) shows %s, %s", tok, what)}
		}
		switch {
		case cv.line.failedWith(tok) != 0:
			return leftover(T1, LeftoverFailed, "a turn that failed")
		case cv.line.wasInterrupted(tok):
			return leftover(T10, LeftoverInterrupted, "a turn whose client cancelled it, which the server dropped")
		case slices.Contains(cv.line.dropped(), tok):
			return leftover(T6, LeftoverUnknown, "a turn whose outcome the client never learned, shown not committed")
		}
	}
	v := &Violation{Invariant: T7, Conv: t.Conv, Turn: t.User, Observed: t.Replay, Expected: cv.line.Tokens(),
		Reason: "the session's replay (session/load) is not the committed history (each turn whose outcome the client never learned whole or absent)"}
	for _, tok := range flatten(cv.line.segs(), false) {
		if !slices.Contains(t.Replay, tok) {
			v.Kind, v.Reason = Lost, fmt.Sprintf("the session's replay (session/load) lacks %s, of a committed turn", tok)
			break
		}
	}
	return v
}

// replayEnd closes a replay for Line.match, which matches a history
// followed by a new user message: no token is empty.
const replayEnd Token = ""

// checkResume judges the first turns of a conversation after a restart:
// one that was refused before any model call with 404 or a server error
// did not resume (T8 after a source change, T7 otherwise), unless it was
// a busy conversation's refusal or a front's (see below); while the
// source's stable key is ambiguous, anything but a 409 without a model
// call is a silent pick or a wrong refusal (T8). It reports whether the
// resume is decided.
func (m *Model) checkResume(t Turn, cv *conv, step []Turn) (*Violation, bool) {
	called := t.reached()
	if t.Outcome == Unknown && t.Status == 0 && !called || t.Outcome == Fail && !called && t.Gateway {
		// It showed nothing (a front's status, for a replica it lost,
		// included): the next turn will.
		return nil, false
	}
	if cv.ambiguous {
		if h := firstOwnHistory(t); h != nil {
			if _, ok := cv.line.match(h, t.User); !ok {
				// The history is wrong, whichever source served it: that
				// is the more specific finding (T7, T2), judged below.
				return nil, false
			}
		}
		m.checked.add(T8)
		switch {
		case called || t.Outcome == OK:
			return &Violation{Invariant: T8, Conv: t.Conv, Turn: t.User,
				Reason: "the conversation resumed although several loaded agent sources share its stable key: a silent pick; " +
					"the resume must be refused with 409 and change nothing"}, true
		case t.Outcome == Fail && t.Status != 409 && !m.survived && (t.Status == 404 || t.Status >= 500):
			// Lost, maybe by any restart: not shown to be the sources'
			// doing until a conversation has resumed after a plain one.
			return &Violation{Invariant: T7, Conv: t.Conv, Turn: t.User,
				Reason: fmt.Sprintf("the conversation did not resume after a restart (one that also loaded several agent sources under its stable key, "+
					"but no conversation has yet resumed after a restart that kept its source): %d before any model call", t.Status)}, true
		case t.Outcome == Fail && t.Status != 409:
			return &Violation{Invariant: T8, Conv: t.Conv, Turn: t.User,
				Reason: fmt.Sprintf("several loaded agent sources share the conversation's stable key, and the resume got %d; want 409", t.Status)}, true
		}
		return nil, false
	}
	busy := slices.ContainsFunc(step, func(o Turn) bool { return o.Conv == t.Conv && o.User != t.User && o.overlaps(t) })
	if t.Outcome == Fail && !called && t.Status > 409 && t.InTakeover {
		// Still the killed turn's, within the server's declared
		// takeover bound: the next turn will show the resume.
		return nil, false
	}
	if t.Status == 409 || t.Outcome == Fail && t.WaitedOut && busy {
		// A refusal for a busy conversation, judged as such (T4): under
		// reject, a turn sent at once with this one may be running; under
		// serialize, a bounded wait behind one may end. It says nothing
		// of how the resume went.
		return nil, false
	}
	if t.Outcome == Fail && !called && slices.ContainsFunc(step, func(o Turn) bool {
		return o.Conv == t.Conv && o.User != t.User && o.overlaps(t) && o.resumed()
	}) {
		// A turn sent at once with it resumed the conversation: this one
		// failing before its model call shows how the server takes two
		// turns at once (T4), not that the conversation did not resume.
		return nil, false
	}
	inv := cv.resume
	m.checked.add(inv)
	if t.Outcome == Fail && !called && (t.Status == 404 || t.Status >= 500) {
		reason := fmt.Sprintf("the conversation did not resume after a restart: %d before any model call", t.Status)
		switch {
		case inv == T8 && m.survived:
			reason = fmt.Sprintf("the conversation did not resume after a restart that loads its agent source under another query "+
				"(the same stable key): %d before any model call; it must resume through the stable key", t.Status)
		case inv == T8:
			// Not shown to be the change's: no conversation has resumed
			// after a plain restart yet.
			inv = T7
			reason = fmt.Sprintf("the conversation did not resume after a restart (one that also loaded its agent source under another query, "+
				"but no conversation has yet resumed after a restart that kept it): %d before any model call", t.Status)
		}
		return &Violation{Invariant: inv, Conv: t.Conv, Turn: t.User, Reason: reason}, true
	}
	resumed := called || t.Outcome == OK
	m.survived = m.survived || resumed && inv == T7
	return nil, resumed
}

// resumed reports whether t reached the model with a request of its own,
// or ended ok: its conversation was there to run it on.
func (t Turn) resumed() bool { return t.Outcome == OK || t.reached() }

// apply applies t, a turn of step, on its conversation cv; k, if not nil,
// is a step known ahead for it.
func (m *Model) apply(t Turn, cv *conv, step []Turn, k *Known) *Violation {
	if t.Unsent {
		if cv.resume != "" && t.Status != 0 {
			v, _ := m.checkResume(t, cv, step)
			return v
		}
		return nil
	}
	for _, calls := range [2][]Call{t.Calls, t.Aux} {
		for _, call := range calls {
			if len(call.Foreign) > 0 {
				// First: what else the call shows may follow from it.
				return &Violation{Invariant: T5, Conv: t.Conv, Turn: t.User, Observed: call.Foreign,
					Reason: fmt.Sprintf("a model request of this conversation carried %s, of a conversation of an earlier check on the same server: "+
						"conversations leak into each other", FormatTokens(call.Foreign))}
			}
			// Whatever a request is for, its tool calls and results must
			// pair.
			if v, id := m.checkToolPairs(t, call); v != nil {
				return m.leftoverCall(t, cv, v, id, call)
			}
		}
	}
	if v := m.checkStopped(t); v != nil {
		return v
	}
	for k, calls := range [2][]Call{t.Calls, t.Aux} {
		for _, call := range calls {
			if k == 0 && t.Usable && call.Turn == t.User {
				continue // the turn's own calls: below
			}
			// An auxiliary call (a title, a summary), or what a refused
			// request set off: it may not mix conversations.
			if v := m.checkMixed(t, call); v != nil {
				return v
			}
		}
	}
	if t.Usable && (cv.resume != "" || cv.ambiguous) {
		v, decided := m.checkResume(t, cv, step)
		if v != nil {
			return v
		}
		if decided {
			cv.resume = ""
		}
	}
	switch {
	case !t.Usable || t.Status != 409 || t.Outcome != Fail || cv.ambiguous:
	case m.ambiguous && !cv.committed:
		// A new conversation naming an agent several sources provide may
		// be refused too.
	default:
		if v := m.checkConflict(t, cv, step); v != nil {
			return v
		}
	}
	if v := m.checkWaited(t, cv, step); v != nil {
		return v
	}
	if t.Status == 409 && (cv.ambiguous || m.ambiguous && !cv.committed) {
		// A refusal for an ambiguous source (T8), not for a busy
		// conversation: its turn is a failed one like any other, and its
		// message seen later is T1's, not a refused concurrent request's.
		t.Status = 0
	}
	line := cv.line
	if t.Usable {
		for _, call := range t.Calls {
			if call.Turn == t.User {
				// An invariant counts as evaluated only where a call could
				// break it, so that "evaluated" means "exercised".
				if cv.failed {
					m.checked.add(T1)
				}
				if cv.committed {
					m.checked.add(T2)
				}
				if others := m.live - b2i(cv.live); others > 0 {
					m.checked.add(T5)
				}
				if line.pending() > 0 {
					m.checked.add(T6)
				}
				if cv.restarted {
					m.checked.add(T7)
				}
				if cv.interrupted {
					m.checked.add(T10)
				}
			}
		}
	} else if cv.committed && (t.Status != 0 || len(t.Calls) > 0 || t.TimedOut) {
		// Only a conversation with a committed turn has something to
		// replay, and a request that got no answer at all shows nothing.
		m.checked.add(T3)
	}
	var next Line
	var v *Violation
	if k.knows(line, &t) {
		next = k.to
	} else {
		next, v = line.Step(t)
	}
	if v != nil {
		v = forkOf(t, line, step, v)
	}
	if v != nil && m.mayHaveForgotten(cv) {
		// Forgotten whole, and starting over: the turn runs on nothing
		// but itself, as on a new conversation. Half a history is no
		// eviction, and stays the violation it is.
		if fresh, fv := (Line{}).Step(t); fv == nil {
			next, v = fresh, nil
			m.evictions++
			cv.failed, cv.interrupted, cv.shown, cv.unchanged = false, false, nil, false
		}
	}
	if t.reached() || t.Outcome == OK {
		cv.lastUse = m.steps
	}
	if v != nil && v.Invariant == T2 && v.Kind == Lost && cv.restarted {
		// A committed turn went missing across a restart: durability,
		// whether or not the restart also changed the agent's source (T8
		// is about resuming at all, T7 about what a resume finds). A
		// committed turn shown twice, or out of order, stays T2's: a
		// server that does so without a restart too is one finding, not
		// two.
		v.Invariant = T7
		v.Reason = "after a restart of the server, " + v.Reason
	}
	if v != nil {
		// A call the line accepts carries nothing but the line's own tokens,
		// so tokens of another conversation (T5) need looking for only
		// here; where there are some, they are what broke.
		for _, call := range t.Calls {
			if t.Usable && call.Turn == t.User {
				if fv := m.checkForeign(t, cv, call); fv != nil {
					return fv
				}
			}
		}
		return v
	}
	if !t.Usable && next.last != line.last {
		// A continuation that committed a reply of its own on a kept
		// message (Line.continued).
		cv.line, cv.lined, cv.committed = next, true, true
	}
	if t.Usable {
		if v := m.checkKept(t, cv, next); v != nil {
			return forkOf(t, line, step, v)
		}
		first := true
		for _, call := range t.Calls {
			if call.Turn == t.User {
				if v := m.checkToolOwners(t, cv, next, call, first); v != nil {
					return v
				}
				first = false
			}
		}
		// Last: a leaked message is T1's, a leaked tool call T1's or T10's;
		// what is left to see is how the committed ones are shown.
		if v := m.checkShown(t, cv); v != nil {
			return v
		}
		// A 409 says nothing of whether an earlier unknown turn has ended:
		// the conversation may still be busy after one.
		refused := t.Outcome == Fail && t.Status == 409
		cv.line, cv.lined, cv.mayRun = next, true, t.Outcome == Unknown || t.Open || (cv.mayRun && refused)
		cv.failed = cv.failed || t.Outcome == Fail || t.Unstored
		cv.committed = cv.committed || t.Outcome == OK && !t.Unstored
		if !cv.live && (t.Outcome == OK || t.Outcome == Unknown) {
			cv.live = true
			m.live++
		}
		cv.interrupted = cv.interrupted || t.Interrupted || t.Detached || t.Abandoned
		for _, c := range t.Calls {
			if c.Turn == t.User {
				cv.restarted = false // a call showed the history whole
			}
		}
		if t.Outcome != Fail {
			// It may have committed something. A turn that failed did not:
			// the next turn's first call must show the committed tool
			// calls as the last one did (T11).
			cv.unchanged = false
		}
	}
	return nil
}

// forkOf names T4 a violation v of turn t, stepped from line, that turns
// of the same step running at once with t on its conversation explain: a
// fork is T4 wherever it shows. Where two turns of one conversation run
// at once on one history, each may see the other's message without its
// reply, or in an order no line has, or the message of one that went on
// to fail or be interrupted, while it still ran; the same tokens on a
// line run one turn at a time would be a leftover (T1, T6, T10) or a
// loss (T2), and the violation is named so before this. It is the fork
// only if the history, without the tokens of the turns beside t (each at
// most once), is the line without them: nothing else is wrong with it. A
// turn beside t is one of its conversation in the step, sent before t
// returned and returned after t was sent, that may still have run when
// t's model request came (runningAt): what a turn kept after it ended,
// and the reply of one that failed or was interrupted, are their own
// invariants'.
func forkOf(t Turn, line Line, step []Turn, v *Violation) *Violation {
	if v.Invariant == T4 || len(v.Observed) == 0 || !t.Usable {
		return v
	}
	i := slices.IndexFunc(t.Calls, func(c Call) bool { return c.Turn == t.User && slices.Equal(c.History, v.Observed) })
	if i < 0 {
		return v // not a call of the turn's own that broke it
	}
	at := t.Calls[i].At
	beside := map[Token]Token{} // a token of a turn beside t: that turn
	for _, o := range step {
		if o.Conv != t.Conv || o.User == t.User || !o.Usable || o.Unsent || o.Unstored || o.Status == 409 ||
			o.Invoke >= t.Return || t.Invoke >= o.Return || !o.runningAt(at) {
			continue
		}
		beside[o.User] = o.User
		if !o.Interrupted && o.Outcome != Fail {
			// A reply of a turn that failed or was interrupted is never
			// one a turn may see, running or not: its own invariant's.
			beside[o.User.Reply()] = o.User
		}
	}
	if len(beside) == 0 {
		return v
	}
	var rest []Token
	seen := map[Token]bool{}
	var shown []Token
	for _, tok := range v.Observed {
		o, ok := beside[tok]
		switch {
		case !ok:
			rest = append(rest, tok)
		case seen[tok]:
			return v // twice: no fork explains it
		default:
			seen[tok] = true
			if !slices.Contains(shown, o) {
				shown = append(shown, o)
			}
		}
	}
	if len(shown) == 0 {
		return v
	}
	if _, ok := line.without(beside).match(rest, t.User); !ok {
		return v
	}
	return &Violation{Invariant: T4, Conv: t.Conv, Turn: t.User, Expected: v.Expected, Observed: v.Observed,
		Reason: fmt.Sprintf("this turn ran at the same time as %s, on one history: its model request shows %s while that ran, a fork; "+
			"turns on one conversation must form one line (were they run one at a time: %s)", FormatTokens(shown),
			tokensOf(v.Observed, seen), v.Reason)}
}

// runningAt reports whether the server was still running t at tick at, as
// far as the client can tell: before its client learned it ended ok; for
// one whose client disconnected (Interrupted), before it disconnected,
// where no other turn may take over from it (Held);
// for one that failed, or whose outcome is unknown, by its calls
// (runningBy). One whose client gave up waiting (Abandoned), or that
// the server runs on after its client left (Detached), counts by its
// calls too: a server that runs one turn at a time may end it in part at
// any time after its client left (T10) and only then run the next, so
// its client's leaving shows nothing of when it ended.
func (t Turn) runningAt(at int64) bool {
	switch {
	case t.Interrupted:
		return at < t.Held
	case t.Outcome == OK:
		return at < t.Return
	}
	return runningBy(t.callTimes(), at)
}

// callTime is when a model request of a turn came (Call.At), and the
// latest arrival the model had seen when it began to answer it
// (Call.Unanswered).
type callTime struct{ at, unanswered int64 }

// callTimes are the times of t's own model requests.
func (t Turn) callTimes() []callTime {
	var out []callTime
	for _, c := range t.Calls {
		if c.Turn == t.User {
			out = append(out, callTime{c.At, c.Unanswered})
		}
	}
	return out
}

// runningBy reports whether a turn whose model requests came at times
// was still running at tick at: one of them came later, or one came
// before and the model had not begun to answer it by then: the turn
// cannot have ended before.
func runningBy(times []callTime, at int64) bool {
	return slices.ContainsFunc(times, func(c callTime) bool { return c.at > at || c.at < at && at <= c.unanswered })
}

// tokensOf are the tokens of history that pick holds, in order, for a
// reason.
func tokensOf(history []Token, pick map[Token]bool) string {
	var out []Token
	for _, tok := range history {
		if pick[tok] {
			out = append(out, tok)
		}
	}
	return FormatTokens(out)
}

// mayHaveForgotten reports whether a server that forgets (Policies.Forgets)
// may have evicted cv: at least its capacity of other conversations may
// have been used since cv surely was last, so that its cache, least
// recently used first, may hold cv no more. Every bound is taken the way
// that allows more evictions, never fewer: any request on another
// conversation counts as a use of it, refused or not, and one in the same
// step as cv's last use (they ran at once) as a later one; of cv's own,
// only a turn that surely used it.
func (m *Model) mayHaveForgotten(cv *conv) bool {
	if m.policies.Forgets == 0 || cv.lastUse == 0 {
		return false
	}
	since := 0
	for _, o := range m.convs {
		if o != cv && o.touched >= cv.lastUse {
			since++
		}
	}
	return since >= m.policies.Forgets
}

// Touch records that a request named ref in the step applied last, though
// the model does not judge it (its conversation was set aside): a cache
// may have used the conversation all the same (Policies.Forgets).
func (m *Model) Touch(ref ConversationRef) {
	if cv := m.convs[ref]; cv != nil {
		cv.touched = max(m.steps, 1)
	}
}

// Evictions is how many turns found their conversation forgotten by a
// server that forgets, and were judged as starting over.
func (m *Model) Evictions() int { return m.evictions }

// checkConflict judges a 409 by the declared policy (T4): a serializing
// server must make a concurrent request wait, and a rejecting one may
// refuse only a request sent while another turn of the conversation may
// still have been running.
func (m *Model) checkConflict(t Turn, cv *conv, step []Turn) *Violation {
	m.checked.add(T4)
	if m.policies.Concurrency == Serialize {
		return &Violation{Invariant: T4, Conv: t.Conv, Turn: t.User,
			Reason: "the server answered 409, but it declares the serialize policy: a concurrent request must wait its turn"}
	}
	if cv.mayRun {
		return nil
	}
	for _, o := range step {
		if o.Conv == t.Conv && o.User != t.User && o.overlaps(t) {
			return nil
		}
	}
	return &Violation{Invariant: T4, Conv: t.Conv, Turn: t.User,
		Reason: "spurious 409: no other turn of the conversation was running when the request was sent; " +
			"the reject policy allows 409 only while one may be"}
}

// checkWaited judges a refusal under the serialize policy (T4): a request
// refused (any status from 409 up) before any model call of its own, while
// another turn of its conversation was running, was refused instead of
// waiting its turn, unless it came only after the server's model timeout
// (WaitedOut: a server may bound the wait), or is a front's (Gateway). A
// 409 is checkConflict's.
func (m *Model) checkWaited(t Turn, cv *conv, step []Turn) *Violation {
	// A refusal is a status past 409, or a failure streamed after a 200
	// (an error chunk, a failure event) before any model call: the same
	// refusal in another form (openclaw #84575's streamed one).
	streamed := t.Status >= 200 && t.Status <= 299
	if m.policies.Concurrency != Serialize || !t.Usable || t.Outcome != Fail || t.Status <= 409 && !streamed || t.WaitedOut || t.InTakeover || t.Gateway ||
		cv.ambiguous || m.ambiguous && !cv.committed || t.reached() {
		return nil
	}
	var ahead *Turn
	for i := range step {
		o := &step[i]
		if o.Conv != t.Conv || o.User == t.User || !o.overlaps(t) || !o.reached() {
			continue
		}
		ahead = o
	}
	if ahead == nil {
		return nil
	}
	m.checked.add(T4)
	got := fmt.Sprint(t.Status)
	if streamed {
		got = fmt.Sprintf("%d and a failure in its stream", t.Status)
	}
	return &Violation{Invariant: T4, Conv: t.Conv, Turn: t.User,
		Reason: fmt.Sprintf("refused instead of waiting its turn: the request got %s before any model call while turn %s of the conversation was running; "+
			"the server declares the serialize policy, so it must wait (a bounded wait may end in a refusal only once the model timeout has passed)",
			got, ahead.User)}
}

// ownerOf is the conversation tok was sent on or written for, if any:
// owner, once the turns in sent are entered in it, in order (a token sent
// again on another conversation belongs to the later one).
func (m *Model) ownerOf(tok Token) (*conv, bool) {
	if len(m.sent) > 0 {
		if len(m.owner) == 0 {
			m.owner = make(map[Token]*conv, 2*len(m.sent))
		}
		for _, s := range m.sent {
			m.owner[s.user] = s.cv
			m.owner[s.user.Reply()] = s.cv
		}
		m.sent = m.sent[:0]
	}
	owner, ok := m.owner[tok]
	return owner, ok
}

// checkMixed finds a call that carries tokens of more than one conversation
// (T5): whatever the call is for, one conversation leaks into another.
func (m *Model) checkMixed(t Turn, call Call) *Violation {
	var first *conv
	for _, tok := range call.History {
		owner, ok := m.ownerOf(tok)
		switch {
		case !ok:
		case first == nil:
			first = owner
		case !sameFamily(owner, first):
			return &Violation{Invariant: T5, Conv: t.Conv, Turn: t.User,
				Reason: fmt.Sprintf("a model request made during this step carries tokens of conversation %s and of conversation %s (%s)",
					first.ref, owner.ref, tok),
				Observed: call.History}
		}
	}
	return nil
}

// checkForeign finds a token of a conversation other than cv, t's, in call
// (T5); one of another branch of cv's own base is a fork (T4). A branch's
// inherited tokens are its own.
func (m *Model) checkForeign(t Turn, cv *conv, call Call) *Violation {
	for _, tok := range call.History {
		if owner, ok := m.ownerOf(tok); ok && owner != cv && !cv.inherited[tok] {
			if sameFamily(owner, cv) {
				return &Violation{Invariant: T4, Conv: t.Conv, Turn: t.User,
					Reason: fmt.Sprintf("the model request carries %s, a turn of %s, another branch of the same base: "+
						"branches each see their base and their own turns, never another's; two branches ran as one line, a fork", tok, owner.ref),
					Expected: expected(cv.line.segs(), t.User),
					Observed: call.History}
			}
			return &Violation{Invariant: T5, Conv: t.Conv, Turn: t.User,
				Reason:   fmt.Sprintf("the model request carries %s, which belongs to conversation %s", tok, owner.ref),
				Expected: expected(cv.line.segs(), t.User),
				Observed: call.History}
		}
	}
	return nil
}

func clip(s string) string {
	if r := []rune(s); len(r) > 80 {
		return string(r[:77]) + "..."
	}
	return s
}

// checkToolPairs checks a model request's tool traffic (T9): each tool
// call is answered by exactly one tool result with its id before the next
// user message (or the end of the request), and no result stands without
// its call.
func (m *Model) checkToolPairs(t Turn, call Call) (v *Violation, id string) {
	if len(call.Tools) == 0 {
		return nil, ""
	}
	m.checked.add(T9)
	open := map[string]bool{} // called, not answered yet
	seen := map[string]bool{} // called at all
	var order []string        // open, in call order, for a stable report
	unanswered := func() string {
		for _, id := range order {
			if open[id] {
				return id
			}
		}
		return ""
	}
	fail := func(reason string, id string) (*Violation, string) {
		return &Violation{Invariant: T9, Conv: t.Conv, Turn: t.User, Reason: reason, Observed: call.History}, id
	}
	for _, e := range call.Tools {
		switch e.Kind {
		case ToolCalled:
			if seen[e.ID] {
				return fail(fmt.Sprintf("the model request asks for the tool call %s twice", e.ID), e.ID)
			}
			seen[e.ID], open[e.ID] = true, true
			order = append(order, e.ID)
		case ToolAnswered:
			switch {
			case open[e.ID]:
				open[e.ID] = false
			case seen[e.ID]:
				return fail(fmt.Sprintf("the model request carries two results for the tool call %s", e.ID), e.ID)
			default:
				return fail(fmt.Sprintf("the model request carries a result for the tool call %s, and no assistant message asks for that call before it", e.ID), e.ID)
			}
		case UserMessage:
			if id := unanswered(); id != "" {
				return fail(fmt.Sprintf("the tool call %s has no result before the next user message: an orphaned tool call", id), id)
			}
		}
	}
	if id := unanswered(); id != "" {
		return fail(fmt.Sprintf("the tool call %s has no result in the model request: an orphaned tool call", id), id)
	}
	return nil, ""
}

// leftoverCall marks v, broken tool pairs in a request of t whose tool
// call id is that of a turn that ended without committing and had to leave
// nothing, as a leftover of that turn: one root cause, one finding, with
// the leftovers the same turn shows under T1 or T10. The orphan keeps its
// name, T9, the most specific (TestOrphanOfInterruptedTurnIsT9). Under
// keep-consistent an interrupted turn may leave its completed rounds, and
// a round cut short is T9's alone (goose #7785).
//
// Where call, the request, also carries that turn's message, it breaks
// the turn's own invariant too (T10 for an interrupted turn, T1 for a
// failed one), by the same trigger: Violation.Also says so.
func (m *Model) leftoverCall(t Turn, cv *conv, v *Violation, id string, call Call) *Violation {
	user, _, ok := ToolTurn(id)
	if !ok || user == t.User || cv == nil {
		return v
	}
	also := Invariant("")
	switch {
	case cv.line.wasInterrupted(user) && !m.policies.KeepConsistent:
		v.Kind, also = LeftoverInterrupted, T10
	case cv.line.failedWith(user) != 0:
		v.Kind, also = LeftoverFailed, T1
	}
	if also != "" && slices.Contains(call.History, user) {
		v.Also = append(v.Also, also)
	}
	return v
}

// checkStopped checks that a turn whose client disconnected did not go
// on (T10): no model call or tool run of it arrived after the server gave
// up on one the model held for it since the disconnect (CarriedOn), and
// none started after the harness let go of what it waited on (Released),
// once the server had said it saw the disconnect, had given up on all of
// it, or had held on past its own timeout (PROTOCOL.md, "Time"). A call
// or run that arrived after the disconnect while the server still waited
// on what the model held, one it had on its way, is neither. What came
// after what is judged, never how long anything took.
func (m *Model) checkStopped(t Turn) *Violation {
	if !t.Interrupted || t.Released == 0 && t.CarriedOn == 0 {
		return nil
	}
	m.checked.add(T10)
	stop := func(what string, at int64, how string) *Violation {
		return &Violation{Invariant: T10, Conv: t.Conv, Turn: t.User,
			Reason: fmt.Sprintf("the client interrupted the turn (left, or cancelled it), and the server started %s (at tick %d) %s; the server must stop the turn", what, at, how)}
	}
	carried := "after it gave up on what the model held for the turn, with nothing of the turn answered since: it carried the turn on"
	released := fmt.Sprintf("once the harness let go of what it waited on (at tick %d)", t.Released)
	carriedOn := t.CarriedOn
	if !t.ownAmong(t.CarriedAfter) {
		carriedOn = 0
	}
	// The turn's first own call after a release that followed a give-up
	// only on calls made beside it may have been on its way: the model
	// answers it, and what the server does with that answer is judged.
	var onItsWay int64
	if len(t.ReleasedAfter) > 0 && !t.ownAmong(t.ReleasedAfter) {
		for _, c := range t.Calls {
			if c.Turn == t.User && c.At > t.Released && (onItsWay == 0 || c.At < onItsWay) {
				onItsWay = c.At
			}
		}
	}
	for _, c := range t.Calls {
		switch {
		case c.Turn != t.User:
		case carriedOn != 0 && c.At == carriedOn:
			return stop("a model call of the turn", c.At, carried)
		case t.Released != 0 && c.At > t.Released && c.At != onItsWay:
			return stop("a model call of the turn", c.At, released)
		}
	}
	for _, r := range t.Runs {
		switch {
		case carriedOn != 0 && r.At == carriedOn:
			return stop("the tool call "+r.ID, r.At, carried)
		case t.Released != 0 && r.At > t.Released:
			return stop("the tool call "+r.ID, r.At, released)
		}
	}
	return nil
}

// checkLateRuns checks the tool runs that came in t's step for a turn of
// an earlier step (Turn.LateRuns): one of an interrupted turn that
// started after the harness let go of what it waited on is T10's, as it
// would have been had it come within its own step (checkStopped). How
// long a server takes to start it decides only in which step it is seen.
func (m *Model) checkLateRuns(t Turn) *Violation {
	for _, r := range t.LateRuns {
		user, _, ok := ToolTurn(r.ID)
		if !ok {
			continue
		}
		was, ok := m.released[user]
		if !ok || r.At <= was.Released {
			continue
		}
		m.checked.add(T10)
		return &Violation{Invariant: T10, Conv: was.Conv, Turn: was.User,
			Reason: fmt.Sprintf("the client interrupted the turn (left, or cancelled it), and the server started the tool call %s (at tick %d, after the turn's step had ended) "+
				"once the harness let go of what it waited on (at tick %d); the server must stop the turn", r.ID, r.At, was.Released)}
	}
	return nil
}

// ownAmong reports whether, of the arrivals the server gave up on that
// came at ats (CarriedAfter, ReleasedAfter), one was t's own call or tool
// run, not only calls made beside the turn: only then was the turn's next
// arrival started after the server stopped waiting on the turn.
func (t Turn) ownAmong(ats []int64) bool {
	for _, at := range ats {
		if slices.ContainsFunc(t.Calls, func(c Call) bool { return c.At == at && c.Turn == t.User }) ||
			slices.ContainsFunc(t.Runs, func(r ToolRun) bool { return r.At == at }) {
			return true
		}
	}
	return false
}

// checkKept judges what a step's call showed of interrupted turns under
// the rollback policy: one kept as its user message is T10 (the line
// allows it for the keep-consistent policy; a reply is never allowed).
// Only a step from a line with pending turns can keep one: an earlier
// step that kept one was judged then.
func (m *Model) checkKept(t Turn, cv *conv, next Line) *Violation {
	if m.policies.KeepConsistent || !cv.interrupted || cv.line.pending() == 0 {
		return nil
	}
	for nd := next.last; nd != nil; nd = nd.prev {
		if !nd.pending && nd.reply == "" {
			return &Violation{Invariant: T10, Conv: t.Conv, Turn: t.User,
				Reason: fmt.Sprintf("%s, of a turn whose client interrupted it mid-turn (left, or cancelled it), reached the model in a later turn: "+
					"the server declares the rollback policy, so an interrupted turn must leave nothing", nd.user),
				Expected: expected(cv.line.segs(), t.User), Observed: firstOwnHistory(t), Kind: LeftoverInterrupted}
		}
	}
	return nil
}

// checkToolOwners checks where the tool calls and results of call, one of
// t's own, come from: t itself (after its first call), or a turn the
// conversation holds. One of a turn that failed is T1 (also t's own in its
// first call: an earlier attempt's, seen by its retry), of an interrupted
// turn not kept T10, of an unknown turn not committed T6, of another
// conversation T5.
func (m *Model) checkToolOwners(t Turn, cv *conv, next Line, call Call, first bool) *Violation {
	for _, e := range call.Tools {
		if e.Kind == UserMessage {
			continue
		}
		user, _, ok := ToolTurn(e.ID)
		if ok && user == t.User && first {
			return &Violation{Invariant: T1, Conv: t.Conv, Turn: t.User, Observed: call.History,
				Reason: fmt.Sprintf("the first model request of the turn already carries its tool call %s: an earlier, failed attempt's output; "+
					"a retry must see the last committed history", e.ID)}
		}
		if !ok || user == t.User || next.holds(user) {
			continue
		}
		v := &Violation{Conv: t.Conv, Turn: t.User, Observed: call.History}
		owner, known := m.ownerOf(user)
		switch {
		case known && owner != cv:
			v.Invariant = T5
			v.Reason = fmt.Sprintf("the model request carries the tool call %s of turn %s, which belongs to conversation %s", e.ID, user, owner.ref)
		case next.wasInterrupted(user):
			v.Kind, v.Invariant = LeftoverInterrupted, T10
			v.Reason = fmt.Sprintf("the model request carries the tool call %s of turn %s, whose client interrupted it mid-turn (left, or cancelled it), without that turn's user message: "+
				"an interrupted turn is rolled back, or kept as its user message followed by its completed tool pairs", e.ID, user)
		case next.failedWith(user) != 0:
			v.Kind, v.Invariant = LeftoverFailed, T1
			v.Reason = fmt.Sprintf("the model request carries the tool call %s of turn %s, which failed: a failed turn's output never reaches the model in a later turn", e.ID, user)
		case slices.Contains(next.dropped(), user):
			v.Kind, v.Invariant = LeftoverUnknown, T6
			v.Reason = fmt.Sprintf("the model request carries the tool call %s of turn %s, whose outcome was unknown and which a history showed was not committed", e.ID, user)
		default:
			v.Invariant = T1
			v.Reason = fmt.Sprintf("the model request carries the tool call %s of turn %s, which no turn the conversation holds made", e.ID, user)
		}
		return v
	}
	return nil
}

// checkShown compares what t's first call shows of the committed tool
// calls with what the previous turn's first call showed, when only turns
// that failed came between: those committed nothing, so the server holds
// the same conversation, and a change is a failed turn's working copy
// (its compaction marks, say) showing in the committed one (T11). It
// takes a server's compaction to depend on the committed conversation
// (and the size of the new message, which the harness keeps alike), not
// on turns that failed.
func (m *Model) checkShown(t Turn, cv *conv) *Violation {
	var first *Call
	for i := range t.Calls {
		if t.Calls[i].Turn == t.User {
			first = &t.Calls[i]
			break
		}
	}
	if first == nil {
		return nil
	}
	var shown []string
	for _, e := range first.Tools {
		if user, _, ok := ToolTurn(e.ID); ok && e.Kind == ToolCalled && user != t.User {
			shown = append(shown, e.ID)
		}
	}
	slices.Sort(shown)
	shown = slices.Compact(shown)
	prev, compare := cv.shown, cv.unchanged
	cv.shown, cv.unchanged = shown, true
	if !compare || len(prev) == 0 && len(shown) == 0 {
		return nil
	}
	m.checked.add(T11)
	if slices.Equal(prev, shown) {
		return nil
	}
	var hidden, unhidden []string
	for _, id := range prev {
		if !slices.Contains(shown, id) {
			hidden = append(hidden, id)
		}
	}
	for _, id := range shown {
		if !slices.Contains(prev, id) {
			unhidden = append(unhidden, id)
		}
	}
	reason := "only failed turns came since the previous turn's first model request, so the committed conversation is the same, " +
		"but this turn's first request shows its tool calls differently"
	if len(hidden) > 0 {
		reason += fmt.Sprintf("; hidden now: %s", strings.Join(hidden, " "))
	}
	if len(unhidden) > 0 {
		reason += fmt.Sprintf("; shown now, hidden before: %s", strings.Join(unhidden, " "))
	}
	return &Violation{Invariant: T11, Conv: t.Conv, Turn: t.User,
		Reason: reason + ": a failed turn's working copy (its compaction marks) leaked into the committed conversation"}
}

// firstOwnHistory is the history of t's first own call, nil if none.
func firstOwnHistory(t Turn) []Token {
	for _, c := range t.Calls {
		if c.Turn == t.User {
			return c.History
		}
	}
	return nil
}
