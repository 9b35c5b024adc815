// Package reference is the Target for turncheck's own reference server
// (package sut), run in process on loopback: the one part of the harness
// that imports the server, and SQLite with it, so that a Go server's test
// that imports package scenarios compiles neither.
//
// The reference server is the harness's most exact target: its model-call
// deadlines pass only when the harness expires them, and it reports its
// activity, so that a burst's interleaving replays from its seed.
package reference

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// Target is the reference server, optionally with a mutant switched on.
// Each Start serves a fresh one on a fresh data dir.
type Target struct {
	// Mutant brings back one real bug; sut.Clean for the correct server.
	Mutant sut.Mutant
	// ConversationsMax is the server's cache size; 0 means 4, small enough
	// that checks evict and reload conversations from the store.
	ConversationsMax int
	// Concurrency is the server's policy for concurrent requests on one
	// conversation; "" means sut.Serialize.
	Concurrency sut.Concurrency
	// Interruption is the server's policy for a turn whose client
	// disconnects; "" means rollback.
	Interruption sut.Interruption
	// Protocol is the client protocol the harness reaches it through; ""
	// means chat. The server serves all of them: ACP as an agent in
	// process, over pipes that stand for its stdin and stdout.
	Protocol targets.Protocol
	// Replicas, if above 1, serves the server as that many replicas over
	// one PostgreSQL store (targets.Replicated), each request sent to the
	// replica its plan names.
	Replicas int
	// Store gives each start of a replicated server a fresh, empty
	// PostgreSQL store, as a URL (in a test, internal/pgtest's Schema).
	Store func() (string, error)
	// ModelTimeout, if not 0, is the server's own bound on a model call
	// (sut.Config.RequestTimeout), declared as the profile's model
	// timeout: a server that gives a held call up by itself, sooner than
	// the harness would let go of it.
	ModelTimeout time.Duration
	// Stall, if not 0, makes the server as slow as a busy machine would
	// (sut.Config.Stall): a random pause of up to it before each model
	// call, commit and write, and before a turn sees its client gone.
	Stall time.Duration
	// StartDelay makes each start and restart of the server wait that
	// long first (sut.Config.StartDelay): a server slow to start.
	StartDelay time.Duration
	// RestartShare is the share of the steps drawn that may restart or
	// crash it, as a profile declares it (targets.Profile.RestartShare):
	// below 1, a server slow to restart.
	RestartShare float64
	// Titles makes the server call the model for a title beside each turn
	// (sut.Config.Titles): an auxiliary call.
	Titles bool
	// Line runs its Responses API as openclaw does (sut.Config.
	// ResponsesLine), and its profile declares so (LineResponsesAPI).
	Line bool
}

// SessionsAPI is the reference server's session API, shaped as
// docker-agent's serve api: POST /api/sessions creates a session, and POST
// /api/sessions/{session}/agent/{source} runs a turn in it, naming the
// agent by the source key the session was created under, with the
// messages as a JSON array, answering with an event stream.
func SessionsAPI() *targets.SessionsAPI {
	return &targets.SessionsAPI{
		Create: targets.Call{Method: "POST", Path: "/api/sessions", Body: "{}"},
		ID:     "id",
		Turn:   targets.Call{Method: "POST", Path: "/api/sessions/{session}/agent/{source}", Body: "{messages}"},
		Events: targets.EventRules{TypeField: "type", Text: "agent_choice", TextField: "content",
			Done: []string{"stream_stopped"}, Failure: []string{"error"}, ErrorField: "error"},
		// The reference server takes the last message as the new one, as
		// under chat, and refuses a turn without one.
		Input: targets.InputLast,
	}
}

// ResponsesAPI is what the reference server declares of its Responses
// API: OpenAI's semantics (a chain is a tree, an id it does not hold is
// not found, store: false honoured, ids kept across restarts), and a
// conversation may also be named by the conversation parameter.
func ResponsesAPI() *targets.ResponsesAPI {
	return &targets.ResponsesAPI{Chain: targets.ChainTree, NamedBy: targets.NamedByConv, UnknownPrevious: targets.UnknownNotFound,
		StoreFalse: targets.StoreHonoured}
}

// LineResponsesAPI is what the reference server declares of its Responses
// API when it runs it as openclaw does (Target.Line): a chain is the line
// of the response named, a conversation may be named by the user field,
// an id it does not hold starts a new one, and store: false is ignored.
// It declares, as openclaw does, that response ids do not survive a
// restart: its own do, which the declaration lets it do (the client only
// goes on with the conversations named by user after one).
func LineResponsesAPI() *targets.ResponsesAPI {
	survive := false
	return &targets.ResponsesAPI{Chain: targets.ChainLine, NamedBy: targets.NamedByUser, UnknownPrevious: targets.UnknownNew,
		StoreFalse: targets.StoreIgnored, IDsSurvive: &survive}
}

// CompactAfter is the reference server's compaction threshold
// (sut.Config.CompactAfter) in checks: low enough that a turn with a few
// tool rounds passes it, so that compaction marks are made, committed and
// rolled back (T11).
const CompactAfter = 8

// WithMutant is the reference server with mutant m switched on (none for
// sut.Clean), declaring the interruption policy of the server its bug
// comes from (sut.MutantInfo), rollback if it names none, and reached
// through the protocol the bug lives in.
//
// a2a-cancel-ignored's server gives up a model call after 1 s of its
// own, shorter than the harness holds a dropped turn's: only the agent's
// own word that it cancelled the task lets the harness answer the held
// call at once. Every run of it waits that timeout and a second more
// (the harness's stop bound), its shrink's replays too: the default
// model timeout (20 s) would make each run of it last half a minute.
func WithMutant(m sut.Mutant) Target {
	r := Target{Mutant: m, Interruption: sut.Rollback}
	if m == sut.A2ACancelIgnored {
		r.ModelTimeout = time.Second
	}
	for _, info := range sut.Mutants() {
		if info.Mutant != m {
			continue
		}
		if info.Interruption != "" {
			r.Interruption = info.Interruption
		}
		r.Protocol = targets.Protocol(info.Protocol)
	}
	return r
}

// keys are the API keys the reference server accepts: two, so that the
// harness checks that conversations are scoped per key (T5).
var keys = []string{"key-a", "key-b"}

// agent is the agent the reference server loads from the fake model.
const agent = "helper"

// Profile is the reference server's profile: two API keys, the policies
// it runs with, durable storage, the tools, and one agent.
func (r Target) Profile() targets.Profile {
	p := targets.Profile{Keys: keys, Model: agent, Agent: agent, Tools: true,
		Durability: targets.Durability{Restart: true, Crash: true}, Interruption: targets.Rollback, RestartShare: r.RestartShare,
		ModelTimeout: r.ModelTimeout}
	switch r.Concurrency {
	case sut.Reject:
		p.Concurrency = model.Reject
	case sut.Supersede:
		p.Supersede = true
	}
	if r.Interruption != "" {
		p.Interruption = targets.Interruption(r.Interruption)
	}
	p.Protocol = cmp.Or(r.Protocol, targets.Chat)
	switch p.Protocol {
	case targets.Responses:
		p.ResponsesAPI = ResponsesAPI()
		if r.Line {
			p.ResponsesAPI = LineResponsesAPI()
		}
	case targets.Sessions:
		p.SessionsAPI = SessionsAPI()
	case targets.ACP:
		// One client over stdio, with no keys; it advertises reads, as
		// profiles/reference-acp.yaml does (the agent calls nothing back).
		p.Keys = nil
		p.ACPCaps = targets.ACPCapabilities{ReadTextFile: true}
	case targets.A2A:
		p.A2AAPI = A2AAPI()
	}
	return p
}

// A2AAPI is what the reference server declares as an A2A agent, as
// profiles/reference-a2a.yaml does: it names each context, and a client
// that drops a task's connection interrupts the task, as tasks/cancel
// does.
func A2AAPI() *targets.A2AAPI {
	return &targets.A2AAPI{ContextIDs: targets.ContextsServer, DroppedStream: targets.DroppedCancels}
}

// Start serves a reference server, calling the model at modelURL.
func (r Target) Start(modelURL string) (targets.Server, error) {
	if r.ConversationsMax == 0 {
		r.ConversationsMax = 4
	}
	cfg := sut.Config{
		ModelURL:         modelURL,
		ConversationsMax: r.ConversationsMax,
		Keys:             keys,
		Mutant:           r.Mutant,
		Concurrency:      r.Concurrency,
		Interruption:     r.Interruption,
		CompactAfter:     CompactAfter,
		Agents:           targets.AgentRefs(modelURL, agent),
		Stall:            r.Stall,
		StartDelay:       r.StartDelay,
		Titles:           r.Titles,
		ResponsesLine:    r.Line,
		RequestTimeout:   r.ModelTimeout,
	}
	if r.Protocol == targets.ACP {
		// An ACP agent serves one client, its parent: no keys.
		cfg.Keys = nil
		return startACP(cfg, r.Profile().ACPCaps)
	}
	if r.Replicas <= 1 {
		return sut.StartInstance(cfg)
	}
	if r.Store == nil {
		return nil, errors.New("the reference server as replicas needs a PostgreSQL store (Target.Store)")
	}
	store, err := r.Store()
	if err != nil {
		return nil, fmt.Errorf("a store for the replicas: %w", err)
	}
	cfg.Store = store
	return sut.StartReplicas(cfg, r.Replicas)
}

// Spec names the server in a saved report, so that 'turncheck replay'
// starts the same one.
func (r Target) Spec() targets.ServerSpec {
	c := r.Concurrency
	if c == "" {
		c = sut.Serialize
	}
	return targets.ServerSpec{Kind: "reference", Mutant: string(r.Mutant), Concurrency: string(c),
		Interruption: string(r.Interruption), Protocol: string(r.Protocol), Replicas: r.Replicas}
}
