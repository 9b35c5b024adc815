// Package plan holds the steps of a check as data: a Plan is one step (a
// turn, a burst of turns sent at once, a restart), and a Send one request
// of it with what goes wrong with it. Plans are drawn by package traffic,
// executed by package execute, shrunk by package shrink and saved in
// failure files, so they replay exactly.
package plan

import (
	"errors"
	"fmt"
	"strings"

	"pgregory.net/rapid"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// Plan is one step of a run, drawn before anything is sent: the requests
// to send at once (one, for a sequential step), what goes wrong with each,
// and the order in which the model lets their calls go on. It is a plain
// value: executing the same plans against a fresh server replays the run.
type Plan struct {
	// Action names the state-machine action that drew it.
	Action string `json:"action"`
	// Sends are the requests, sent in this order, each once the ones
	// before it have come to rest (answered, held by the model, or queued
	// behind another turn).
	Sends []Send `json:"sends"`
	// Release is the order in which held model calls go on: indexes into
	// Sends. When every request has come to rest, the first of them whose
	// call the model holds is let go (or aborted, or timed out, as its Send
	// says).
	Release []int `json:"release"`
	// Restart, if set, makes the plan a restart of the server between
	// turns, with no requests; or, for a crash with one request, a crash
	// while that request's model call is held: the turn is in flight when
	// the server dies.
	Restart *Restart `json:"restart,omitempty"`
	// Earlier, if set, says the step is not the failing check's own but
	// one of an earlier check on the server the run's checks shared,
	// whose messages the failing check met (a leak between checks): only
	// on a server that served those steps first does the failure show
	// again. A replay runs each earlier check's steps, in order, in a
	// session of its own on one server, before the failing check's
	// (Sessions).
	Earlier Origin `json:"earlier,omitzero"`
}

// Origin names the earlier session on a shared server a step of a saved
// failure comes from (Plan.Earlier); the zero Origin is the failing
// check's own.
type Origin struct {
	// Check is that session's check, its number in the run from 1; 0 for
	// a replay the harness ran on the server (shrinking a finding).
	Check int `json:"check,omitempty"`
	// Session numbers the session among those the server served in the
	// run, from 1: steps of one session share it.
	Session int `json:"session"`
}

// String names the origin for a person: "check 3", "a replay the
// shrinker ran (session 5 on the server)", or "the failing check" for
// the zero Origin.
func (o Origin) String() string {
	switch {
	case o.Check > 0:
		return fmt.Sprintf("check %d", o.Check)
	case o.Session > 0:
		return fmt.Sprintf("a replay the shrinker ran (session %d on the server)", o.Session)
	}
	return "the failing check"
}

// Sessions splits plans into the sessions a replay runs them in, in
// order: each run of consecutive steps of one origin (Plan.Earlier) is
// one, the earlier checks' and the failing check's own alike.
func Sessions(plans []Plan) [][]Plan {
	var out [][]Plan
	for i, p := range plans {
		if i == 0 || p.Earlier != plans[i-1].Earlier {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], p)
	}
	return out
}

// Restart stops the server and starts it again on the same data.
type Restart struct {
	// Crash kills the server as kill -9 does; otherwise it is stopped
	// gracefully.
	Crash bool `json:"crash,omitempty"`
	// Sources are the queries of the references to the profile's agent
	// that the server loads from now on, one reference each; nil keeps
	// them as they were. References that differ only in their query share
	// a stable key: with two of them, every resume must be refused (T8).
	Sources []string `json:"sources,omitempty"`
	// Replica, if set, restarts only that replica of a server that runs
	// as several (targets.Replicated), while the others go on serving; a
	// turn the step sends goes to it. Sources are then nil: every replica
	// loads the agent as the others do.
	Replica *int `json:"replica,omitempty"`
}

// String says what the restart does, for a person.
func (r Restart) String() string {
	how := "graceful restart"
	if r.Crash {
		how = "crash (kill -9) and restart"
	}
	if r.Replica != nil {
		how += fmt.Sprintf(" of replica %d alone", *r.Replica)
	}
	switch len(r.Sources) {
	case 0:
		return how
	case 1:
		return fmt.Sprintf("%s, loading the agent with ?%s", how, r.Sources[0])
	}
	return fmt.Sprintf("%s, loading the agent twice, with ?%s: one stable key, two sources", how, strings.Join(r.Sources, " and ?"))
}

// Send is one request of a plan and what goes wrong with it.
type Send struct {
	Conv model.ConversationRef `json:"conversation"`
	// From is the conversation Conv branches from, set on Conv's first
	// turn under a protocol whose conversations branch by design (the
	// Responses API: the turn chains from From's last response, as a turn
	// on From sent at the same time may); nil otherwise.
	From *model.ConversationRef `json:"from,omitempty"`
	// Replica is the replica of the server the request goes to, for a
	// server that runs as several (targets.Replicated); 0 is the first.
	Replica int `json:"replica,omitempty"`
	// Token is the user token of the request's new message; "" for a
	// request without a usable one, which the server must refuse (T3).
	Token model.Token `json:"token,omitempty"`
	// Messages are the request's messages, as sent.
	Messages []openai.Message `json:"messages"`
	Stream   bool             `json:"stream,omitempty"`
	// NoStore asks a Responses API server not to store the turn's
	// response (store: false): it runs and is answered as any turn, and is
	// no one's base; the conversation goes on from the response before it.
	NoStore bool `json:"noStore,omitempty"`
	// InConversation names the turn's conversation with the Responses
	// API's conversation parameter instead of chaining it from a
	// response: its input is appended to that conversation, and its turns
	// run one after another, as under chat.
	InConversation bool `json:"inConversation,omitempty"`
	// Rounds are the tool calls the fake model asks for before it
	// replies, round by round (a server that offers no tools gets the
	// reply at once).
	Rounds []faults.Round `json:"rounds,omitempty"`
	// Fault is what the fake model does with the turn's calls once the
	// first is let go: at the call of the tool loop Fault.Round says.
	Fault faults.Fault `json:"fault,omitzero"`
	// Abort: the client drops the connection while the model holds the
	// turn at AbortAt (nil: its first call, before any answer), so the
	// turn is interrupted and its outcome unknown.
	Abort   bool          `json:"abort,omitempty"`
	AbortAt *faults.Point `json:"abortAt,omitempty"`
	// TaskAbort says how an A2A client aborts ("" under the other
	// protocols): AbortCancel sends tasks/cancel, AbortDrop drops the
	// task's connection (always so for a message/send, whose task the
	// client learns of only at its end).
	TaskAbort string `json:"taskAbort,omitempty"`
	// FinishedTask says that an A2A message names its conversation's last
	// finished task (taskId), as a follow-up to it: an invalid
	// continuation, which A2A refuses (a task that ended does not run
	// again).
	FinishedTask bool `json:"finishedTask,omitempty"`
	// Net, if set, breaks a link of the replica the request goes to (of a
	// targets.LinkBreaker; behind a front, the one that serves it, as its
	// model calls show) once the model holds the turn's first call,
	// and heals it once the request has ended: the turn is in flight when
	// its replica loses its store, or its client, or both go slow.
	Net *targets.NetFault `json:"net,omitempty"`
	// Deny says that the client denies the permission requests the agent
	// makes while the turn runs (ACP's session/request_permission), rather
	// than granting them.
	Deny bool `json:"deny,omitempty"`
}

// The ways an A2A client aborts a task (Send.TaskAbort).
const (
	AbortCancel = "tasks/cancel"
	AbortDrop   = "drop"
)

// DropsTask reports whether an A2A client's abort of s drops the task's
// connection: as drawn, or always for a message/send (not streamed),
// whose task the client learns of only at its end, and which a shrunk
// plan may have made of a streamed turn drawn to send tasks/cancel.
func (s Send) DropsTask() bool {
	return s.TaskAbort == AbortDrop || s.TaskAbort != "" && !s.Stream
}

// String says what the fake model does, and what is injected, for a
// person reading a report.
func (s Send) String() string { return s.In("") }

// In is String in the words of protocol p: an ACP client's abort is its
// session/cancel, not a dropped connection.
func (s Send) In(p targets.Protocol) string {
	var parts []string
	if len(s.Rounds) > 0 {
		rounds := make([]string, len(s.Rounds))
		for i, r := range s.Rounds {
			rounds[i] = strings.Join(r, "+")
		}
		parts = append(parts, "tools "+strings.Join(rounds, ", then "))
	}
	switch {
	case s.Abort && s.TaskAbort != "" && !s.DropsTask():
		parts = append(parts, "client-abort: the client sends tasks/cancel while the model holds the turn at "+abortPoint(s.AbortAt))
	case s.Abort && s.DropsTask():
		parts = append(parts, "client-abort: the client drops the task's connection while the model holds the turn at "+abortPoint(s.AbortAt))
	case s.Abort && p == targets.ACP:
		parts = append(parts, "client-abort: the client sends session/cancel while the model holds the turn at "+abortPoint(s.AbortAt))
	case s.Abort:
		parts = append(parts, "client-abort: the client drops the connection while the model holds the turn at "+abortPoint(s.AbortAt))
	case s.Net != nil:
		parts = append(parts, fmt.Sprintf("%s of the turn's replica, from the turn's first model call to its end", s.Net))
	case s.Fault.Kind != faults.None || len(parts) == 0:
		parts = append(parts, s.Fault.String())
	}
	return strings.Join(parts, "; ")
}

// abortPoint says where a turn is held for the client to drop it.
func abortPoint(p *faults.Point) string {
	switch {
	case p == nil || *p == faults.Point{}:
		return "its first model call"
	case p.Tool > 0:
		return fmt.Sprintf("tool call %d of round %d (running)", p.Tool, p.Round)
	}
	where := "its first model call"
	if p.Round > 0 {
		where = fmt.Sprintf("the model call after %d tool round(s)", p.Round)
	}
	if p.Chunks > 0 {
		return fmt.Sprintf("%s, after %d chunk(s) of its answer", where, p.Chunks)
	}
	return where
}

// FaultKind is the send's fault as Stats counts it, "" for none.
func (s Send) FaultKind() string {
	switch {
	case s.Abort:
		return "client-abort"
	case s.Net != nil:
		return fmt.Sprintf("network %s (%s link)", s.Net.Kind, s.Net.Link)
	case s.Fault.Kind != faults.None:
		return s.Fault.Kind.String()
	}
	return ""
}

// Check says what makes p impossible to execute, nil if nothing: a plan
// read from a file is checked before it runs.
func (p Plan) Check() error {
	if p.Restart != nil {
		switch r := p.Restart; {
		case r.Replica != nil && (*r.Replica < 0 || r.Sources != nil):
			return fmt.Errorf("%q: a restart of replica %d alone, with agent sources %v: a replica is a replica, from 0, that loads the agent as the others do", p.Action, *r.Replica, r.Sources)
		case len(p.Sends) == 0:
			return nil
		case len(p.Sends) > 1 || !p.Restart.Crash:
			return fmt.Errorf("%q: a restart with requests; only a crash may have one, in flight", p.Action)
		case p.Sends[0].Abort || p.Sends[0].Fault.Kind != faults.None:
			return fmt.Errorf("%q: a crash with a turn in flight that has a fault of its own", p.Action)
		}
	}
	if len(p.Sends) == 0 {
		return fmt.Errorf("%q: no request", p.Action)
	}
	if len(p.Release) != len(p.Sends) {
		return fmt.Errorf("%q: release order %v is not one of each of its %d request(s)", p.Action, p.Release, len(p.Sends))
	}
	seen := make([]bool, len(p.Sends))
	for _, i := range p.Release {
		if i < 0 || i >= len(p.Sends) || seen[i] {
			return fmt.Errorf("%q: release order %v is not one of each of its %d request(s)", p.Action, p.Release, len(p.Sends))
		}
		seen[i] = true
	}
	for _, s := range p.Sends {
		if s.Fault.Kind == faults.Hold && len(p.Sends) > 1 {
			// Expiring deadlines expires every one in flight.
			return fmt.Errorf("%q: a hold until the server's deadline in a burst", p.Action)
		}
		if s.Token != "" && len(s.Messages) == 0 {
			return fmt.Errorf("%q: request %s has no messages", p.Action, s.Token)
		}
		if err := s.CheckTools(); err != nil {
			return fmt.Errorf("%q: request %s: %w", p.Action, s.Token, err)
		}
		if s.AbortAt != nil && len(p.Sends) > 1 {
			return fmt.Errorf("%q: an abort at a later point of a turn in a burst", p.Action)
		}
		if err := s.checkNet(len(p.Sends), p.Restart != nil); err != nil {
			return fmt.Errorf("%q: request %s: %w", p.Action, s.Token, err)
		}
	}
	return nil
}

// checkNet says what makes the send's network fault impossible, nil if
// nothing: a fault breaks its replica's link for one turn sent on its
// own, with no other fault of its own, from its first model call.
func (s Send) checkNet(sends int, restart bool) error {
	switch {
	case s.Net == nil:
		return nil
	case sends > 1 || restart:
		return errors.New("a network fault in a burst or a restart")
	case s.Token == "" || s.Abort || s.Fault.Kind != faults.None:
		return errors.New("a network fault on a turn that reaches no model, or has a fault of its own")
	}
	return s.Net.Check()
}

// CheckTools says what makes the send's tool rounds, fault and abort
// point impossible, nil if nothing.
func (s Send) CheckTools() error {
	for i, r := range s.Rounds {
		if len(r) == 0 {
			return fmt.Errorf("tool round %d calls no tool", i+1)
		}
		for _, name := range r {
			if name != faults.ToolEcho && name != faults.ToolLookup {
				return fmt.Errorf("tool round %d: unknown tool %q", i+1, name)
			}
		}
	}
	if s.Fault.Round < 0 || s.Fault.Round > len(s.Rounds) {
		return fmt.Errorf("a fault at the model call after %d tool round(s), of %d", s.Fault.Round, len(s.Rounds))
	}
	p := s.AbortAt
	switch {
	case p == nil:
	case !s.Abort:
		return errors.New("an abort point without an abort")
	case p.Round < 0 || p.Round > len(s.Rounds) || p.Chunks < 0 || p.Tool < 0:
		return fmt.Errorf("abort point %+v is outside the turn's %d tool round(s)", *p, len(s.Rounds))
	case p.Tool > 0 && (p.Round < 1 || p.Tool > len(s.Rounds[p.Round-1]) || s.Rounds[p.Round-1][p.Tool-1] != faults.ToolLookup):
		return fmt.Errorf("abort point %+v is not a lookup tool call of the turn", *p)
	}
	return nil
}

// String renders a plan on one line, for logs.
func (p Plan) String() string {
	if p.Restart != nil && len(p.Sends) == 0 {
		return fmt.Sprintf("%s: %s", p.Action, p.Restart)
	}
	parts := make([]string, len(p.Sends))
	for i, s := range p.Sends {
		parts[i] = fmt.Sprintf("%s %s [%s]", s.Conv, OrNone(string(s.Token)), s)
	}
	return fmt.Sprintf("%s: %s; release %v", p.Action, strings.Join(parts, ", "), p.Release)
}

// OrNone is s, or says that there is no new message when s is empty.
func OrNone(s string) string {
	if s == "" {
		return "(no new message)"
	}
	return s
}

// Single is the plan of a sequential step: a burst of one.
func Single(action string, s Send) Plan {
	return Plan{Action: action, Sends: []Send{s}, Release: []int{0}}
}

// TurnSend is the send of a turn with user token tok on conv.
func TurnSend(conv model.ConversationRef, tok model.Token, stream bool) Send {
	return Send{Conv: conv, Token: tok, Stream: stream,
		Messages: []openai.Message{{Role: openai.RoleUser, Content: openai.Content(UserText(tok))}}}
}

// DrawRounds draws the tool calls the fake model asks for before it
// replies: four turns in nine none, the others one to three rounds (one
// most often) of one to three calls, each of echo or lookup.
func DrawRounds(t *rapid.T, s *Send) {
	rounds := [...]int{0, 0, 0, 0, 1, 1, 1, 2, 3}
	n := rounds[rapid.IntRange(0, len(rounds)-1).Draw(t, "tool rounds")]
	for range n {
		calls := rapid.IntRange(1, 3).Draw(t, "tool calls")
		r := make(faults.Round, calls)
		for i := range r {
			r[i] = rapid.SampledFrom([]string{faults.ToolEcho, faults.ToolLookup}).Draw(t, "tool")
		}
		s.Rounds = append(s.Rounds, r)
	}
}

// drawAbortPoint draws where a sequential turn's client drops the
// connection: its first model call (the zero point), or, now and then, a
// lookup tool call while it runs (where an interruption can cut a tool
// round short), or a later model call after some chunks of its answer.
func drawAbortPoint(t *rapid.T, s *Send) {
	if rapid.IntRange(0, 2).Draw(t, "abort later") == 0 {
		return
	}
	var lookups []faults.Point
	for r, round := range s.Rounds {
		for i, name := range round {
			if name == faults.ToolLookup {
				lookups = append(lookups, faults.Point{Round: r + 1, Tool: i + 1})
			}
		}
	}
	var p faults.Point
	if len(lookups) > 0 && rapid.IntRange(0, 2).Draw(t, "abort in a tool") > 0 {
		p = rapid.SampledFrom(lookups).Draw(t, "abort tool")
	} else {
		p.Round = rapid.IntRange(0, len(s.Rounds)).Draw(t, "abort round")
		p.Chunks = rapid.IntRange(0, len(faults.ReplyChunks("tc-u0"))).Draw(t, "abort after chunks")
	}
	if p != (faults.Point{}) {
		s.AbortAt = &p
	}
}

// DrawFaults draws what goes wrong with one turn. Draws shrink toward zero,
// so the buckets are ordered from the plainest turn to the most disruptive.
// A hold until the server's deadline is drawn only for a turn sent on its
// own (sequential): the harness expires every deadline in flight at once.
// A fault lands at a drawn call of the turn's tool loop, an abort (of a
// sequential turn) at a drawn point of it.
func DrawFaults(t *rapid.T, s *Send, sequential bool) {
	defer func() {
		if s.Fault.Kind != faults.None && len(s.Rounds) > 0 {
			s.Fault.Round = rapid.IntRange(0, len(s.Rounds)).Draw(t, "fault round")
		}
		if s.Abort && sequential {
			drawAbortPoint(t, s)
		}
	}()
	if sequential && len(s.Rounds) > 0 && rapid.IntRange(0, 3).Draw(t, "interrupt the tool loop") == 3 {
		// Interruption is where a tool loop goes wrong (T9, T10): a turn
		// with tools is dropped by its client more often than a plain one.
		s.Abort = true
		return
	}
	switch k := rapid.IntRange(0, 39).Draw(t, "fault"); {
	case k < 20:
	case k < 26:
		s.Fault = faults.Fault{
			Kind:      faults.Status,
			Status:    rapid.SampledFrom([]int{500, 502, 503, 429}).Draw(t, "status"),
			RetryHint: rapid.Bool().Draw(t, "retry hint"),
			// 0: every call fails; k: the first k, so that a server that
			// retries the model can get through.
			Times: rapid.IntRange(0, 2).Draw(t, "failing calls"),
		}
	case k < 30:
		s.Fault = faults.Fault{Kind: faults.Cut, After: rapid.IntRange(0, len(faults.ReplyChunks("tc-u0"))).Draw(t, "cut after")}
	case k < 34:
		s.Fault = faults.Fault{Kind: faults.Malformed, After: rapid.IntRange(0, len(faults.ReplyChunks("tc-u0"))-1).Draw(t, "malformed after")}
	case k == 34 && sequential && rapid.Bool().Draw(t, "until the server's deadline"):
		// Held until the server's deadline: instant on a DeadlineController,
		// but a whole timeout on a server with its own clock, so the rarest
		// (1 turn in 80), and not at the top of the range, which rapid draws
		// (and tries while shrinking) far more often.
		s.Fault = faults.Fault{Kind: faults.Hold}
	default:
		s.Abort = true
	}
}

// DrawNet draws, now and then, a network fault on one of the links of
// the replica that a turn sent on its own goes to, in place of a fault of
// the model's or the client's: one turn in six. Latency stays well under
// every timeout, a cut closes its connections within a second: each
// fault is over within its step.
func DrawNet(t *rapid.T, s *Send, links []targets.Link) {
	if rapid.IntRange(0, 5).Draw(t, "network fault") < 5 {
		return
	}
	f := targets.NetFault{
		Link: rapid.SampledFrom(links).Draw(t, "link"),
		Kind: rapid.SampledFrom(targets.NetKinds).Draw(t, "network"),
	}
	switch f.Kind {
	case targets.Latency:
		f.Millis = rapid.SampledFrom([]int{20, 150}).Draw(t, "latency")
	case targets.Cut:
		f.Millis = rapid.SampledFrom([]int{100, 400}).Draw(t, "dark for")
	}
	s.Net = &f
}

// Shape is a continuation without a usable new user message: its name,
// as a step's title says what was sent, and its messages, built from the
// conversation's latest user message (prev) and how many such
// continuations the run drew before (n).
type Shape struct {
	Name  string
	Build func(prev openai.Message, n int) []openai.Message
	// NamesTask: the message names the conversation's last finished
	// task (Send.FinishedTask).
	NamesTask bool
}

// Shapes are the continuations without a usable new user message that
// protocol p can send, named in its own words: a protocol whose request
// carries one message (ACP, A2A: targets.ProtocolInfo.Unusable) can send
// only a message with no content and one with blank content, however the
// messages before it were drawn, and A2A one that names a finished task
// (a task that ended does not run again: A2A's follow-up is a new task),
// with that task's message again; a server that appends its input whole
// (appends) gets AppendedShapes; any other, InvalidShapes.
func Shapes(p targets.Protocol, appends bool) []Shape {
	switch one := p.Info().Unusable; {
	case len(one) > 0:
		shapes := []Shape{
			{Name: one[0], Build: func(openai.Message, int) []openai.Message { return []openai.Message{} }},
			{Name: one[1], Build: func(openai.Message, int) []openai.Message {
				return []openai.Message{{Role: openai.RoleUser, Content: " \n\t "}}
			}},
		}
		if len(one) > 2 {
			shapes = append(shapes, Shape{Name: one[2], NamesTask: true,
				Build: func(prev openai.Message, _ int) []openai.Message { return []openai.Message{prev} }})
		}
		return shapes
	case appends:
		return AppendedShapes
	}
	return InvalidShapes
}

// InvalidShapes are continuations without a usable new user message. Each
// carries the conversation's latest user message as an earlier element
// where it can, as a naive client resending history would.
var InvalidShapes = []Shape{
	{Name: "empty messages array", Build: func(openai.Message, int) []openai.Message { return []openai.Message{} }},
	{Name: "last message from the assistant", Build: func(p openai.Message, _ int) []openai.Message {
		return []openai.Message{p, {Role: openai.RoleAssistant, Content: "Noted."}}
	}},
	{Name: "last message a system message", Build: func(p openai.Message, _ int) []openai.Message {
		return []openai.Message{p, {Role: openai.RoleSystem, Content: "Be brief."}}
	}},
	{Name: "last message a tool result", Build: func(p openai.Message, _ int) []openai.Message {
		return []openai.Message{p, {Role: openai.RoleTool, Content: "42"}}
	}},
	{Name: "blank last user message", Build: func(p openai.Message, _ int) []openai.Message {
		return []openai.Message{p, {Role: openai.RoleUser, Content: ""}}
	}},
	{Name: "whitespace-only last user message", Build: func(p openai.Message, _ int) []openai.Message {
		return []openai.Message{p, {Role: openai.RoleUser, Content: " \n\t "}}
	}},
	{Name: "only an earlier user message, then a blank one", Build: func(p openai.Message, _ int) []openai.Message {
		return []openai.Message{{Role: openai.RoleSystem, Content: "Be brief."}, p, {Role: openai.RoleAssistant, Content: "Noted."}, {Role: openai.RoleUser, Content: "   "}}
	}},
}

// AppendedShapes are continuations without a new user message for a
// server that appends a request's input whole to the history it
// continues (the Responses API): a client tool's call and its output, as
// a client that runs a tool of its own sends them; an output that answers
// no call (OpenAI refuses it with 400); a blank user message; a system
// message; an assistant message. None carries an earlier user message:
// such a server appends that one too, as the client asked. Build takes
// the n-th such continuation of the run: a client tool's call has an id
// of its own each time (ClientCallID), as a client's calls do, for a
// server whose chain keeps it (a line, an appending session API).
var AppendedShapes = []Shape{
	{Name: "a client tool's call and its output", Build: func(_ openai.Message, n int) []openai.Message {
		return []openai.Message{
			{Role: openai.RoleAssistant, ToolCalls: []openai.ToolCall{{ID: ClientCallID(n), Type: openai.TypeFunction,
				Function: openai.FunctionCall{Name: "clock", Arguments: "{}"}}}},
			{Role: openai.RoleTool, ToolCallID: ClientCallID(n), Content: "noon"},
		}
	}},
	{Name: "a client tool's output answering no call", Build: func(_ openai.Message, n int) []openai.Message {
		return []openai.Message{{Role: openai.RoleTool, ToolCallID: ClientCallID(n), Content: "noon"}}
	}},
	{Name: "a blank user message", Build: func(openai.Message, int) []openai.Message {
		return []openai.Message{{Role: openai.RoleUser, Content: " \n\t "}}
	}},
	{Name: "a system message", Build: func(openai.Message, int) []openai.Message {
		return []openai.Message{{Role: openai.RoleSystem, Content: "Be brief."}}
	}},
	{Name: "an assistant message", Build: func(openai.Message, int) []openai.Message {
		return []openai.Message{{Role: openai.RoleAssistant, Content: "Noted."}}
	}},
}

// ClientCallID is the id of the n-th tool call a client of the Responses
// API ran itself, in AppendedShapes: not one the fake model gives
// (model.ToolCallID), so no turn owns it.
func ClientCallID(n int) string { return fmt.Sprintf("call_client_%d", n) }

// UserText is the text of the user message carrying tok.
func UserText(tok model.Token) string { return fmt.Sprintf("Please remember %s.", tok) }

// Burst is a plan of n plain turns sent at once on conv, tokens from
// first on, released in order release.
func Burst(conv model.ConversationRef, first, n int, release ...int) Plan {
	p := Plan{Action: "burst", Release: release}
	for k := range n {
		p.Sends = append(p.Sends, TurnSend(conv, model.UserToken(first+k), k%2 == 0))
	}
	return p
}

// BurstAction names a burst of n requests; a burst shrunk to one request
// is no burst.
func BurstAction(n int) string {
	if n == 1 {
		return "one request"
	}
	return fmt.Sprintf("burst of %d", n)
}
