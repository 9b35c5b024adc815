// Package traffic is the rapid state machine that draws a check's plans:
// new conversations, continuations, retries, turns on another key,
// continuations without a usable message, bursts, restarts and source
// changes, with what goes wrong with each.
package traffic

import (
	"fmt"
	"net/http"
	"slices"

	"pgregory.net/rapid"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/protocol"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// conv is the harness's view of one conversation, for drawing plans.
type conv struct {
	ref model.ConversationRef
	// lastUser is the latest user message sent on it, which invalid
	// continuations carry as an earlier element to tempt a replay.
	lastUser openai.Message
	// failed are user tokens whose latest attempt failed: retry candidates.
	failed []model.Token
	// inConv names it, under the Responses API, as the server declares a
	// conversation is named (the conversation parameter, the user field,
	// a header) rather than as a chain of responses.
	inConv bool
	// over marks a conversation that cannot go on by design: a chain of
	// response ids that a restart took, on a server whose ids do not
	// survive one. Nothing more is sent on it.
	over bool
}

// Machine is one check's state machine. Its actions only draw plans (every
// rapid draw happens on rapid's goroutine); step executes a plan, records
// its history and validates it.
type Machine struct {
	*execute.Session
	stats *report.Stats
	// onViolation is told of a violation before the check fails, and
	// onDead of a server that stopped answering.
	onViolation func(*model.Violation, []plan.Plan, []history.Op)
	onDead      func(error)

	convs []*conv
	// committed is set once a turn of the check ended ok: a restart has
	// something to lose.
	committed bool
	ids       int
	tokens    int
	// invalid counts the invalid continuations drawn (plan.AppendedShapes).
	invalid int
	// sources are the queries of the references to the profile's agent the
	// server loads now, and tags counts the queries drawn so far.
	sources []string
	tags    int
	// budget is how the check spends a slow server's time (budget.go).
	budget budget
	// replicas is how many replicas serve the server (1 for one process),
	// and routes how many URLs the client has to them: one per replica, a
	// request going to the replica drawn for it, or one, a front's, that
	// picks the replica itself.
	replicas, routes int
}

// New returns the machine of one check, run in sess: stats counts what it
// drew, onViolation is told of a violation (with the plans and history
// that led to it) before the check fails, and onDead of a server that
// stopped answering.
func New(sess *execute.Session, stats *report.Stats, onViolation func(*model.Violation, []plan.Plan, []history.Op), onDead func(error)) *Machine {
	return &Machine{Session: sess, stats: stats, onViolation: onViolation, onDead: onDead,
		replicas: targets.Replicas(sess.Server), routes: len(targets.URLs(sess.Server))}
}

// Actions are the machine's actions, by name, for rapid.T.Repeat.
func (m *Machine) Actions() map[string]func(*rapid.T) {
	a := map[string]func(*rapid.T){
		"new conversation":     m.newConversation,
		"continue":             m.continueConversation,
		"invalid continuation": m.invalidContinuation,
		"retry failed turn":    m.retryFailed,
		"burst":                m.burst,
	}
	if len(m.Profile.Keys) >= 2 {
		a["same id, other key"] = m.otherKey
	}
	if m.Profile.Protocol == targets.Responses && !m.Profile.ResponsesAPI.StoresAll() {
		// A server that stores every response (store: false ignored, as
		// declared) is sent none that asks not to be.
		a["unstored turn"] = m.unstoredTurn
	}
	if _, ok := m.Server.(targets.Restarter); ok && (m.Profile.Durability.Restart || m.Profile.Durability.Crash) {
		a["restart"] = m.restart
	}
	// Each action first fixes the check's budget and, on a slow server,
	// may give way to one the check needs more (budget.go).
	drawn := make(map[string]func(*rapid.T), len(a))
	for name := range a {
		drawn[name] = func(t *rapid.T) {
			m.pace(len(a), a["restart"] != nil)
			m.steer(t, name, a)(t)
		}
	}
	return drawn
}

// restart stops the server, gracefully or by a crash (as its profile
// declares it survives), and starts it again on the same data, now and
// then, once a conversation has resumed after a plain restart, loading
// its agent under another query, or twice under one stable key (T7, T8).
func (m *Machine) restart(t *rapid.T) {
	if !m.committed {
		// A restart of a server with nothing to lose shows nothing, and
		// on a slow server it is the costliest step there is.
		t.Skip("nothing committed to lose yet")
	}
	if m.rationed(t) {
		m.continueConversation(t)
		return
	}
	d := m.Profile.Durability
	// Steered to while its check has judged no durability: a crash where
	// one is declared, with a turn in flight, shows the most (T6, T7).
	forced := m.budget.steered && d.Crash
	r := plan.Restart{Crash: !d.Restart || forced || (d.Crash && rapid.Bool().Draw(t, "crash"))}
	if m.Profile.Agent != "" && m.Ref.Survived() {
		// Only once a conversation has resumed after a plain restart: a
		// server that keeps none across one is durability's finding (T7),
		// never the source change's (T8).
		// Two sources on one stable key refuse every resume: such a spell
		// ends at the next restart, which loads one source again.
		low, high := 0, 2
		if len(m.sources) > 1 {
			low = 1
		}
		if m.Profile.OneSource || m.Profile.Protocol == targets.ACP {
			// It cannot load two; or, under ACP, a refused session/load
			// has no status to say the source is ambiguous.
			high = 1
		}
		switch rapid.IntRange(low, high).Draw(t, "sources") {
		case 1:
			r.Sources = []string{m.newTag()}
		case 2:
			r.Sources = []string{m.newTag(), m.newTag()}
		}
		if r.Sources != nil {
			m.sources = r.Sources
		}
	}
	if n := m.replicas; n > 1 && r.Sources == nil && rapid.Bool().Draw(t, "one replica") {
		// One replica stops or dies; the others go on serving the store.
		i := rapid.IntRange(0, n-1).Draw(t, "which replica")
		r.Replica = &i
	}
	action := "restart"
	if r.Crash {
		action = "crash"
	}
	p := plan.Plan{Action: action, Restart: &r}
	if live := m.live(); r.Crash && len(live) > 0 && (forced || rapid.Bool().Draw(t, "turn in flight")) {
		// The server dies while a turn's model call is held: the turn's
		// outcome is unknown, and it is committed whole or not at all (T6).
		c := newest(t, live, "conversation")
		s := plan.TurnSend(c.ref, m.newToken(), rapid.Bool().Draw(t, "stream"))
		s.InConversation = c.inConv
		p = plan.Plan{Action: "crash mid-turn", Restart: &r, Release: []int{0}, Sends: []plan.Send{s}}
	}
	m.budget.restarts++
	m.step(t, p)
	if m.Profile.Protocol == targets.Responses && !m.Profile.ResponsesAPI.IDsSurviveRestart() {
		// Response ids are gone, as declared: a conversation that is
		// only a chain of them is over, and nothing of it is judged
		// again. Those the server names otherwise go on.
		for _, c := range m.convs {
			c.over = c.over || !c.inConv
		}
	}
}

func (m *Machine) newTag() string {
	m.tags++
	return fmt.Sprintf("tag=v%d", m.tags+1) // v1 is the reference the server starts with
}

func (m *Machine) newConversation(t *rapid.T) {
	c := m.newConv(t)
	m.step(t, plan.Single("new conversation", m.drawTurn(t, c, m.newToken(), true)))
}

func (m *Machine) continueConversation(t *rapid.T) {
	live := m.live()
	if len(live) == 0 {
		t.Skip("no conversation yet")
	}
	c := newest(t, live, "conversation")
	m.step(t, plan.Single("continue", m.drawTurn(t, c, m.newToken(), true)))
}

func (m *Machine) retryFailed(t *rapid.T) {
	var candidates []*conv
	for _, c := range m.live() {
		if len(c.failed) > 0 {
			candidates = append(candidates, c)
		}
	}
	if len(candidates) == 0 {
		t.Skip("no failed turn to retry")
	}
	c := newest(t, candidates, "conversation")
	tok := newest(t, c.failed, "failed turn")
	m.step(t, plan.Single("retry failed turn", m.drawTurn(t, c, tok, true)))
}

// otherKey continues a conversation id under another API key: a different
// conversation, which must see nothing of the first (T5).
func (m *Machine) otherKey(t *rapid.T) {
	live := m.live()
	if len(live) == 0 {
		t.Skip("no conversation yet")
	}
	src := newest(t, live, "conversation")
	others := slices.DeleteFunc(slices.Clone(m.Profile.Keys), func(k string) bool { return k == src.ref.Key })
	key := rapid.SampledFrom(others).Draw(t, "other key")
	c := m.conv(model.ConversationRef{Key: key, ID: src.ref.ID})
	if c.over {
		t.Skip("that key's conversation with this id is over")
	}
	c.inConv = src.inConv // the same id, named the same way
	m.step(t, plan.Single("same id, other key", m.drawTurn(t, c, m.newToken(), true)))
}

// unstoredTurn continues a conversation with a turn whose response is not
// to be stored (store: false, the Responses API): the next turn chains
// from it once, and must find it not found or see nothing of it, and the
// conversation goes on without it (T1).
func (m *Machine) unstoredTurn(t *rapid.T) {
	live := m.live()
	if len(live) == 0 {
		t.Skip("no conversation yet")
	}
	c := newest(t, live, "conversation")
	if c.inConv {
		t.Skip("a conversation of the server's keeps what it is sent")
	}
	s := m.drawTurn(t, c, m.newToken(), true)
	s.NoStore = true
	m.step(t, plan.Single("unstored turn", s))
}

func (m *Machine) invalidContinuation(t *rapid.T) {
	live := m.live()
	if len(live) == 0 {
		t.Skip("no conversation yet")
	}
	c := newest(t, live, "conversation")
	// Where the input is appended whole (OpenAI's semantics, a session
	// API such as docker-agent's), what is judged is that no committed
	// user message is run again as new (T3).
	shapes := plan.Shapes(m.Profile.Protocol, m.Profile.AppendsInput())
	if c.inConv {
		// Its input would be kept in the conversation, a turn without a
		// token the model does not follow.
		t.Skip("a conversation of the server's keeps what it is sent")
	}
	shape := shapes[rapid.IntRange(0, len(shapes)-1).Draw(t, "shape")]
	m.invalid++
	s := plan.Send{Conv: c.ref, Messages: shape.Build(c.lastUser, m.invalid), Stream: rapid.Bool().Draw(t, "stream"), FinishedTask: shape.NamesTask}
	m.step(t, plan.Single("invalid continuation: "+shape.Name, s))
}

// burst sends 2 to 6 turns at once on one id, new or existing (T4), with
// now and then a turn on another conversation among them. The model holds
// every call and lets them go in a drawn order.
func (m *Machine) burst(t *rapid.T) {
	var c *conv
	if live := m.live(); len(live) == 0 || rapid.Bool().Draw(t, "new id") {
		c = m.newConv(t)
	} else {
		c = newest(t, live, "conversation")
	}
	n := rapid.IntRange(2, 6).Draw(t, "requests")
	p := plan.Plan{Action: plan.BurstAction(n)}
	// Turns chained from one response branch by design: under the
	// Responses API, the second turn of a burst on one conversation, and
	// every one after, starts a branch of it, a conversation of its own.
	// On a server that declares that a chain runs on one line (openclaw
	// reuses the response's session), a branch whose base has a response
	// is sent as a turn of the base's conversation, judged by the
	// concurrency policy (protocol.Client.Resolve).
	branches := m.Profile.Protocol == targets.Responses
	sent := map[*conv]bool{}
	for range n {
		on := c
		if live := m.live(); len(live) > 1 && rapid.IntRange(0, 4).Draw(t, "on another conversation") == 4 {
			on = newest(t, live, "other conversation")
		}
		var from *model.ConversationRef
		if branches && sent[on] && !on.inConv {
			base := on.ref
			from, on = &base, m.branch(t, on)
		}
		sent[on] = true
		s := m.drawTurn(t, on, m.newToken(), false)
		s.From = from
		p.Sends = append(p.Sends, s)
	}
	p.Release = rapid.Permutation(indexes(n)).Draw(t, "release order")
	m.stats.Faults["concurrency"]++
	m.step(t, p)
}

// drawTurn draws how a turn with user token tok is sent on c and what goes
// wrong with it.
func (m *Machine) drawTurn(t *rapid.T, c *conv, tok model.Token, sequential bool) plan.Send {
	s := plan.TurnSend(c.ref, tok, rapid.Bool().Draw(t, "stream"))
	s.InConversation = c.inConv
	if m.Profile.Tools {
		plan.DrawRounds(t, &s)
	}
	if lb, ok := m.Server.(targets.LinkBreaker); ok && sequential {
		if plan.DrawNet(t, &s, lb.Links()); s.Net != nil {
			return s
		}
	}
	plan.DrawFaults(t, &s, sequential)
	if m.Profile.Protocol == targets.ACP && s.Fault.Kind == faults.Status && rapid.Bool().Draw(t, "refused") {
		// ACP tells a refusal from a failure (stopReason refusal): one
		// model error in two is the model refusing the prompt, 400 (as
		// a content filter answers), so that a refused turn is drawn and
		// held to nothing kept (T1) as a failed one is. Drawn under ACP
		// alone: the other protocols' draws stay as they were.
		s.Fault.Status = http.StatusBadRequest
	}
	if m.Profile.Protocol == targets.ACP && m.Profile.Tools {
		s.Deny = rapid.Bool().Draw(t, "deny permission")
	}
	if m.Profile.Protocol == targets.A2A && s.Abort {
		// A2A's explicit abort is tasks/cancel; a dropped connection is
		// the other, which the agent declares the meaning of. A
		// message/send's task is known only once it ends: it can only be
		// dropped. Drawn under A2A alone.
		s.TaskAbort = plan.AbortCancel
		if !s.Stream || rapid.Bool().Draw(t, "drop the task's stream") {
			s.TaskAbort = plan.AbortDrop
		}
	}
	return s
}

// newConv draws a key and opens a conversation under a new id.
// branch is a new conversation that branches from c, under c's key.
func (m *Machine) branch(t *rapid.T, c *conv) *conv {
	m.ids++
	return m.conv(model.ConversationRef{Key: c.ref.Key, ID: fmt.Sprintf("conv-%d", m.ids)})
}

func (m *Machine) newConv(t *rapid.T) *conv {
	key := ""
	if len(m.Profile.Keys) > 0 {
		key = rapid.SampledFrom(m.Profile.Keys).Draw(t, "key")
	}
	m.ids++
	c := m.conv(model.ConversationRef{Key: key, ID: fmt.Sprintf("conv-%d", m.ids)})
	// Under the Responses API, where the server declares a way to name a
	// conversation (the conversation parameter, the user field, a
	// header), one conversation in four is named so, the others chains
	// of responses.
	c.inConv = m.Profile.Protocol == targets.Responses && m.Profile.ResponsesAPI.Naming() != "" &&
		rapid.IntRange(0, 3).Draw(t, "conversation parameter") == 3
	return c
}

// step executes p and checks it; a violation fails the run. On a server
// that runs as several replicas, each request goes to a replica drawn for
// it (unless a front picks it): turns of one conversation then meet on
// different replicas, where a lock or a cache held in one process serves
// nothing.
func (m *Machine) step(t *rapid.T, p plan.Plan) {
	if n := m.routes; n > 1 {
		for i := range p.Sends {
			if p.Restart != nil && p.Restart.Replica != nil {
				// The turn in flight when the replica crashes is its.
				p.Sends[i].Replica = *p.Restart.Replica
				continue
			}
			p.Sends[i].Replica = rapid.IntRange(0, n-1).Draw(t, "replica")
		}
	}
	ops, v := m.Session.Step(p)
	for _, op := range ops {
		m.record(op)
	}
	m.convs = slices.DeleteFunc(m.convs, func(c *conv) bool { return m.Aside[c.ref] })
	if m.Dead != nil {
		if m.onDead != nil {
			m.onDead(m.Dead)
		}
		t.Fatalf("%v", m.Dead)
	}
	if v != nil {
		if m.onViolation != nil {
			m.onViolation(v, slices.Clone(m.Plans), slices.Clone(m.History))
		}
		t.Fatalf("%s", v.Error())
	}
}

// record counts op and keeps what later draws need: the conversation's
// latest user message and its failed turns.
func (m *Machine) record(op history.Op) {
	for _, d := range op.Drawn() {
		m.stats.Drawn[d]++
	}
	if op.Restart != nil {
		m.stats.Faults[op.Action]++
		return
	}
	m.stats.Steps++
	m.stats.Outcomes[op.Response.Outcome.String()]++
	m.stats.Auxiliary += len(op.Turn.Aux)
	if r := op.Response; r.Outcome != model.OK {
		m.stats.Causes[r.Cause]++
		injected := r.Cause == protocol.CauseAborted || op.Send.Fault.Kind != faults.None || op.Net == history.NetBroken || op.Send.Token == ""
		// What the server's declared policies call for (a 409 under
		// reject, a prompt superseded under supersede) is no surprise;
		// what a crash drawn mid-turn ends is injected.
		declared := r.Status == http.StatusConflict && m.Profile.Concurrency == model.Reject || r.Preempted && m.Profile.Supersede
		// A 409 while the server loads two sources sharing one stable key
		// is the refusal the harness drew them for (T8).
		declared = declared || r.Status == http.StatusConflict && len(m.sources) > 1
		// Not found is what a request naming another key's session or
		// context calls for (T5).
		declared = declared || op.Request.OtherKey && r.NotFound()
		// An A2A context whose tasks all failed holds nothing, and the
		// agent may keep no record of it (PROTOCOL.md, T3): a message in
		// it refused before any model call is what the failures drawn
		// before it call for.
		declared = declared || m.Profile.Protocol == targets.A2A && op.Request.Session != "" && r.Outcome == model.Fail &&
			len(op.Turn.Calls) == 0 && len(m.Ref.Committed(op.Turn.Conv)) == 0
		if !injected && !declared && op.Restart == nil && op.Action != "crash mid-turn" && !op.Send.Abort && !op.Turn.Unsent && !r.Cancelled {
			m.stats.CountUninjected(r.Cause, r.Detail)
		}
		if !injected && len(m.stats.FirstAnswers) < report.MaxFirstAnswers {
			a := r.Cause
			if r.Detail != "" && r.Detail != r.Cause {
				a += ": " + protocol.ClipText(r.Detail, 120)
			}
			m.stats.FirstAnswers = append(m.stats.FirstAnswers, a)
		}
	}
	if k := op.Send.FaultKind(); k != "" {
		// A fault counts as injected only where it took effect: the turn
		// got as far as the point it was drawn for. A turn refused, or
		// ended, before it got there only drew it.
		if op.FaultReached() {
			m.stats.Faults[k]++
		} else {
			m.stats.Unreached[k]++
		}
	}
	if len(op.Send.Rounds) > 0 {
		m.stats.Faults["tool-turn"]++
	}
	tok := op.Send.Token
	if tok == "" {
		return
	}
	m.committed = m.committed || op.Response.Outcome == model.OK
	c := m.conv(op.Send.Conv)
	c.lastUser = op.Send.Messages[len(op.Send.Messages)-1]
	c.failed = slices.DeleteFunc(c.failed, func(f model.Token) bool { return f == tok })
	if op.Response.Outcome == model.Fail {
		c.failed = append(c.failed, tok)
	}
}

// live are the conversations that may go on.
func (m *Machine) live() []*conv {
	live := m.convs
	if slices.ContainsFunc(m.convs, func(c *conv) bool { return c.over }) {
		live = slices.DeleteFunc(slices.Clone(m.convs), func(c *conv) bool { return c.over })
	}
	return live
}

func (m *Machine) conv(ref model.ConversationRef) *conv {
	for _, c := range m.convs {
		if c.ref == ref {
			return c
		}
	}
	c := &conv{ref: ref}
	m.convs = append(m.convs, c)
	return c
}

func (m *Machine) newToken() model.Token {
	m.tokens++
	return model.UserToken(m.tokens)
}

// newest draws one of items, counting from the last: draws shrink toward
// the most recent item, which stays the same when the shrinker removes
// earlier steps, where an index from the first would shift onto another.
func newest[T any](t *rapid.T, items []T, label string) T {
	return items[len(items)-1-rapid.IntRange(0, len(items)-1).Draw(t, label)]
}

func indexes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
