package faults

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/turncheck/turncheck/internal/loopback"
	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/model"
)

// maxModelRequest bounds the body of a request to the fake model.
const maxModelRequest = 8 << 20

// ModelConfig configures a fake model.
type ModelConfig struct {
	// Addr is the address to listen on; "" means 127.0.0.1:0.
	Addr string
	// Log, if set, receives one line per call: the tokens it carried, its
	// place in its tool loop, the fault injected and the tools asked for;
	// one per lookup; and one per agent definition served.
	Log io.Writer
	// Clock, if set, stamps every call's and lookup's arrival
	// (model.Call.At, model.ToolRun.At), so that they fall on the same
	// timeline as what the harness records; nil numbers them 1, 2, 3... on
	// one count.
	Clock func() int64
	// Stall, if not 0, pauses every call and lookup for a random 0..Stall
	// before the model looks at it, as a busy machine would (stall.go);
	// 0 takes the pause StallModels sets, if any.
	Stall time.Duration
	// Auxiliary, if set, reports whether a call's instruction
	// (model.Call.Prompt) is known to be that of a call a server makes
	// beside its turns (a title, a summary): such a call is never held at
	// a gate, so that a client drawn to leave at a turn's model call
	// leaves at one of the turn's own (PROTOCOL.md, "Auxiliary model
	// calls"). It is still held once its turn's client went away (Drop).
	Auxiliary func(prompt uint32) bool
	// AgentDefinition, if set, is served at /agents/NAME.yaml in place of
	// the model's own definition (AgentDefinition): a template in the
	// server's own format, with AgentPlaceholders filled in, for a server
	// that reads no other.
	AgentDefinition string
}

// Model is a fake OpenAI-compatible model provider on loopback. It records
// every chat-completion request as the tokens it carries, and answers each by
// the script set for the token of the request's last user message: tool
// calls, a reply carrying the matching reply token, or a fault. It also
// serves the lookup tool (see ServeHTTP), so that a tool run shows on its
// timeline as calls do.
type Model struct {
	cfg     ModelConfig
	ln      net.Listener
	srv     *http.Server
	serving chan struct{}
	closing chan struct{}
	once    sync.Once
	active  sync.WaitGroup // calls in flight; none starts once closed
	logMu   sync.Mutex

	mu      sync.Mutex
	calls   []model.Call
	runs    []model.ToolRun
	seq     int64 // the last stamp given without a Clock
	scripts map[model.Token]*script
	// holding are the gates of calls and lookups being held now, for
	// Reset to let go and Holding to count.
	holding map[*Gate]bool
	// epoch, if not "", is the text a call must carry to be recorded.
	epoch string
	// servedBy is, for each turn's token, the replica whose model call
	// for it came latest: each replica of a server behind a front calls
	// the model at a base URL of its own (ReplicaURL).
	servedBy map[model.Token]int
	// dropped are the turns whose client went away (Drop).
	dropped map[model.Token]*drop
	// asked counts the askings of each round of each turn's tool loop
	// (Reply), which number their tool call ids: it outlives a turn's
	// script, so that a retry of the turn, scripted anew, is asked for
	// under ids of its own.
	asked map[roundOf]int
}

// roundOf names a round (from 1) of the tool loop of the turn tok.
type roundOf struct {
	tok   model.Token
	round int
}

// script is what the model does for one turn's token.
type script struct {
	reply Reply
	// calls counts the turn's calls at reply.Fault.Round, for its Times.
	calls   int
	arrived chan struct{}
	// gates are the points the turn is to be held at, each until its
	// first arrival there; taken, those where an arrival is held now.
	gates, taken map[Point]*Gate
}

// Gate holds the first arrival of one turn at one point (see Point): its
// first model call, a later one, part of the way through a streamed
// answer, or a lookup; until the harness releases it. Concurrent turns
// then reach the model, and go on from it, in an order the harness
// chooses, not in one the scheduler happens to pick: an interleaving
// replays; and a client can abort at a known point of a turn. A held call
// or lookup whose server gives up on it (the client went away, a deadline
// passed) ends unanswered. Safe for concurrent use.
type Gate struct {
	// tok is the turn whose call or lookup the gate holds, and conn the
	// connection of the request it holds (set under Model.mu).
	tok  model.Token
	conn net.Conn
	// at is when what the gate holds arrived, on the model's timeline
	// (model.Call.At, model.ToolRun.At): which of a turn's arrivals its
	// server gave up on (drop.go).
	at      int64
	arrived chan struct{}
	release chan struct{}
	once    sync.Once
	// leader, if not nil, is the gate this one follows: it holds a later
	// arrival at the leader's point, while the leader holds the first,
	// and is released with it (see takeGateLocked).
	leader *Gate
}

// newGate is a gate for a call or lookup of tok.
func newGate(tok model.Token) *Gate {
	return &Gate{tok: tok, arrived: make(chan struct{}), release: make(chan struct{})}
}

// Arrived is closed when the gated call or lookup has arrived and is being
// held.
func (g *Gate) Arrived() <-chan struct{} { return g.arrived }

// Release lets the held call or lookup go on, to its script's answer or
// fault. It may be called before it arrives, and more than once.
func (g *Gate) Release() {
	if g.leader != nil {
		g.leader.Release()
		return
	}
	g.once.Do(func() { close(g.release) })
}

// released is closed once the gate is released.
func (g *Gate) released() <-chan struct{} {
	if g.leader != nil {
		return g.leader.release
	}
	return g.release
}

// StartModel starts a fake model and returns once it is listening.
func StartModel(cfg ModelConfig) (*Model, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	ln, err := loopback.Listen(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("fake model: %w", err)
	}
	m := &Model{
		cfg:     cfg,
		ln:      ln,
		serving: make(chan struct{}),
		closing: make(chan struct{}),
		scripts: map[model.Token]*script{}, servedBy: map[model.Token]int{},
		holding: map[*Gate]bool{},
		dropped: map[model.Token]*drop{},
		asked:   map[roundOf]int{},
	}
	m.srv = &http.Server{Handler: m, ReadHeaderTimeout: 10 * time.Second,
		// Each request knows its connection: whether the server closed the
		// one of a call it gave up on shows before its next call (drop.go).
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) }}
	go func() {
		defer close(m.serving)
		_ = m.srv.Serve(ln)
	}()
	return m, nil
}

// URL is the base URL to configure a server with, ending in /v1; the model
// answers POST {URL}/chat/completions (and the same path without /v1).
func (m *Model) URL() string { return "http://" + m.ln.Addr().String() + "/v1" }

// Addr is the address the model listens on.
func (m *Model) Addr() string { return m.ln.Addr().String() }

// Close aborts held calls and lookups, closes every connection and waits
// for the model's goroutines to end.
func (m *Model) Close() error {
	m.once.Do(func() {
		m.mu.Lock()
		close(m.closing)
		m.mu.Unlock()
		_ = m.srv.Close()
		<-m.serving
		m.active.Wait()
	})
	return nil
}

// Script sets the fault for the next calls of the turn whose user token is
// tok, with no tool rounds: ScriptReply(tok, Reply{Fault: f}).
func (m *Model) Script(tok model.Token, f Fault) <-chan struct{} {
	return m.ScriptReply(tok, Reply{Fault: f})
}

// ScriptReply sets the whole script for the next calls of the turn whose
// user token is tok, replacing any earlier one (and its gates) and
// resetting its call count. The returned channel is closed when the first
// call of tok arrives, so that a client can abort at a known point rather
// than after a guessed delay.
func (m *Model) ScriptReply(tok model.Token, r Reply) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &script{reply: r, arrived: make(chan struct{})}
	m.scripts[tok] = s
	return s.arrived
}

// Gate holds the next first call of tok (the first after its latest
// Script) until the returned gate is released: HoldAt(tok, Point{}).
func (m *Model) Gate(tok model.Token) *Gate { return m.HoldAt(tok, Point{}) }

// HoldAt holds the first arrival of tok at p after its latest Script or
// ScriptReply until the returned gate is released; what arrives then goes
// on to tok's scripted answer or fault. Without a script, tok is answered
// normally. A turn may have gates at several points at once (one at
// Point{} to order concurrent turns, one later where the client will
// abort); a second gate at the same point replaces the first. A gate at a
// point the turn never reaches (a round beyond its script, a tool call
// that is not a lookup, Tool > 0 with Round < 1) never arrives.
func (m *Model) HoldAt(tok model.Token, p Point) *Gate {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.scripts[tok]
	if s == nil {
		s = &script{arrived: make(chan struct{})}
		m.scripts[tok] = s
	}
	if s.gates == nil {
		s.gates = map[Point]*Gate{}
	}
	g := newGate(tok)
	s.gates[p.normal()] = g
	return g
}

// Holding is how many calls and lookups are held at a gate right now,
// waiting for their release: a server whose turn is not done while its
// calls are held is waiting on the fake model, not hung. A call held by a
// Hold fault is not counted: that one waits for the server to give up.
func (m *Model) Holding() int { return m.holdingOf(func(*Gate) bool { return true }) }

// holdingOf counts the gates, of those of says, holding a call or lookup now, not yet
// released.
func (m *Model) holdingOf(of func(*Gate) bool) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for g := range m.holding {
		select {
		case <-g.released():
		default:
			if of(g) {
				n++
			}
		}
	}
	return n
}

// Forget drops the script for tok, and lets go of what Drop holds of it:
// later calls of it are answered normally. A server that replays an old
// message then gets a reply, not that message's fault all over again.
func (m *Model) Forget(tok model.Token) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.scripts, tok)
	m.releaseDropLocked(tok)
	delete(m.dropped, tok)
}

// Reset forgets every script, recorded call and tool run, and the count of
// each tool round's askings, and lets any held call or lookup go on: the
// model is as new, on the same address. A server started once, pointed at
// this model, can then serve check after check. With an epoch, only calls
// that carry it in the text of some message are recorded and scripted from
// now on; any other call (a late one, about a conversation of an earlier
// check) is answered as a plain reply and otherwise ignored, so that it
// cannot pass for a call of this check's turn with the same token. Lookup
// keys carry the epoch too, and a lookup without it is answered but not
// recorded or held. "" records every call and lookup.
func (m *Model) Reset(epoch string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.epoch = epoch
	for _, s := range m.scripts {
		for _, g := range s.gates {
			g.Release()
		}
	}
	for g := range m.holding {
		g.Release()
	}
	m.scripts = map[model.Token]*script{}
	m.dropped = map[model.Token]*drop{}
	m.servedBy = map[model.Token]int{}
	m.asked = map[roundOf]int{}
	m.calls = nil
	m.runs = nil
	m.seq = 0
}

// ReplicaURL is the model's base URL base (ending in /v1) as replica i of
// a server is given it: under a path of its own, which the model takes
// off and records (ServedBy), so that it tells which replica serves a
// turn where a front, not the harness, picks it.
func ReplicaURL(base string, i int) string {
	return strings.TrimSuffix(base, "/v1") + fmt.Sprintf("/replica/%d/v1", i)
}

// replicaPath is the path of a call made at a ReplicaURL.
var replicaPath = regexp.MustCompile(`^/replica/(\d+)(/.*)$`)

// ServedBy is the replica whose model call for tok came latest, for a
// server whose replicas were each given a ReplicaURL; ok is false if no
// call for tok came through one.
func (m *Model) ServedBy(tok model.Token) (replica int, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	replica, ok = m.servedBy[tok]
	return replica, ok
}

// CallCount is how many calls the model has recorded.
func (m *Model) CallCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.calls)
}

// CallsAfter returns the calls that arrived after at, on the model's
// timeline (ModelConfig.Clock), in arrival order.
func (m *Model) CallsAfter(at int64) []model.Call {
	m.mu.Lock()
	defer m.mu.Unlock()
	i, _ := slices.BinarySearchFunc(m.calls, at, func(c model.Call, at int64) int { return cmp.Compare(c.At, at+1) })
	return slices.Clone(m.calls[i:])
}

// ServeHTTP answers the chat-completion endpoint, serves agent definitions
// at GET /agents/NAME.yaml (see AgentDefinition), and runs the lookup tool
// at GET /tools/lookup?key=K (see serveLookup); each also under /v1.
func (m *Model) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	select {
	case <-m.closing:
		m.mu.Unlock()
		panic(http.ErrAbortHandler) // closed: no call starts
	default:
	}
	m.active.Add(1)
	m.mu.Unlock()
	defer m.active.Done()
	m.stall(r)
	replica := -1
	if sub := replicaPath.FindStringSubmatch(r.URL.Path); sub != nil {
		if n, err := strconv.Atoi(sub[1]); err == nil {
			replica, r.URL.Path = n, sub[2]
		}
	}
	if strings.Contains(r.URL.Path, "/agents/") {
		m.serveAgent(w, r)
		return
	}
	if r.URL.Path == "/v1/tools/lookup" || r.URL.Path == "/tools/lookup" {
		m.serveLookup(w, r)
		return
	}
	if r.URL.Path != "/v1/chat/completions" && r.URL.Path != "/chat/completions" {
		openai.WriteError(w, http.StatusNotFound, "not_found", "the fake model serves POST /v1/chat/completions")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		openai.WriteError(w, http.StatusMethodNotAllowed, "invalid_request_error", "use POST")
		return
	}
	req, err := decodeRequest(r.Body)
	if err != nil {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", "malformed request: "+err.Error())
		return
	}
	m.mu.Lock()
	epoch := m.epoch
	m.mu.Unlock()
	call := readCall(req.Messages, epoch)
	call.Offers = len(req.Tools) > 0
	if !ofEpoch(req.Messages, epoch) {
		m.answer(w, r, req, call, plan{})
		return
	}
	if replica >= 0 && call.Turn != "" {
		m.mu.Lock()
		m.servedBy[call.Turn] = replica
		m.mu.Unlock()
	}
	p, arrived := m.record(&call, req)
	if m.cfg.Log != nil {
		asks := ""
		if p.ask != nil {
			asks = " asks=" + strings.Join(p.ask, ",")
		}
		m.logMu.Lock()
		fmt.Fprintf(m.cfg.Log, "call turn=%s stream=%t round=%d fault=%q%s history=%s\n",
			orDash(call.Turn), req.Stream, p.round, p.fault, asks, model.FormatTokens(call.History))
		m.logMu.Unlock()
	}
	if arrived != nil {
		close(arrived)
	}
	m.answer(w, r, req, call, p)
}

// agentPath matches the paths agent definitions are served at: under the
// model's address, and under its base URL (/v1) for servers that are only
// given that.
var agentPath = regexp.MustCompile(`^(?:/v1)?/agents/([A-Za-z0-9_-]+)\.yaml$`)

// serveAgent answers GET /agents/NAME.yaml (or /v1/agents/NAME.yaml) with
// an agent definition, so that a server under test can load its agents
// from URLs on loopback (PROTOCOL.md, "Agent sources"):
//
//	name: NAME
//	instruction: You are NAME, loaded from /agents/NAME.yaml?QUERY.
//
// The request's raw query is echoed into the instruction (with no "?" when
// there is none), so that a server restarted with a changed query visibly
// sends the model a different instruction. It is not a model call and is not
// recorded as one. A NAME outside [A-Za-z0-9_-]+ is 404: nothing else in a
// name can be echoed unquoted into a path. With ModelConfig.AgentDefinition
// the template is served instead, filled in for NAME and QUERY.
func (m *Model) serveAgent(w http.ResponseWriter, r *http.Request) {
	match := agentPath.FindStringSubmatch(r.URL.Path)
	if match == nil {
		openai.WriteError(w, http.StatusNotFound, "not_found", "the fake model serves agents at GET /agents/NAME.yaml, NAME in [A-Za-z0-9_-]+")
		return
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		openai.WriteError(w, http.StatusMethodNotAllowed, "invalid_request_error", "use GET")
		return
	}
	name := match[1]
	var body []byte
	if m.cfg.AgentDefinition != "" {
		body = []byte(agentText(m.cfg.AgentDefinition, m.URL(), name, r.URL.RawQuery))
	} else {
		// Marshalled, not formatted: the query is the client's and may
		// hold anything YAML would read as syntax.
		var err error
		body, err = yaml.Marshal(AgentDefinition{Name: name, Instruction: agentInstruction(name, r.URL.RawQuery)})
		if err != nil {
			openai.WriteError(w, http.StatusInternalServerError, "server_error", err.Error())
			return
		}
	}
	if m.cfg.Log != nil {
		m.logMu.Lock()
		fmt.Fprintf(m.cfg.Log, "agent %s query=%q\n", name, r.URL.RawQuery)
		m.logMu.Unlock()
	}
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(body)
}

// AgentDefinition is the agent definition the fake model serves at GET
// /agents/NAME.yaml, as YAML.
type AgentDefinition struct {
	// Name is NAME from the path.
	Name string `yaml:"name"`
	// Instruction is "You are NAME, loaded from /agents/NAME.yaml?QUERY.",
	// QUERY the request's raw query.
	Instruction string `yaml:"instruction"`
}

// plan is how the model answers one call of a turn.
type plan struct {
	// s is the turn's script, where its gates are; nil if it has none.
	s *script
	// round is how many of the turn's tool rounds the call carries the
	// results of: the call's place in the tool loop.
	round int
	// ask is the round of tool calls to answer with; nil: the reply.
	ask Round
	// asking is which asking of round+1 ask is, for its tool call ids.
	asking int
	fault  Fault
	// epoch is the model's epoch when the call arrived, for lookup keys.
	epoch string
	// first is the gate the call is held at before it is answered, taken
	// as it is recorded: when its arrival shows, so does its hold.
	first *Gate
	// at is when the call arrived (model.Call.At).
	at int64
	// auxiliary: the call's instruction is known to be an auxiliary
	// call's (ModelConfig.Auxiliary); no gate holds it.
	auxiliary bool
}

// record stamps and appends call and returns how to answer it, and, if this
// is the first call of its turn, the arrival channel to close.
func (m *Model) record(call *model.Call, req *openai.ChatRequest) (plan, chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	call.At = m.stamp()
	m.calls = append(m.calls, *call)
	s := m.scripts[call.Turn]
	// A turn whose client went away has nothing answered now: the call is
	// held first (Drop).
	dropGate := m.dropGateLocked(call.Turn, call.At)
	if s == nil || call.Turn == "" {
		return plan{first: dropGate, at: call.At}, nil
	}
	p := plan{s: s, round: completedRounds(call.Turn, s.reply.Rounds, req.Messages), epoch: m.epoch, at: call.At,
		auxiliary: m.cfg.Auxiliary != nil && m.cfg.Auxiliary(call.Prompt)}
	if p.round < len(s.reply.Rounds) && offers(req.Tools, s.reply.Rounds[p.round]) {
		p.ask = s.reply.Rounds[p.round]
	}
	arrived := s.arrived
	s.arrived = nil
	if p.first = dropGate; p.first == nil && !p.auxiliary {
		if p.first = m.takeGateLocked(s, p.gatesAt(0, firstHold(req.Stream))); p.first != nil {
			p.first.at = call.At
		}
	}
	if f := s.reply.Fault; f.Round == p.round {
		s.calls++
		if f.Times == 0 || s.calls <= f.Times {
			p.fault = f
		}
	}
	if p.ask != nil && p.fault.Kind != Status && p.fault.Kind != Hold {
		// Counted here, in the order calls are recorded, so that ids do
		// not depend on how answers race; a call answered with an error,
		// or held until the server gives up, shows no ids and asks for
		// nothing.
		r := roundOf{call.Turn, p.round + 1}
		m.asked[r]++
		p.asking = m.asked[r]
	}
	return p, arrived
}

// answering marks the recorded call that arrived at as begun to be
// answered (model.Call.Unanswered), before anything of its answer is
// written, so that no server can have acted on the answer before: with
// the arrival of the latest call recorded, not a tick of its own, which
// would move every later one.
func (m *Model) answering(at int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i, ok := slices.BinarySearchFunc(m.calls, at, func(c model.Call, at int64) int { return cmp.Compare(c.At, at) }); ok {
		m.calls[i].Unanswered = m.calls[len(m.calls)-1].At
	}
}

// stamp is the time of an arrival on the model's timeline; m.mu is held.
func (m *Model) stamp() int64 {
	if m.cfg.Clock != nil {
		return m.cfg.Clock()
	}
	m.seq++
	return m.seq
}

// takeGate takes the gate of s at the point, of those at matches, with the
// fewest chunks: it is no longer waiting for an arrival, it is holding one.
// Nil if there is none.
func (m *Model) takeGate(s *script, matches func(Point) bool) *Gate {
	if s == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.takeGateLocked(s, matches)
}

// takeGateLocked is takeGate with m.mu held.
func (m *Model) takeGateLocked(s *script, matches func(Point) bool) *Gate {
	var (
		at    Point
		found *Gate
	)
	for p, g := range s.gates {
		if matches(p) && (found == nil || p.Chunks < at.Chunks) {
			at, found = p, g
		}
	}
	if found != nil {
		delete(s.gates, at)
		if s.taken == nil {
			s.taken = map[Point]*Gate{}
		}
		s.taken[at] = found
		m.holding[found] = true
		return found
	}
	// A later arrival at a point whose gate holds one still waits with
	// it: a server may make a call of its own beside the turn's (a title,
	// PROTOCOL.md "Auxiliary model calls"), and whichever comes first,
	// the turn is held where the harness put it, and nothing of it is
	// answered before the gate's release.
	for p, g := range s.taken {
		select {
		case <-g.release:
			delete(s.taken, p)
			continue
		default:
		}
		if matches(p) {
			f := newGate(g.tok)
			f.leader = g
			m.holding[f] = true
			return f
		}
	}
	return nil
}

// hold holds what arrived at g until g is released (true) or the server
// gives up on its request (false). A closing model aborts it.
func (m *Model) hold(r *http.Request, g *Gate) bool {
	defer m.unhold(g)
	m.mu.Lock()
	g.conn, _ = r.Context().Value(connKey{}).(net.Conn)
	m.mu.Unlock()
	close(g.arrived)
	select {
	case <-g.released():
		return true
	case <-r.Context().Done():
		m.gaveUp(g)
		return false
	case <-m.closing:
		// Shutting down: drop the request rather than let net/http end it
		// with a response the server would take for an answer.
		panic(http.ErrAbortHandler)
	}
}

// gatesAt matches the points that hold a call of p after from lo to hi
// chunks.
func (p plan) gatesAt(lo, hi int) func(Point) bool {
	return func(at Point) bool {
		return at.Tool == 0 && at.Round == p.round && lo <= at.Chunks && at.Chunks <= hi
	}
}

// firstHold is the most chunks a point may count and still hold a call
// before it is answered at all: 0 for a stream, which can be held between
// chunks (every answer streams at least one); any for a call answered
// whole.
func firstHold(stream bool) int {
	if stream {
		return 0
	}
	return math.MaxInt
}

// holdCall holds a call of p at its gates for chunk counts from lo to hi,
// in order; false if the server gave up on it meanwhile.
func (m *Model) holdCall(r *http.Request, p plan, lo, hi int, flush func()) bool {
	if p.auxiliary {
		return true
	}
	for {
		g := m.takeGate(p.s, p.gatesAt(lo, hi))
		if g == nil {
			return true
		}
		if flush != nil {
			flush() // what was streamed before the hold is the server's
		}
		m.mu.Lock()
		g.at = p.at
		m.mu.Unlock()
		if !m.hold(r, g) {
			return false
		}
	}
}

// ofEpoch reports whether a request carries epoch, the model's current
// one (see Reset).
func ofEpoch(msgs []openai.Message, epoch string) bool {
	if epoch == "" {
		return true
	}
	for _, msg := range msgs {
		if strings.Contains(string(msg.Content), epoch) {
			return true
		}
	}
	return false
}

// unhold forgets a gate whose call or lookup is no longer held.
func (m *Model) unhold(g *Gate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.holding, g)
}

// decodeRequest reads a chat request that is one JSON object and nothing
// more.
func decodeRequest(body io.Reader) (*openai.ChatRequest, error) {
	raw, err := io.ReadAll(io.LimitReader(body, maxModelRequest+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > maxModelRequest {
		return nil, fmt.Errorf("body over %d bytes", maxModelRequest)
	}
	var req openai.ChatRequest
	if err := openai.DecodeObject(raw, &req); err != nil {
		return nil, err
	}
	return &req, nil
}

// readCall reads a request as tokens: all of them in message order, and the
// token of the last user message; and its tool traffic. A tool loop's
// later calls end in assistant and tool messages after the user's, which
// leave the turn as it is.
//
// With an epoch (Reset), a user message that carries another epoch's tag
// is of another check's conversation: its tokens, and the replies to
// them, are the call's Foreign tokens, not its history. They reach this
// check only through a server that leaks one conversation into another
// (T5), and a token of another check must never be read as one of this
// check's with the same number.
func readCall(msgs []openai.Message, epoch string) model.Call {
	var call model.Call
	leaks := model.Leaks{Tag: epoch}
	prevUser := false
	var events []model.ToolEvent
	tooled := false
	prompt := fnv.New32a()
	// merged is the call's last user message if it carries the turn's
	// token, to be read for text merged after the harness's own once the
	// loop is done: only the last one decides Tail, and Trailing where
	// nothing follows it (mergedLast).
	merged, mergedLast := "", false
	for _, msg := range msgs {
		switch msg.Role {
		case openai.RoleSystem, openai.RoleDeveloper:
			_, _ = io.WriteString(prompt, string(msg.Content))
			call.Prompt = prompt.Sum32()
		case openai.RoleAssistant:
			for _, tc := range msg.ToolCalls {
				events = append(events, model.ToolEvent{Kind: model.ToolCalled, ID: tc.ID})
				tooled = true
			}
		case openai.RoleTool:
			events = append(events, model.ToolEvent{Kind: model.ToolAnswered, ID: msg.ToolCallID})
			tooled = true
		case openai.RoleUser:
			events = append(events, model.ToolEvent{Kind: model.UserMessage})
		}
		toks := model.Tokens(string(msg.Content))
		isUser := msg.Role == openai.RoleUser
		if leaks.Foreign(string(msg.Content), toks, isUser) {
			call.Foreign = append(call.Foreign, toks...)
			prevUser = isUser
			continue
		}
		call.History = append(call.History, toks...)
		call.Trailing, mergedLast = len(toks) == 0, false
		if isUser && !prevUser {
			// A new run of user messages: the call's turn is read from the
			// last run. Within it, a server may have merged the user's
			// messages into one, or appended messages without a token (an
			// internal context block) after the user's (PROTOCOL.md); a
			// message after an assistant's reply is a new one.
			call.Turn, call.Tail = "", false
		}
		prevUser = isUser
		if !isUser {
			continue
		}
		tokened := false
		for _, t := range toks {
			if t.IsUser() {
				call.Turn, tokened = t, true
			}
		}
		call.Tail = !tokened
		call.Trailing = call.Trailing || call.Tail
		merged, mergedLast = "", false
		if tokened {
			merged, mergedLast = string(msg.Content), true
		}
	}
	if merged != "" && mergedAfter(merged) {
		// A tokenless message the server merged into the user's (its
		// client merges consecutive user messages, as docker-agent's
		// does) follows it in the same message: text after the harness's
		// own counts as one after it.
		call.Tail = true
		call.Trailing = call.Trailing || mergedLast
	}
	if call.History == nil {
		call.History = []model.Token{}
	}
	call.ForeignFrom = leaks.From()
	if tooled {
		// Only then: a plain history stays as small as it was.
		call.Tools = events
	}
	return call
}

// harnessMessage matches a user message as the harness sends it
// (plan.UserText, then the check's epoch tag on a shared server), at the
// start of a message's text.
var harnessMessage = regexp.MustCompile(`^Please remember tc-u[0-9]+\.(?: \(tc[0-9a-f]+(?:-[0-9]+)?\))?`)

// mergedAfter reports whether content is a user message of the harness's
// with text after it: a later message the server merged into it.
func mergedAfter(content string) bool {
	loc := harnessMessage.FindStringIndex(content)
	return loc != nil && strings.TrimSpace(content[loc[1]:]) != ""
}

// answered reports whether call's last user token is followed, in its
// history, by its reply: the call carries no new user message.
func answered(call model.Call) bool {
	for i := len(call.History) - 1; call.Turn != "" && i >= 0; i-- {
		if call.History[i] == call.Turn {
			return slices.Contains(call.History[i+1:], call.Turn.Reply())
		}
	}
	return false
}

// ReplyChunks is the reply the fake model writes for the turn tok, as the
// chunks it streams. The reply token comes first, so that a reply cut after
// one chunk still carries it.
func ReplyChunks(tok model.Token) []string {
	return []string{string(tok.Reply()), " acknowledges", " your", " message."}
}

// answer answers a call by its plan: holds it at its gates, then injects
// its fault, or writes its tool calls or its reply, streamed or whole.
func (m *Model) answer(w http.ResponseWriter, r *http.Request, req *openai.ChatRequest, call model.Call, p plan) {
	var a answerText
	switch {
	case p.ask != nil:
		a = toolAnswer(call.Turn, p.round+1, p.asking, p.ask, p.epoch)
	case answered(call):
		// Its last user message has its reply already: the request brings
		// nothing new to answer (a client tool's output, a blank message),
		// and the reply carries no token that a history could take for
		// that turn's.
		a = replyAnswer("", call.At)
	default:
		a = replyAnswer(call.Turn, call.At)
	}
	n := len(a.deltas)
	// Where a count of chunks holds a call: after that many, or before the
	// finish for any count beyond the answer; a call answered whole is
	// held before it is answered at all.
	upTo := func(c int) int {
		if c < n && req.Stream {
			return c
		}
		return math.MaxInt
	}
	// The first gate was taken when the call was recorded; any others
	// before the answer (a call answered whole) hold it in turn.
	if p.first != nil && !m.hold(r, p.first) || !m.holdCall(r, p, 0, upTo(0), nil) {
		return // the server gave up on the call
	}
	m.answering(call.At)
	f := p.fault
	switch f.Kind {
	case Status:
		if f.Status < 400 {
			f.Status = http.StatusInternalServerError
		}
		if f.RetryHint {
			w.Header().Set("Retry-After", "0")
		}
		openai.WriteError(w, f.Status, "server_error", fmt.Sprintf("injected model error %d", f.Status))
		return
	case Hold:
		select {
		case <-r.Context().Done():
		case <-m.closing:
			// Shutting down: drop the call rather than let net/http end it
			// with an empty 200 the server would take for a reply.
			panic(http.ErrAbortHandler)
		}
		return
	}
	usage := &openai.Usage{PromptTokens: len(call.History), CompletionTokens: n}
	usage.TotalTokens = usage.PromptTokens + usage.CompletionTokens
	if !req.Stream {
		m.answerWhole(w, a, usage, f)
		return
	}
	// The chunks go out together, not one write each: no check depends
	// on the server reading them one at a time. Where the stream stops
	// (a hold, a cut), all before it is sent first.
	sw := sse.NewBufferedWriter(w)
	w.WriteHeader(http.StatusOK)
	_ = sw.Data(openai.Encode(chunk(openai.Delta{Role: openai.RoleAssistant}, nil)))
	for c := 0; c <= n; c++ {
		if c > 0 && !m.holdCall(r, p, c, upTo(c), sw.Flush) {
			panic(http.ErrAbortHandler) // the server gave up mid-stream
		}
		if c == f.After || (c == n && f.After > n) {
			switch f.Kind {
			case Cut:
				sw.Flush()
				panic(http.ErrAbortHandler) // the connection drops mid-stream
			case Malformed:
				_ = sw.Data(malformedChunk)
			}
		}
		if c < n {
			_ = sw.Data(openai.Encode(chunk(a.deltas[c], nil)))
		}
	}
	_ = sw.Data(openai.Encode(chunk(openai.Delta{}, openai.Ptr(a.finish))))
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		// As OpenAI sends it: after the finish, no choices, then [DONE].
		_ = sw.Data(openai.Encode(openai.Completion{ID: "fake", Object: openai.ObjectChunk, Model: "fake",
			Choices: []openai.Choice{}, Usage: usage}))
	}
	_ = sw.Data(openai.DoneSentinel)
}

// answerText is an answer before any fault: the deltas that stream it (the
// chunks a Fault's After and a Point's Chunks count), the whole message,
// and its finish reason.
type answerText struct {
	deltas  []openai.Delta
	message openai.Message
	finish  string
}

// replyAnswer is the reply to the turn tok (ReplyChunks) by the call
// stamped at (0: unrecorded): its last chunk names the call
// (model.CallMark), so that the harness tells which call's reply reached
// the client. A reply cut short has no name, and no outcome of ok either.
func replyAnswer(tok model.Token, at int64) answerText {
	chunks := ReplyChunks(tok)
	if tok == "" {
		chunks = []string{model.NoTokenReply}
	}
	if at != 0 {
		last := len(chunks) - 1
		chunks[last] = strings.TrimSuffix(chunks[last], ".") + " " + model.CallMark(at) + "."
	}
	a := answerText{
		message: openai.Message{Role: openai.RoleAssistant, Content: openai.Content(strings.Join(chunks, ""))},
		finish:  openai.FinishStop,
	}
	for _, c := range chunks {
		a.deltas = append(a.deltas, openai.Delta{Content: c})
	}
	return a
}

func (m *Model) answerWhole(w http.ResponseWriter, a answerText, usage *openai.Usage, f Fault) {
	body := openai.Encode(openai.Completion{
		ID: "fake", Object: openai.ObjectCompletion, Model: "fake", Usage: usage,
		Choices: []openai.Choice{{Message: &a.message, FinishReason: openai.Ptr(a.finish)}},
	})
	w.Header().Set("Content-Type", "application/json")
	switch f.Kind {
	case Cut:
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, body[:len(body)/2])
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		panic(http.ErrAbortHandler)
	case Malformed:
		body = body[:len(body)/2]
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, body)
}

// malformedChunk is a chunk cut off mid-JSON.
const malformedChunk = `{"id":"fake","object":"chat.completion.chunk","choices":[{"delta":`

func chunk(d openai.Delta, finish *string) openai.Completion {
	return openai.Completion{
		ID: "fake", Object: openai.ObjectChunk, Model: "fake",
		Choices: []openai.Choice{{Delta: &d, FinishReason: finish}},
	}
}

func orDash(t model.Token) string {
	if t == "" {
		return "-"
	}
	return string(t)
}
