package targets

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/turncheck/turncheck/internal/goroutines"
	"github.com/turncheck/turncheck/internal/loopback"
	"github.com/turncheck/turncheck/model"
)

// Target starts the servers under test: a fresh one for every check, so
// that each check starts from empty state and replays on its own.
type Target interface {
	// Start starts a server with no conversations that calls the model
	// provider at modelURL (an OpenAI-compatible base URL ending in /v1).
	Start(modelURL string) (Server, error)
	// Profile says how to talk to the servers Start returns.
	Profile() Profile
}

// DefaultConversationHeader is the header that names a conversation when
// a profile names none (PROTOCOL.md).
const DefaultConversationHeader = "X-Conversation-Id"

// Server is one running server under test.
type Server interface {
	// URL is the base URL; the chat endpoint is URL + "/v1/chat/completions".
	URL() string
	// Close stops the server and removes what it left behind.
	Close() error
}

// Profile says how a server is reached: what the client sends it.
type Profile struct {
	// Protocol is how conversations and turns reach the server; "" means
	// Chat. Sessions needs SessionsAPI.
	Protocol    Protocol
	SessionsAPI *SessionsAPI
	// ResponsesAPI is what a Responses API server declares of its
	// semantics; nil takes the defaults (OpenAI's).
	ResponsesAPI *ResponsesAPI
	// ACPCaps are what the harness advertises to an ACP agent (Protocol
	// ACP).
	ACPCaps ACPCapabilities
	// A2AAPI is what an A2A agent declares (Protocol A2A); never nil
	// under A2A.
	A2AAPI *A2AAPI
	// Header names the conversation header; "" means X-Conversation-Id.
	Header string
	// Keys are API keys the server accepts. With two or more, the harness
	// checks that conversations are scoped per key (T5); with none it sends
	// no Authorization header.
	Keys []string
	// Model is the "model" value sent in every request.
	Model string
	// Concurrency is the policy the server declares for a request on a
	// conversation whose turn is still running: it waits (Serialize, the
	// zero value) or gets 409 (Reject). The server is judged by it (T4).
	Concurrency model.Concurrency
	// ModelTimeout is the server's own model-call timeout: the client
	// waits that long and a margin for an answer before it takes a turn's
	// outcome as unknown. 0 means 20s.
	ModelTimeout time.Duration
	// ClientTimeout is how long the client waits for a turn's response
	// before it takes the outcome as unknown; 0 means ModelTimeout plus
	// 10s. A server whose first turn after a start takes minutes needs a
	// long one, without a long ModelTimeout slowing every held call.
	ClientTimeout time.Duration
	// Baseline is the file of known findings a run takes (conform
	// --baseline), as the profile names it: relative to the profile's
	// directory. "" for none.
	Baseline string
	// Supersede is an ACP agent's concurrency policy, beside Serialize: a
	// prompt on a busy session cancels the running one (answered
	// cancelled), which is then an interrupted turn judged by the
	// interruption policy (T10), and runs after it.
	Supersede bool
	// QueueTimeout is the longest a turn serialized behind another of its
	// conversation waits before the server refuses it (a bounded wait):
	// only a refusal after it passed may be one (T4). 0 means the model
	// timeout, for a server that bounds the wait as it bounds a call.
	QueueTimeout time.Duration
	// TakeoverAfter is how long after a kill (kill -9) of the server, or
	// of one of its replicas, a conversation that had a turn in flight
	// then may stay busy: a server that runs as replicas cannot tell a
	// dead peer from one cut off from their store, and takes over a
	// peer's conversation only once the peer has been silent this long.
	// A request on such a conversation sent within it may be refused
	// (a status past 409 before any model call) without that being a
	// conversation that did not resume (T7) nor a refusal to wait (T4).
	// 0: none may be; a conversation is free the moment its server is
	// back.
	TakeoverAfter time.Duration
	// Eviction is what the server declares becomes of an evicted
	// conversation; "" means Durable. Capacity is how many conversations
	// its cache holds (0: not declared). A server that forgets is given at
	// most Capacity conversations in a check, so that it never has to
	// forget one the check still uses.
	Eviction Eviction
	Capacity int
	// Interruption is what the server declares it does with an
	// interrupted turn; "" means Rollback.
	Interruption Interruption
	// Assumed holds, for each policy the profile left out (concurrency,
	// eviction, interruption), what was taken for it and what else it
	// could have said: a finding judged by an assumed policy says so.
	Assumed map[string]string
	// Durability is what the server declares survives a restart and a
	// crash; the harness restarts, or crashes, only a server that declares
	// it survives that.
	Durability Durability
	// RestartShare is the share of the steps drawn that may restart or
	// crash the server, counted (execute.Ration): a server slow to
	// restart declares less than 1, and a restart drawn past it gives way
	// to a turn. 0 means DefaultRestartShare; 1 never rations them.
	RestartShare float64
	// StartTries is how many times a start of the server (its first, one
	// between two checks, a restart or crash a step drew) is tried
	// before the server counts as not started, the start finding
	// (model.Start): a try the server failed (it exited, or was not
	// ready in time) is tried again, and said in the run's notes. 0
	// means DefaultStartTries.
	StartTries int
	// Agent names the agent the server loads from the fake model, at
	// http://MODEL/agents/AGENT.yaml?QUERY; "" if it loads none. The
	// harness restarts such a server with the reference's query changed,
	// and with two references sharing its stable key (T8).
	Agent string
	// AgentHost, if not "", is the host the agent references name in
	// place of the fake model's IP: "localhost", for a server that loads
	// plain-http sources only from there.
	AgentHost string
	// AgentDefinition, if not "", is the agent definition the fake model
	// serves, in the server's own format: a template with
	// faults.AgentPlaceholders (faults.ModelConfig.AgentDefinition).
	AgentDefinition string
	// OneSource says the server loads one agent source at a time (its
	// command takes one reference): the harness never restarts it with
	// two, and the half of T8 that needs two sharing a stable key is not
	// applicable.
	OneSource bool
	// Tools says that the server offers the model the tools echo {text}
	// and lookup {key} of PROTOCOL.md's tool loop (lookup GETs
	// MODEL/tools/lookup?key=KEY): the fake model then asks for tool
	// calls, and tool pairs (T9) and working-copy leaks (T11) are checked.
	// Without it they are not applicable.
	Tools bool
}

// DefaultStartTries is how many times a start is tried when a profile
// does not say: once. A server that does not start on its first try is
// broken, and said so at once: a retry that hid it, unasked, would pass
// a server whose users meet the same failures, and double the wait for
// a command that can never start (a profile being written). A server
// known to start only on a second try under load declares it
// (server.start_tries), and each retry is still said.
const DefaultStartTries = 1

// StartTriesOrDefault is how many times p has a start tried.
func (p Profile) StartTriesOrDefault() int {
	if p.StartTries <= 0 {
		return DefaultStartTries
	}
	return p.StartTries
}

// AppendsInput reports whether the server appends a turn's input whole to
// the history it continues (the Responses API; a session API whose input
// is "appended"), rather than taking its last message as the new one:
// a continuation without a new user message is then sent in the shapes
// such a server appends as they stand, and judged by what the model is
// made to see (T3).
func (p Profile) AppendsInput() bool {
	return p.Protocol == Responses || p.Protocol == Sessions && p.SessionsAPI != nil && p.SessionsAPI.Input != InputLast
}

// Policies are the Policies p declares, as the reference model takes
// them.
func (p Profile) Policies() model.Policies {
	pol := model.Policies{Concurrency: p.Concurrency, KeepConsistent: p.Interruption == KeepConsistent,
		Complete: p.Interruption == Complete}
	if p.Eviction == Forgets {
		pol.Forgets = p.Capacity
	}
	return pol
}

// RequestTimeout bounds one request: the server's model timeout and a
// margin.
func (p Profile) RequestTimeout() time.Duration {
	if p.ClientTimeout > 0 {
		return p.ClientTimeout
	}
	if p.ModelTimeout <= 0 {
		return ClientTimeout
	}
	return p.ModelTimeout + ClientTimeout - DefaultModelTimeout
}

// ModelTimeoutOrDefault is the model-call timeout p declares, or the one it is
// taken to declare.
func (p Profile) ModelTimeoutOrDefault() time.Duration {
	if p.ModelTimeout <= 0 {
		return DefaultModelTimeout
	}
	return p.ModelTimeout
}

// QueueTimeoutOrDefault is the bound p declares on a serialized turn's
// wait, or the one it is taken to declare: its model timeout.
func (p Profile) QueueTimeoutOrDefault() time.Duration {
	if p.QueueTimeout > 0 {
		return p.QueueTimeout
	}
	return p.ModelTimeoutOrDefault()
}

// HeaderName is the conversation header p names, or the default one.
func (p Profile) HeaderName() string {
	if p.Header == "" {
		return DefaultConversationHeader
	}
	return p.Header
}

// DeadlineController is a Server whose model-call deadlines the harness can
// bring forward. A call held "until the server's timeout" then times out
// when the harness sees it arrive, at a known point: the run does not hang
// on a timer, and no stall can time out a turn that was meant to succeed.
// Servers without it time out on their own clock.
type DeadlineController interface {
	Server
	// ExpireDeadlines makes the deadline of every model call in flight pass
	// now.
	ExpireDeadlines()
}

// Restarter is a Server that the harness can stop, or crash, and start
// again on the same data, to check that committed turns survive (T7) and
// that conversations resume when their agent source's reference changes
// (T8). Servers without it are never restarted.
type Restarter interface {
	Server
	// Restart stops the server, gracefully or as kill -9 does (crash),
	// and starts it again on the same data, loading the given agent
	// references (nil: the same as before). It returns once the server is
	// ready; its URL may have changed.
	Restart(crash bool, agents []string) error
}

// ActivityReporter is a Server that says how many requests it is working
// on and how many of those wait for their conversation's turn. The harness
// then knows, without a timer, when the requests of a burst have all come
// to rest (each answered, held by the model, or queued behind another), so
// that an interleaving replays from its seed, and when the server is idle
// between steps. Servers without it are given a short quiet period
// instead, and may interleave a replay differently.
type ActivityReporter interface {
	Server
	// Activity returns how many requests the server is working on, how
	// many of them wait for their conversation's turn, and a channel
	// closed at the next change of either.
	Activity() (working, waiting int, changed <-chan struct{})
}

// WorkReporter is a Server that says how many requests it is working on,
// though not which of them wait for their conversation's turn: a Handler,
// whose requests the harness counts as they pass through it, and a front.
// The harness then knows when the server is idle between steps, with no
// quiet period; a burst's requests come to rest by a quiet period unless
// it is a ParkReporter too.
type WorkReporter interface {
	Server
	// Working returns how many requests the server is working on, and a
	// channel closed at the next change.
	Working() (working int, changed <-chan struct{})
}

// ParkReporter is a Server that says of each request whether it is
// parked: in the server, with every goroutine working on it waiting on a
// lock, a channel or a read, none running and none waiting for the answer
// to a call of its own (the model's). A burst whose requests are each
// answered, held by the model or parked is at rest, known without a timer.
// A Handler is one: its requests' goroutines run in the harness's own
// process, labelled with their request's tag (RequestTagHeader), and
// every goroutine they start inherits the label.
type ParkReporter interface {
	Server
	// Parked says, of each request tagged tags, what its goroutines are
	// doing (Working for one not in the server, Asleep for one whose
	// goroutines cannot be seen).
	Parked(tags []string) []goroutines.State
}

// KnowsRest reports whether srv says when a burst's requests have come to
// rest (an ActivityReporter or a ParkReporter): a burst then replays in
// the interleaving its plan draws, with no quiet period.
func KnowsRest(srv Server) bool {
	switch srv.(type) {
	case ActivityReporter, ParkReporter:
		return true
	}
	return false
}

// DisconnectReporter is a Server that says when it is done with a
// request: it saw the request's client go away, or answered it. The
// harness tags each request with RequestTagHeader. From then on a server
// that stops starts nothing more for that turn (T10), so the harness lets
// go of what the model holds of a dropped turn then, with no wait for a
// server still on its way to seeing the disconnect. Servers without it
// are waited for until they give up on what the model holds (PROTOCOL.md,
// "Time").
type DisconnectReporter interface {
	Server
	// DoneWith reports whether the server is done with the request tagged
	// tag.
	DoneWith(tag string) bool
}

// RequestTagHeader is the header the harness tags each request with for
// a DisconnectReporter (the reference server's sut.RequestTagHeader) or a
// ParkReporter.
const RequestTagHeader = "Turncheck-Request"

// Specifier is a Target that says how a saved report names it, so that
// a replay can start the same server: the reference target does (package
// scenarios/reference). A report of any other Target names it "go".
type Specifier interface {
	Target
	// Spec is how a report names the target.
	Spec() ServerSpec
}

// FirstSource is the query of the reference to a server's agent at its
// first start; a restart may load the agent under another (T8).
const FirstSource = "tag=v1"

// AgentRefs are the references a server loads its agent from at its
// first start: the fake model at modelURL serves agent under them, and
// the harness changes their query across restarts (T8).
func AgentRefs(modelURL, agent string) []string {
	return SourceRefs(modelURL, agent, []string{FirstSource})
}

// Remote is a Target for a server that already runs at URL, started by
// someone else and configured to call its model at http://ModelAddr/v1,
// where the harness's fake model listens during the run. Every check of a
// run shares it, each under a namespace of conversation ids of its own;
// it cannot be restarted or crashed, so the invariants about restarts are
// not applicable to it.
type Remote struct {
	// URL is the server's base URL (the chat endpoint is URL +
	// "/v1/chat/completions"), on loopback.
	URL string
	// ModelAt is the loopback host:port the fake model listens on.
	ModelAt string
	// Reaches is how to talk to the server.
	Reaches Profile
}

// Profile returns r.Reaches.
func (r Remote) Profile() Profile { return r.Reaches }

// Start returns the running server, once it answers HTTP at all; modelURL
// is where the server was told to call its model, which Remote cannot
// change: the fake model listens at ModelAt instead.
func (r Remote) Start(string) (Server, error) {
	s := remoteServer(r.URL)
	if err := s.answers(); err != nil {
		return nil, err
	}
	return s, nil
}

// ReuseServer is true: there is only the one server.
func (r Remote) ReuseServer() bool { return true }

// ModelAddr returns r.ModelAt.
func (r Remote) ModelAddr() string { return r.ModelAt }

// String is the URL, for reports.
func (r Remote) String() string { return r.URL }

type remoteServer string

func (s remoteServer) URL() string { return string(s) }

// Close does nothing: the server is someone else's to stop.
func (s remoteServer) Close() error { return nil }

// answers probes the server: any HTTP answer will do.
func (s remoteServer) answers() error {
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	resp, err := c.Get(string(s))
	if err != nil {
		return fmt.Errorf("no server answers at %s: %w", string(s), err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.Body.Close()
}

// Handler is a Target for a Go server that is an http.Handler. Every check
// builds a fresh handler with newHandler, given the fake model's base URL
// (ending in /v1) and a fresh data directory, and serves it on a loopback
// port; when the check ends the listener closes, then the handler's Close
// runs, if it has one (io.Closer, or Close() with no result), and the data
// directory is removed. The server is talked to as p says.
func Handler(p Profile, newHandler func(modelURL, dataDir string) (http.Handler, error)) Target {
	return handlerTarget{p: p, newHandler: newHandler}
}

type handlerTarget struct {
	p          Profile
	newHandler func(modelURL, dataDir string) (http.Handler, error)
}

func (h handlerTarget) Profile() Profile { return h.p }

func (h handlerTarget) Start(modelURL string) (Server, error) {
	dir, err := os.MkdirTemp("", "turncheck-handler-*")
	if err != nil {
		return nil, err
	}
	handler, err := h.newHandler(modelURL, dir)
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	ln, err := loopback.Listen("")
	if err != nil {
		return nil, errors.Join(err, closeHandler(handler), os.RemoveAll(dir))
	}
	s := &handlerServer{ln: ln, handler: handler, dir: dir, served: make(chan struct{}), changed: make(chan struct{}), in: map[string]int{}}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

type handlerServer struct {
	srv     *http.Server
	ln      net.Listener
	handler http.Handler
	dir     string
	served  chan struct{}

	mu sync.Mutex
	// working counts the requests in the handler; changed is closed, and
	// made anew, at each change of it (WorkReporter).
	working int
	changed chan struct{}
	// in counts, by tag, the requests in the handler whose goroutine
	// carries its label (ParkReporter).
	in map[string]int
}

// requestLabel is the pprof label each request's goroutines carry: its
// tag.
const requestLabel = "turncheck-request"

// serve passes r to the handler, counting it while it is there, its
// goroutine labelled with its tag: every goroutine the handler starts for
// it carries the label too (ParkReporter).
func (s *handlerServer) serve(w http.ResponseWriter, r *http.Request) {
	s.count(1)
	defer s.count(-1)
	tag := r.Header.Get(RequestTagHeader)
	if tag == "" {
		s.handler.ServeHTTP(w, r)
		return
	}
	// The handler gets the labelled context: one that labels its own
	// goroutines from it (pprof.Do) keeps the label. The request is in
	// (Parked) only while its goroutine carries the label.
	pprof.Do(r.Context(), pprof.Labels(requestLabel, s.label(tag)), func(ctx context.Context) {
		s.enter(tag, 1)
		defer s.enter(tag, -1)
		s.handler.ServeHTTP(w, r.WithContext(ctx))
	})
}

// label is the label of the request tagged tag: tags are the harness's
// step and request numbers, and every check in the process has them, so
// the label names the handler's address too.
func (s *handlerServer) label(tag string) string { return s.ln.Addr().String() + " " + tag }

// count adds d to the requests in the handler, and says so.
func (s *handlerServer) count(d int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.working += d
	close(s.changed)
	s.changed = make(chan struct{})
}

// enter adds d to the requests tagged tag whose goroutine carries its
// label.
func (s *handlerServer) enter(tag string, d int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.in[tag] += d; s.in[tag] <= 0 {
		delete(s.in, tag)
	}
}

// Parked says, of each request tagged tags, what its goroutines are doing
// in the handler. A request is in while its goroutine carries its label;
// one in both before and after the look was in during it.
func (s *handlerServer) Parked(tags []string) []goroutines.State {
	labels := make([]string, len(tags))
	before := make([]bool, len(tags))
	s.mu.Lock()
	for i, t := range tags {
		labels[i], before[i] = s.label(t), s.in[t] > 0
	}
	s.mu.Unlock()
	states := goroutines.States(goroutines.Snapshot(), requestLabel, labels)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, t := range tags {
		switch {
		case !before[i] || s.in[t] == 0:
			states[i] = goroutines.Working // not in the handler throughout the look
		case states[i] == goroutines.None:
			// In the handler with no goroutine carrying its label: it
			// labelled them anew. What it does cannot be seen, as what a
			// sleeper waits for cannot: a quiet period decides.
			states[i] = goroutines.Asleep
		}
	}
	return states
}

// Working says how many requests are in the handler.
func (s *handlerServer) Working() (int, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.working, s.changed
}

func (s *handlerServer) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops serving, lets the requests in flight end (within a bound),
// closes the handler and removes its data directory.
func (s *handlerServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, s.srv.Close())
	}
	<-s.served
	return errors.Join(err, closeHandler(s.handler), os.RemoveAll(s.dir))
}

func closeHandler(h http.Handler) error {
	switch c := h.(type) {
	case io.Closer:
		return c.Close()
	case interface{ Close() }:
		c.Close()
	}
	return nil
}

// ClientTimeout is a safety net for a server that never answers: the turn's
// outcome is then unknown. It never decides a verdict on a server that
// answers, and the model's held calls are released by the server's own
// deadline or by an abort at a known point, never by this timer.
const ClientTimeout = 30 * time.Second

// DefaultRestartShare is the share of the steps drawn that may restart
// or crash the server where the profile says none (Profile.RestartShare):
// all of them, every restart drawn is carried out.
const DefaultRestartShare = 1.0

// RestartShareOrDefault is the share p declares, or DefaultRestartShare.
func (p Profile) RestartShareOrDefault() float64 {
	if p.RestartShare <= 0 {
		return DefaultRestartShare
	}
	return p.RestartShare
}

// DefaultModelTimeout is the model-call timeout a profile is taken to
// declare when it declares none; clientTimeout leaves a margin over it.
const DefaultModelTimeout = 20 * time.Second

// SourceRefs are the references to agent that the fake model at modelURL
// serves, one per query.
func SourceRefs(modelURL, agent string, queries []string) []string {
	base := strings.TrimSuffix(modelURL, "/v1")
	out := make([]string, len(queries))
	for i, q := range queries {
		out[i] = base + "/agents/" + agent + ".yaml?" + q
	}
	return out
}

// SourceRefs are the references to p's agent that the fake model at
// modelURL serves, one per query, naming p.AgentHost as their host if p
// names one.
func (p Profile) SourceRefs(modelURL string, queries []string) []string {
	if p.AgentHost != "" {
		if u, err := url.Parse(modelURL); err == nil {
			u.Host = net.JoinHostPort(p.AgentHost, u.Port())
			modelURL = u.String()
		}
	}
	return SourceRefs(modelURL, p.Agent, queries)
}

// ServerSpec says which server a report is about, so that a replay can
// start the same one: Kind "reference" is the in-repo reference server,
// with its mutant and concurrency policy; any other kind names a server
// only the caller knows how to start.
type ServerSpec struct {
	Kind         string `json:"kind"`
	Mutant       string `json:"mutant,omitempty"`
	Concurrency  string `json:"concurrency,omitempty"`
	Interruption string `json:"interruption,omitempty"`
	// Profile is the path of the profile, for kind "profile"; URL the
	// server's base URL, for kind "url" (a server started by someone else).
	Profile string `json:"profile,omitempty"`
	URL     string `json:"url,omitempty"`
	// Protocol is the client protocol the reference server was reached
	// through; "" for chat.
	Protocol string `json:"protocol,omitempty"`
	// Replicas, if above 1, is how many replicas of the reference server
	// served, in process over a PostgreSQL store of the test's.
	Replicas int `json:"replicas,omitempty"`
}

// String names the server for a person.
func (s ServerSpec) String() string {
	switch s.Kind {
	case "profile":
		return "the server of the profile " + s.Profile
	case "url":
		return "the server at " + s.URL
	case "reference":
		out := "the reference server"
		if s.Mutant != "" && s.Mutant != "none" {
			out += fmt.Sprintf(" with the mutant %s", s.Mutant)
		}
		if s.Replicas > 1 {
			out += fmt.Sprintf(", as %d replicas over PostgreSQL", s.Replicas)
		}
		return out
	}
	return "a " + s.Kind + " server"
}

// ServerReuser is a Target whose server may serve every check of a run,
// one after another, rather than a fresh server each: a server that is
// slow to start (seconds, for some gateways) would otherwise spend most
// of a run starting. Each check then gets a namespace of conversation ids
// of its own (every id the harness sends is prefixed with it), and the
// fake model forgets the previous check, so checks stay independent
// without a restart; a check or a replay still replays from its seed,
// against the same server state as far as its own conversations go.
type ServerReuser interface {
	Target
	// ReuseServer reports whether one server serves the whole run.
	ReuseServer() bool
}

// ModelAddresser is a Target whose servers must find the fake model at a
// fixed address: a server started by someone else, configured with a
// model URL before the harness runs.
type ModelAddresser interface {
	Target
	// ModelAddr is the loopback host:port the fake model listens on.
	ModelAddr() string
}

// ServerWatcher is a Server that can tell that it died on its own (a
// process that exited mid-run): that is then a crash finding
// (model.Crash) with the server's last output, rather than every later
// request reported as unanswered.
type ServerWatcher interface {
	Server
	// Exited returns an error describing the exit if the server has
	// exited on its own, nil while it runs.
	Exited() error
}

// Replicated is a Server that runs as several replicas over one store: a
// request goes to the replica its plan names (plan.Send.Replica), or,
// behind a front, to the front, which picks one.
type Replicated interface {
	Server
	// URLs are the replicas' base URLs, in order; behind a front, the
	// front's alone.
	URLs() []string
	// Replicas is how many replicas serve the server.
	Replicas() int
	// RestartReplica stops replica i gracefully, or kills it (crash), and
	// starts it again, while the others go on serving; ctx bounds the
	// wait for it to be ready.
	RestartReplica(ctx context.Context, i int, crash bool) error
}

// ErrHarness marks an error of the harness's own parts, not the server's
// (a proxy that could not listen again after a restart): a run stops on
// it, rather than judge the server by it.
var ErrHarness = errors.New("the harness failed")

// URLs are srv's base URLs: its replicas', or its own (or its front's).
func URLs(srv Server) []string {
	if r, ok := srv.(Replicated); ok {
		return r.URLs()
	}
	return []string{srv.URL()}
}

// Replicas is how many replicas serve srv: 1 unless it is Replicated.
func Replicas(srv Server) int {
	if r, ok := srv.(Replicated); ok {
		return r.Replicas()
	}
	return 1
}

// Fronted reports whether srv's replicas are behind a front: the client
// sends every request to one URL, and which replica serves it is the
// front's choice, not the plan's.
func Fronted(srv Server) bool { return Replicas(srv) > len(URLs(srv)) }

// ContextStarter is a Target whose servers' starts and restarts a context
// can cut short: a server that takes a minute to start does not hold a
// run past its time bound.
type ContextStarter interface {
	StartContext(ctx context.Context, modelURL string) (Server, error)
}

// ContextRestarter is a Restarter whose restart a context can cut short.
type ContextRestarter interface {
	RestartContext(ctx context.Context, crash bool, agents []string) error
}

// Outputter is a Server that keeps what it wrote (a process's stdout and
// stderr): shown with a failure, an error, or a run that exercised
// nothing, it often says why.
type Outputter interface {
	Output() string
}
