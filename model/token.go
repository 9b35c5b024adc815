// Package model is turncheck's reference model of transactional conversation
// state: what a session server must have committed, given the turns a client
// sent and their outcomes, and the invariants of PROTOCOL.md as checks over
// what the fake model was sent.
//
// The package is pure: no I/O, no clocks, no goroutines. Every message is
// identified by the token it carries, never by its exact text, so servers
// that decorate messages or prepend system prompts are judged fairly.
package model

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Token marks one message: the harness puts a user token ("tc-u7") in every
// user message it sends, and the fake model puts the matching reply token
// ("tc-a7") in every reply it writes.
type Token string

var tokenPattern = regexp.MustCompile(`\btc-[ua][0-9]+\b`)

// checkTag matches the tag the client writes in each user message it
// sends to a server shared by several checks: "(tc", six hex digits, a
// dash, the check's number, ")".
var checkTag = regexp.MustCompile(`\(tc[0-9a-f]{6}-[0-9]+\)`)

// OfAnotherCheck reports whether text carries a check's tag other than
// tag, the current check's, and not tag itself: a message of another
// check's conversation, which can reach this check only through a leak
// (T5).
func OfAnotherCheck(text, tag string) bool {
	return tag != "" && !strings.Contains(text, tag) && checkTag.MatchString(text)
}

// OtherChecks returns the tags of checks other than tag's that text
// carries, in order, each once: which checks the messages of a leak
// came from, so that their steps can be run again before the check they
// leaked into (a saved failure replays on a fresh server).
func OtherChecks(text, tag string) []string {
	var out []string
	for _, t := range checkTag.FindAllString(text, -1) {
		if t != tag && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// Leaks tells, message by message in the order a history holds them, which
// are of another check's conversation, on a server shared by several
// checks whose current check's tag is Tag: a user message that carries
// another check's tag (OfAnotherCheck), and each reply after it to one of
// its tokens. With no Tag it tells none. A model request's and an ACP
// session/load replay's messages are read so. Not safe for concurrent use.
type Leaks struct {
	Tag    string
	leaked map[Token]bool
	from   []string
}

// From are the tags of the other checks whose messages Foreign told so
// far, in the order first met, each once.
func (l *Leaks) From() []string { return l.from }

// Foreign reports whether the message with text, whose tokens are toks,
// a user's (user) or a reply, is another check's.
func (l *Leaks) Foreign(text string, toks []Token, user bool) bool {
	if l.Tag == "" || len(toks) == 0 {
		return false
	}
	if user && !OfAnotherCheck(text, l.Tag) || !user && !l.leaked[toks[0].User()] {
		return false
	}
	if l.leaked == nil {
		l.leaked = map[Token]bool{}
	}
	for _, t := range toks {
		l.leaked[t.User()] = true
	}
	if user {
		for _, t := range OtherChecks(text, l.Tag) {
			if !slices.Contains(l.from, t) {
				l.from = append(l.from, t)
			}
		}
	}
	return true
}

// UserToken returns the n-th user token.
func UserToken(n int) Token { return Token("tc-u" + strconv.Itoa(n)) }

// IsUser reports whether t marks a user message.
func (t Token) IsUser() bool { return strings.HasPrefix(string(t), "tc-u") }

// Reply returns the token of the reply to the user message t.
func (t Token) Reply() Token {
	if !t.IsUser() {
		return t
	}
	return Token("tc-a" + strings.TrimPrefix(string(t), "tc-u"))
}

// User returns the token of the user message that t replies to, or t
// itself if it is a user token.
func (t Token) User() Token {
	if t.IsUser() {
		return t
	}
	return Token("tc-u" + strings.TrimPrefix(string(t), "tc-a"))
}

// Tokens returns the tokens in text, in order.
func Tokens(text string) []Token {
	found := tokenPattern.FindAllString(text, -1)
	if len(found) == 0 {
		return nil
	}
	out := make([]Token, len(found))
	for i, s := range found {
		out[i] = Token(s)
	}
	return out
}

// indexToken is where tok first stands in text as a token, as Tokens would
// find it, -1 if nowhere; without a regular expression: the checker asks
// this of every reply.
func indexToken(text string, tok Token) int {
	for i := 0; ; {
		j := strings.Index(text[i:], string(tok))
		if j < 0 {
			return -1
		}
		start, end := i+j, i+j+len(tok)
		if (start == 0 || !isWordByte(text[start-1])) && (end == len(text) || !isWordByte(text[end])) {
			return start
		}
		i = start + 1
	}
}

// replyIn finds user.Reply() standing in text as a token, and returns it as
// a substring of text: the checker keeps the reply token of every turn
// that ended ok, and taking it from the reply spares building it (the
// token searched for is built on the stack).
func replyIn(text string, user Token) (Token, bool) {
	if !user.IsUser() {
		return replyAt(text, user) // user.Reply() is user itself
	}
	var buf [32]byte
	return replyAt(text, Token(append(append(buf[:0], "tc-a"...), user[len("tc-u"):]...)))
}

// replyAt returns tok as it stands in text, a substring of it.
func replyAt(text string, tok Token) (Token, bool) {
	i := indexToken(text, tok)
	if i < 0 {
		return "", false
	}
	return Token(text[i : i+len(tok)]), true
}

func isWordByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// ConversationRef names a server-side conversation: its id as the client
// sends it, scoped by the API key it was sent with ("" without keys).
type ConversationRef struct {
	Key string `json:"key,omitempty"`
	ID  string `json:"id"`
}

// String renders the reference for people: the quoted id, and the key.
func (c ConversationRef) String() string {
	if c.Key == "" {
		return fmt.Sprintf("%q", c.ID)
	}
	return fmt.Sprintf("%q (key %s)", c.ID, c.Key)
}

// Outcome is what the client learned of a turn (Jepsen's ok / fail / info).
type Outcome int

// The outcomes of a turn.
const (
	// OK: 200 and, when streamed, a clean end. The turn is committed.
	OK Outcome = iota
	// Fail: a status from 400 up, or an error chunk. Nothing was committed.
	Fail
	// Unknown: the client could not learn the outcome. The turn may or may
	// not have been committed; later turns tell.
	Unknown
)

// MarshalText writes the outcome's name.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText reads an outcome's name.
func (o *Outcome) UnmarshalText(b []byte) error {
	for _, c := range []Outcome{OK, Fail, Unknown} {
		if c.String() == string(b) {
			*o = c
			return nil
		}
	}
	return fmt.Errorf("unknown outcome %q", b)
}

// String is "ok", "fail" or "unknown".
func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Fail:
		return "fail"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Call is one request the server made to the model, read as tokens.
type Call struct {
	// History is every token the request carried, in message order.
	History []Token `json:"history"`
	// Turn is the last user token the request carries, or "" if it has
	// none; a call belongs to the turn whose user token this is.
	Turn Token `json:"turn,omitempty"`
	// Tail reports that a user message without a token comes after Turn's
	// (or, with no Turn, that there is one), on its own or merged into
	// Turn's message after the harness's text: a server's appended
	// context, a blank message passed on as if it were the new one, or
	// appended input a client merged into the message before it.
	Tail bool `json:"tail,omitempty"`
	// Trailing reports that a message carrying no token comes after the
	// last one that carries one (an assistant message, a tool's output, a
	// blank user message): something the call appended after the history
	// its tokens show.
	Trailing bool `json:"trailing,omitempty"`
	// At is when the call reached the model, on the run's timeline (the
	// one Turn.Invoke and Turn.Return count on).
	At int64 `json:"at"`
	// Unanswered is the At of the latest call the model had seen arrive
	// when it began to answer this one (its holds over): every call that
	// arrived after this one and at or before it came while this one was
	// at the model, unanswered, and the turn that made it cannot have
	// ended. 0 if the model never began to answer it (the server gave the
	// call up first).
	Unanswered int64 `json:"unanswered,omitempty"`
	// Prompt is a hash of the request's system and developer messages,
	// 0 if it had none. The calls on one turn's way to its answer share
	// it; a call a server makes beside the turn (a title, a summary) has
	// an instruction of its own (SplitAuxiliary).
	Prompt uint32 `json:"prompt,omitempty"`
	// Offers reports that the request offered the model tools.
	Offers bool `json:"offers,omitempty"`
	// Tools is the tool traffic the request carried, in message order:
	// each tool call an assistant message asks for, each tool result, and
	// each user message as a boundary between them (T9). Nil when the
	// request carried no tool call and no tool result.
	Tools []ToolEvent `json:"tools,omitempty"`
	// Foreign are tokens the request carried of another check's
	// conversations (on a server shared by several checks, each user
	// message names its check), left out of History: they can reach this
	// check only through a leak between conversations (T5).
	Foreign []Token `json:"foreign,omitempty"`
	// ForeignFrom are the tags of the checks whose messages Foreign's
	// are (OtherChecks), each once: the earlier checks on the server
	// whose steps a replay of the leak runs first.
	ForeignFrom []string `json:"foreignFrom,omitempty"`
}

// ToolEventKind is what a ToolEvent marks.
type ToolEventKind string

// The kinds of ToolEvent.
const (
	// ToolCalled: an assistant message asks for the tool call ID.
	ToolCalled ToolEventKind = "call"
	// ToolAnswered: a tool message answers the tool call ID.
	ToolAnswered ToolEventKind = "result"
	// UserMessage: a user message (ID is ""), which every tool call
	// before it must have been answered by.
	UserMessage ToolEventKind = "user"
)

// ToolEvent is one mark of a model request's tool traffic.
type ToolEvent struct {
	Kind ToolEventKind `json:"kind"`
	ID   string        `json:"id,omitempty"`
}

// ToolRun is one run of a tool that the harness saw start (the lookup
// tool asks the fake model), by the id of the tool call it runs.
type ToolRun struct {
	ID string `json:"id"`
	// At is when it started, on the run's timeline.
	At int64 `json:"at"`
}

// ToolCallRef is what a tool call id the fake model makes names: the turn
// it belongs to (the turn's user token), the round of the turn's tool loop
// (from 1), the call within the round (from 1), and which asking of that
// round it comes from (from 1). A turn's round is asked for more than once
// when the turn is retried, the user token being the retry's too, or when
// a server calls the model again for a round it did not complete: each
// asking gets ids of its own, so that every id is unique in a check and a
// model request that carries two askings of one round still holds each
// call once (T9).
type ToolCallRef struct {
	User   Token
	Round  int
	Call   int
	Asking int
}

// ID is the tool call's id: "tc-k7-2-1" for call 1 of round 2 of the turn
// tc-u7 as first asked, "tc-k7-2-1x3" for the same call of its third
// asking. The first asking carries no ordinal, so that a turn asked once
// has the ids it always had. Only letters, digits and dashes: some agent
// frameworks rewrite any other character of a tool call id (to the
// pattern ^[a-zA-Z0-9_-]+$ that Anthropic's API requires), which would
// hide the turn the id names.
func (r ToolCallRef) ID() string {
	id := fmt.Sprintf("tc-k%s-%d-%d", strings.TrimPrefix(string(r.User), "tc-u"), r.Round, r.Call)
	if r.Asking > 1 {
		id += "x" + strconv.Itoa(r.Asking)
	}
	return id
}

// ToolCallID is the id the fake model gives the i-th tool call (from 1)
// of round r (from 1) of the tool loop of the turn user, as first asked:
// "tc-k7-2-1" (ToolCallRef.ID). The turn it belongs to can be read back
// from it (ToolTurn), so that a tool call seen in any request names its
// conversation and its turn.
func ToolCallID(user Token, round, i int) string {
	return ToolCallRef{User: user, Round: round, Call: i, Asking: 1}.ID()
}

// ParseToolCallID reads a tool call id ToolCallRef.ID made back into what
// it names; false for any other id, and for one ID would not make (a
// leading zero, a round, call or asking of 0, an explicit first asking
// "x1"), so that each tool call has one id.
func ParseToolCallID(id string) (ToolCallRef, bool) {
	rest, ok := strings.CutPrefix(id, "tc-k")
	if !ok {
		return ToolCallRef{}, false
	}
	parts := strings.Split(rest, "-")
	if len(parts) != 3 {
		return ToolCallRef{}, false
	}
	call, asking, again := strings.Cut(parts[2], "x")
	turn, okTurn := number(parts[0])
	round, okRound := number(parts[1])
	i, okCall := number(call)
	if !okTurn || !okRound || !okCall || round < 1 || i < 1 {
		return ToolCallRef{}, false
	}
	r := ToolCallRef{User: UserToken(turn), Round: round, Call: i, Asking: 1}
	if again {
		n, ok := number(asking)
		if !ok || n < 2 {
			return ToolCallRef{}, false
		}
		r.Asking = n
	}
	return r, true
}

// number reads s as a number written as strconv.Itoa writes one that is
// not negative: no sign, no leading zero.
func number(s string) (int, bool) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || strconv.Itoa(n) != s {
		return 0, false
	}
	return n, true
}

// ToolTurn returns the user token of the turn a tool call id of
// ToolCallRef.ID's belongs to, and its round, whichever asking of the
// round it comes from; false for any other id.
func ToolTurn(id string) (user Token, round int, ok bool) {
	r, ok := ParseToolCallID(id)
	if !ok {
		return "", 0, false
	}
	return r.User, r.Round, true
}
