package scenarios

import (
	"fmt"
	"slices"

	"pgregory.net/rapid"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
)

// Step is one request of a run and what came of it, as a report shows it.
type Step struct {
	// N numbers the step from 1.
	N int
	// Action is the state-machine action that sent it.
	Action string
	// Token is the user token of the request's new message ("" for a
	// request without one).
	Token   model.Token
	Request Request
	// Fault is what was injected: by the fake model, and by the client.
	Fault string
	Response
	// Calls are the model requests the server made during the step.
	Calls []model.Call
}

// plan is the drawn shape of one turn: how it is sent and what goes wrong.
type plan struct {
	stream bool
	fault  faults.Fault
	// abort closes the client's connection once the model call arrives.
	abort bool
}

func (p plan) String() string {
	if p.abort {
		return "client-abort: the model holds the call, the client drops the connection when it arrives"
	}
	return p.fault.String()
}

// faultKind is the plan's fault as Stats counts it.
func (p plan) faultKind() string {
	if p.abort {
		return "client-abort"
	}
	return p.fault.Kind.String()
}

// drawPlan draws a turn's plan. Draws shrink toward zero, so the buckets
// are ordered from the plainest turn to the most disruptive.
func drawPlan(t *rapid.T) plan {
	p := plan{stream: rapid.Bool().Draw(t, "stream")}
	switch k := rapid.IntRange(0, 39).Draw(t, "fault"); {
	case k < 20:
	case k < 26:
		p.fault = faults.Fault{
			Kind:      faults.Status,
			Status:    rapid.SampledFrom([]int{500, 502, 503, 429}).Draw(t, "status"),
			RetryHint: rapid.Bool().Draw(t, "retry hint"),
			// 0: every call fails; k: the first k, so that a server that
			// retries the model can get through.
			Times: rapid.IntRange(0, 2).Draw(t, "failing calls"),
		}
	case k < 30:
		p.fault = faults.Fault{Kind: faults.Cut, After: rapid.IntRange(0, len(faults.ReplyChunks("tc-u0"))).Draw(t, "cut after")}
	case k < 34:
		p.fault = faults.Fault{Kind: faults.Malformed, After: rapid.IntRange(0, len(faults.ReplyChunks("tc-u0"))-1).Draw(t, "malformed after")}
	case k == 34 && rapid.Bool().Draw(t, "until the server's deadline"):
		// Held until the server's deadline: instant on a DeadlineController,
		// but a whole timeout on a server with its own clock, so the rarest
		// (1 turn in 80), and not at the top of the range, which rapid draws
		// (and tries while shrinking) far more often.
		p.fault = faults.Fault{Kind: faults.Hold}
	default:
		p.fault, p.abort = faults.Fault{Kind: faults.Hold}, true
	}
	return p
}

// conv is the harness's view of one conversation.
type conv struct {
	ref model.ConversationRef
	// lastUser is the latest user message sent on it, which invalid
	// continuations carry as an earlier element to tempt a replay.
	lastUser openai.Message
	// failed are user tokens whose latest attempt failed: retry candidates.
	failed []model.Token
}

// machine is one check's state machine: the server, the fake model, the
// reference model, and what has been sent.
type machine struct {
	profile Profile
	srv     Server
	fake    *faults.Model
	client  *client
	ref     *model.Model
	stats   *Stats
	// onViolation is told of a violation before the check fails.
	onViolation func(*model.Violation, []Step)

	convs  []*conv
	ids    int
	tokens int
	steps  []Step
}

func (m *machine) actions() map[string]func(*rapid.T) {
	a := map[string]func(*rapid.T){
		"new conversation":     m.newConversation,
		"continue":             m.continueConversation,
		"invalid continuation": m.invalidContinuation,
		"retry failed turn":    m.retryFailed,
	}
	if len(m.profile.Keys) >= 2 {
		a["same id, other key"] = m.otherKey
	}
	return a
}

func (m *machine) newConversation(t *rapid.T) {
	key := ""
	if len(m.profile.Keys) > 0 {
		key = rapid.SampledFrom(m.profile.Keys).Draw(t, "key")
	}
	m.ids++
	c := m.conv(model.ConversationRef{Key: key, ID: fmt.Sprintf("conv-%d", m.ids)})
	m.turn(t, "new conversation", c, m.newToken(), drawPlan(t))
}

func (m *machine) continueConversation(t *rapid.T) {
	if len(m.convs) == 0 {
		t.Skip("no conversation yet")
	}
	c := newest(t, m.convs, "conversation")
	m.turn(t, "continue", c, m.newToken(), drawPlan(t))
}

func (m *machine) retryFailed(t *rapid.T) {
	var candidates []*conv
	for _, c := range m.convs {
		if len(c.failed) > 0 {
			candidates = append(candidates, c)
		}
	}
	if len(candidates) == 0 {
		t.Skip("no failed turn to retry")
	}
	c := newest(t, candidates, "conversation")
	tok := newest(t, c.failed, "failed turn")
	m.turn(t, "retry failed turn", c, tok, drawPlan(t))
}

// otherKey continues a conversation id under another API key: a different
// conversation, which must see nothing of the first (T5).
func (m *machine) otherKey(t *rapid.T) {
	if len(m.convs) == 0 {
		t.Skip("no conversation yet")
	}
	src := newest(t, m.convs, "conversation")
	others := slices.DeleteFunc(slices.Clone(m.profile.Keys), func(k string) bool { return k == src.ref.Key })
	key := rapid.SampledFrom(others).Draw(t, "other key")
	c := m.conv(model.ConversationRef{Key: key, ID: src.ref.ID})
	m.turn(t, "same id, other key", c, m.newToken(), drawPlan(t))
}

// invalidShapes are continuations without a usable new user message. Each
// carries the conversation's latest user message as an earlier element
// where it can, as a naive client resending history would.
var invalidShapes = []struct {
	name  string
	build func(prev openai.Message) []openai.Message
}{
	{"empty messages array", func(openai.Message) []openai.Message { return []openai.Message{} }},
	{"last message from the assistant", func(p openai.Message) []openai.Message {
		return []openai.Message{p, {Role: openai.RoleAssistant, Content: "Noted."}}
	}},
	{"last message a system message", func(p openai.Message) []openai.Message {
		return []openai.Message{p, {Role: openai.RoleSystem, Content: "Be brief."}}
	}},
	{"last message a tool result", func(p openai.Message) []openai.Message {
		return []openai.Message{p, {Role: openai.RoleTool, Content: "42"}}
	}},
	{"blank last user message", func(p openai.Message) []openai.Message {
		return []openai.Message{p, {Role: openai.RoleUser, Content: ""}}
	}},
	{"whitespace-only last user message", func(p openai.Message) []openai.Message {
		return []openai.Message{p, {Role: openai.RoleUser, Content: " \n\t "}}
	}},
	{"only an earlier user message, then a blank one", func(p openai.Message) []openai.Message {
		return []openai.Message{{Role: openai.RoleSystem, Content: "Be brief."}, p, {Role: openai.RoleAssistant, Content: "Noted."}, {Role: openai.RoleUser, Content: "   "}}
	}},
}

func (m *machine) invalidContinuation(t *rapid.T) {
	if len(m.convs) == 0 {
		t.Skip("no conversation yet")
	}
	c := newest(t, m.convs, "conversation")
	shape := invalidShapes[rapid.IntRange(0, len(invalidShapes)-1).Draw(t, "shape")]
	stream := rapid.Bool().Draw(t, "stream")
	req := m.client.newRequest(c.ref, shape.build(c.lastUser), stream)
	before := m.fake.CallCount()
	resp := m.client.send(req, nil, nil)
	step := m.record(Step{Action: "invalid continuation: " + shape.name, Request: req, Fault: "none", Response: resp,
		Calls: m.fake.CallsSince(before)})
	m.check(t, model.Turn{Conv: c.ref, Usable: false, Outcome: resp.Outcome, Status: resp.Status, Calls: step.Calls})
}

// turn sends one turn with user token tok on c, following p, and checks it.
func (m *machine) turn(t *rapid.T, action string, c *conv, tok model.Token, p plan) {
	user := openai.Message{Role: openai.RoleUser, Content: openai.Content(UserText(tok))}
	c.lastUser = user
	req := m.client.newRequest(c.ref, []openai.Message{user}, p.stream)
	arrived := m.fake.Script(tok, p.fault)
	var then func(abort func())
	switch dc, ok := m.srv.(DeadlineController); {
	case p.abort:
		then = func(abort func()) { abort() }
	case p.fault.Kind == faults.Hold && ok:
		then = func(func()) { dc.ExpireDeadlines() }
	}
	before := m.fake.CallCount()
	resp := m.client.send(req, arrived, then)
	// A fault is for this step only: a server that later replays this
	// message (a bug the harness must report, not hang on) gets a reply.
	m.fake.Forget(tok)
	step := m.record(Step{Action: action, Token: tok, Request: req, Fault: p.String(), Response: resp,
		Calls: m.fake.CallsSince(before)})
	if p.fault.Kind != faults.None {
		m.stats.Faults[p.faultKind()]++
	}
	c.failed = slices.DeleteFunc(c.failed, func(f model.Token) bool { return f == tok })
	if resp.Outcome == model.Fail {
		c.failed = append(c.failed, tok)
	}
	m.check(t, model.Turn{Conv: c.ref, User: tok, Usable: true, Outcome: resp.Outcome,
		Status: resp.Status, Reply: resp.Reply, Calls: step.Calls})
}

func (m *machine) record(s Step) Step {
	s.N = len(m.steps) + 1
	m.steps = append(m.steps, s)
	m.stats.Steps++
	m.stats.Outcomes[s.Outcome.String()]++
	return s
}

func (m *machine) check(t *rapid.T, turn model.Turn) {
	if v := m.ref.Apply(turn); v != nil {
		steps := slices.Clone(m.steps)
		if m.onViolation != nil {
			m.onViolation(v, steps)
		}
		// The steps go to the log, shown for the shrunk run; the failure
		// itself is the violation alone, which names only tokens and
		// conversations: rapid tells a reproduced failure by its message,
		// and the steps hold details (ports in error texts) that differ
		// between runs of the same steps.
		t.Logf("%s", FormatFailure(v, steps, m.profile))
		t.Fatalf("%s", v.Error())
	}
}

func (m *machine) conv(ref model.ConversationRef) *conv {
	for _, c := range m.convs {
		if c.ref == ref {
			return c
		}
	}
	c := &conv{ref: ref}
	m.convs = append(m.convs, c)
	return c
}

func (m *machine) newToken() model.Token {
	m.tokens++
	return model.UserToken(m.tokens)
}

// newest draws one of items, counting from the last: draws shrink toward
// the most recent item, which stays the same when the shrinker removes
// earlier steps, where an index from the first would shift onto another.
func newest[T any](t *rapid.T, items []T, label string) T {
	return items[len(items)-1-rapid.IntRange(0, len(items)-1).Draw(t, label)]
}

// UserText is the text of the user message carrying tok.
func UserText(tok model.Token) string { return fmt.Sprintf("Please remember %s.", tok) }
