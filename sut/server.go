// Package sut is turncheck's reference session server: an OpenAI-compatible
// chat endpoint that keeps conversations server-side, as PROTOCOL.md
// specifies, and, over the same store and the same turns, the other client
// protocols of such servers: the Responses API, a sessions API, the Agent
// Client Protocol over stdio and the Agent2Agent protocol. It runs every
// turn on a working copy of the conversation and commits only a turn that
// ended ok, durably, in SQLite or PostgreSQL (Config.Store) under a
// bounded cache. It also carries the catalogue of mutants: switches that
// bring back the real bugs the harness exists to catch.
//
// The server is built along the way a turn travels, a package each, none
// importing one above it: internal/config (settings, policies, mutants),
// internal/admission (one gate every protocol's requests pass: slots,
// memory budget, gauge, refusals), internal/store (conversations, their
// cache, locks and store), internal/turn (the turn as a value: converse,
// the tool loop, the model client, interruption, titles, compaction), one
// adapter per protocol (internal/chat, responses, sessions, acp, a2a), and
// this package, which wires them and routes HTTP to the adapters.
//
// A turn is a tool loop: the server offers the model two built-in tools,
// echo and lookup, runs the calls the model asks for and calls it again
// with their results, for at most MaxToolRounds rounds. The turn commits
// its user message, every tool round and the final reply together, or
// nothing.
//
// What a client that disconnects mid-turn leaves is the server's
// interruption policy. Under Rollback and KeepConsistent the turn stops at
// once: no model call and no tool run starts for it afterwards. Rollback
// leaves nothing; KeepConsistent keeps the user message and the tool
// rounds that completed, each call with all its results, and never a
// round cut short or a reply. Under Complete the turn runs on to its end,
// detached from the client, and commits whole or not at all, as if the
// client had stayed.
//
// Long conversations are compacted: past CompactAfter messages, the tool
// rounds of earlier turns are hidden from the model, kept in the store,
// and the marks are part of the turn that set them.
package sut

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/sut/internal/a2a"
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/chat"
	"github.com/turncheck/turncheck/sut/internal/config"
	"github.com/turncheck/turncheck/sut/internal/responses"
	"github.com/turncheck/turncheck/sut/internal/sessions"
	"github.com/turncheck/turncheck/sut/internal/store"
	"github.com/turncheck/turncheck/sut/internal/turn"
)

// Server is the reference session server. It is an http.Handler.
type Server struct {
	// engine runs the turns every adapter hands it.
	engine *turn.Engine
	// The adapters of the HTTP protocols, each over engine.
	chat      *chat.Handler
	responses *responses.Handler
	sessions  *sessions.Handler
	a2a       *a2a.Handler
	// allowedHosts are cfg.AllowedHosts, normalized.
	allowedHosts []string

	stopped  chan struct{} // closed once Close (or a crash) has finished
	closeErr error
}

// New opens the store (cfg.Store, or cfg.DataDir) and returns a server
// ready to serve.
func New(cfg config.Config) (*Server, error) {
	modelURL, err := turn.ParseModelURL(cfg.ModelURL)
	if err != nil {
		return nil, err
	}
	if cfg.Store != "" && !store.IsPostgresURL(cfg.Store) {
		return nil, errors.New("store: want a postgres:// or postgresql:// URL, or none for SQLite in the data dir")
	}
	if cfg.Store == "" && cfg.DataDir == "" {
		return nil, errors.New("a data dir is required")
	}
	if cfg.ConversationsMax == 0 {
		cfg.ConversationsMax = config.DefaultConversationsMax
	}
	if cfg.ConversationsMax < 0 {
		return nil, fmt.Errorf("conversations max %d: want a positive number", cfg.ConversationsMax)
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = config.DefaultRequestTimeout
	}
	if cfg.RequestTimeout < 0 {
		return nil, fmt.Errorf("request timeout %s: want a positive duration", cfg.RequestTimeout)
	}
	if cfg.Deadlines == nil {
		cfg.Deadlines = config.ClockDeadlines{}
	}
	if cfg.ConversationHeader == "" {
		cfg.ConversationHeader = config.DefaultConversationHeader
	}
	if err := setLimits(&cfg); err != nil {
		return nil, err
	}
	allowedHosts, err := admission.ParseAllowedHosts(cfg.AllowedHosts)
	if err != nil {
		return nil, err
	}
	if cfg.ModelName == "" {
		cfg.ModelName = config.DefaultModelName
	}
	for _, k := range cfg.Keys {
		if k == "" {
			return nil, errors.New("an API key may not be empty")
		}
	}
	if _, err := config.ParseMutant(string(cfg.Mutant)); err != nil {
		return nil, err
	}
	concurrency, err := config.ParseConcurrency(string(cfg.Concurrency))
	if err != nil {
		return nil, err
	}
	cfg.Concurrency = concurrency
	interruption, err := config.ParseInterruption(string(cfg.Interruption))
	if err != nil {
		return nil, err
	}
	cfg.Interruption = interruption
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Before the store: a server whose agents do not load leaves its data
	// dir untouched.
	srcs, err := turn.LoadSources(context.Background(), cfg.Agents)
	if err != nil {
		return nil, err
	}
	st, err := openConfiguredStore(&cfg)
	if err != nil {
		return nil, err
	}
	sayConnRoom(st, cfg.MaxStoreConns, log)
	mem := &admission.Budget{Max: cfg.MaxMemory}
	convs, err := store.NewConversations(st, cfg.ConversationsMax, mem, cfg.Mutant, log)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	scopes := make([]string, len(cfg.Keys))
	legacy := map[string]string{}
	for i, k := range cfg.Keys {
		scopes[i] = store.KeyScope(st.Secret, k)
		legacy[store.LegacyScope(k)] = scopes[i]
	}
	if err := st.Rescope(legacy); err != nil {
		_ = st.Close()
		return nil, err
	}
	e := turn.NewEngine(cfg, turn.Parts{Sources: srcs, Store: st, Convs: convs, Mem: mem, ModelURL: modelURL, Log: log, Scopes: scopes})
	s := &Server{
		engine:       e,
		chat:         &chat.Handler{Engine: e},
		responses:    &responses.Handler{Engine: e},
		sessions:     &sessions.Handler{Engine: e},
		a2a:          &a2a.Handler{Engine: e},
		stopped:      make(chan struct{}),
		allowedHosts: allowedHosts,
	}
	return s, nil
}

// sayConnRoom says at start, for a store in PostgreSQL, how many replicas
// of this one the connections PostgreSQL lets its role open make room
// for, each opening its --max-store-conns and one more, its connection of
// life (store.Leases), and warns where not even this one's fit: its
// turns would then wait for connections the database refuses, and the
// replicas beside it starve.
func sayConnRoom(st *store.Store, maxConns int, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	room, ok := st.ConnRoom(ctx)
	switch {
	case !ok:
	case room < maxConns+1:
		log.Warn("PostgreSQL lets this server's role open fewer connections than --max-store-conns and its connection of life: "+
			"its turns will wait for connections the database refuses, and replicas beside it starve; lower --max-store-conns, or raise max_connections",
			"max_store_conns", maxConns, "postgresql_room", room)
	default:
		log.Info("PostgreSQL's connections for this server's role", "postgresql_room", room, "max_store_conns", maxConns,
			"replicas_that_fit", room/(maxConns+1))
	}
}

// openConfiguredStore opens the store cfg names: PostgreSQL at Store, or SQLite in
// DataDir.
func openConfiguredStore(cfg *config.Config) (*store.Store, error) {
	if cfg.Store != "" {
		st, err := store.OpenPostgres(cfg.Store, cfg.MaxStoreConns)
		if err == nil {
			st.CommitWithin = cfg.RequestTimeout
		}
		return st, err
	}
	return store.OpenStore(cfg.DataDir)
}

// setLimits fills in the defaults of the limits and timeouts left zero,
// and refuses negative ones.
func setLimits(cfg *config.Config) error {
	for _, err := range []error{
		orDefault("body timeout", &cfg.BodyTimeout, config.DefaultBodyTimeout),
		orDefault("header timeout", &cfg.HeaderTimeout, config.DefaultHeaderTimeout),
		orDefault("idle timeout", &cfg.IdleTimeout, config.DefaultIdleTimeout),
		orDefault("max body bytes", &cfg.MaxBodyBytes, config.DefaultMaxBodyBytes),
		orDefault("max history bytes", &cfg.MaxHistoryBytes, config.DefaultMaxHistoryBytes),
		orDefault("max conns", &cfg.MaxConns, config.DefaultMaxConns),
		orDefault("max requests", &cfg.MaxRequests, config.DefaultMaxRequests),
		orDefault("max store conns", &cfg.MaxStoreConns, store.DefaultMaxStoreConns(max(cfg.MaxRequests, 1))),
		orDefault("max history messages", &cfg.MaxHistoryMessages, config.DefaultMaxHistoryMessages),
		orDefault("compact after", &cfg.CompactAfter, config.DefaultCompactAfter),
	} {
		if err != nil {
			return err // the first, on one line
		}
	}
	switch least := admission.MinMaxMemory(cfg.MaxBodyBytes, cfg.MaxHistoryBytes, turn.MaxReplyBytes); {
	case cfg.MaxMemory < 0:
		return fmt.Errorf("max memory %d: want a positive number of bytes", cfg.MaxMemory)
	case cfg.MaxMemory == 0:
		def, _ := admission.DefaultMaxMemory()
		cfg.MaxMemory = max(def, least)
	case cfg.MaxMemory < least:
		return fmt.Errorf("max memory %d bytes: want at least %d, what one turn at the limits costs (a %d-byte body, a %d-byte history, a %d-byte reply)",
			cfg.MaxMemory, least, cfg.MaxBodyBytes, cfg.MaxHistoryBytes, turn.MaxReplyBytes)
	}
	return nil
}

// orDefault sets *v to def if it is zero, and refuses a negative *v.
func orDefault[T int | int64 | time.Duration](name string, v *T, def T) error {
	switch {
	case *v < 0:
		what := "number"
		if _, ok := any(*v).(time.Duration); ok {
			what = "duration"
		}
		return fmt.Errorf("%s %v: want a positive %s", name, *v, what)
	case *v == 0:
		*v = def
	}
	return nil
}

// Close refuses new requests (503), waits for those in flight to end (the
// turns that complete after their client left among them),
// writes whatever is not durable yet (only the ack-before-durable mutant
// has any), then closes the store. Stop the HTTP server in front of it
// first. After a crash (Running.Crash) it does nothing.
func (s *Server) Close() error {
	if s.engine.Gate.Close() {
		<-s.stopped // a later Close returns when the first one has
		return s.closeErr
	}
	s.engine.Gate.Wait()
	s.engine.Gate.Refusals.Flush()
	s.engine.Convs.Close()
	s.engine.Up.Close()
	s.engine.Kill()
	s.engine.EndTurns()
	s.closeErr = s.engine.Store.Close()
	close(s.stopped)
	return s.closeErr
}

// Crash is the server's part of Running.Crash: refuse new requests, drop
// what is not durable yet without writing it, end every request in flight
// (their model calls with them) and wait for them, then close the store. It
// reports false, and does nothing, if the server was closed already. A
// later Close returns nil.
func (s *Server) crash() (bool, error) {
	s.engine.Crashing.Store(true)
	if s.engine.Gate.Close() {
		return false, nil
	}
	// First, as the process dies: a turn acknowledged but not yet written
	// is gone, and none queued from now on is ever written.
	s.engine.Convs.Crash()
	s.engine.Kill()
	s.engine.Gate.Wait()
	s.engine.Gate.Refusals.Flush()
	s.engine.Up.Close()
	err := s.engine.Store.Close()
	close(s.stopped)
	return true, err
}

// ServeHTTP serves the client protocols (POST /v1/chat/completions,
// POST /v1/responses, the sessions API under /api/sessions) and GET
// /healthz.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer s.engine.Gate.Handle()()
	conn := admission.ConnOf(r.Context())
	conn.Enter()
	defer conn.Leave()
	conn.WatchBody(r)
	// The client has BodyTimeout to send its body. The deadline is set for
	// every request, so that a request refused before its body is read
	// does not hold its connection past it either (net/http reads what is
	// left of a body after the handler); readBody lifts it.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.engine.Cfg.BodyTimeout))
	if len(r.TransferEncoding) > 0 {
		// A chunked body is served, but its connection is not reused:
		// net/http takes Transfer-Encoding over a Content-Length sent
		// beside it and drops the Content-Length before a handler sees
		// it, so a request framed both ways cannot be told apart, and a
		// front that framed it by its length would have sent the rest
		// as a request of its own (request smuggling). RFC 9112 6.1: the
		// connection is closed after the answer.
		w.Header().Set("Connection", "close")
	}
	ticket, ctx, refusal := s.engine.Gate.Enter(r.Context(), r.Header.Get(admission.RequestTagHeader))
	defer ticket.Leave()
	if refusal != nil {
		refusal.Write(w)
		return
	}
	if err := admission.CheckHost(r, s.allowedHosts); err != nil {
		admission.Refuse(http.StatusMisdirectedRequest, "misdirected_request", err.Error()).Early().Write(w)
		return
	}
	if err := admission.CheckOrigin(r, s.allowedHosts); err != nil {
		admission.Refuse(http.StatusForbidden, "forbidden", err.Error()).Early().Write(w)
		return
	}
	s.route(w, r.WithContext(ctx))
}

// route serves r by its path: each client protocol's endpoints take POST
// alone.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == "/healthz":
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
		return
	case p == a2a.CardPath && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		s.a2a.Card(w, r)
		return
	}
	var serve http.HandlerFunc
	switch {
	case p == "/v1/chat/completions" || p == "/chat/completions":
		serve = s.chat.Chat
	case p == "/v1/responses" || p == "/responses":
		serve = s.responses.Responses
	case p == sessions.Path:
		serve = s.sessions.CreateSession
	case p == a2a.Path:
		serve = s.a2a.RPC
	default:
		session, agent, ok := sessions.TurnPath(r.URL)
		if !ok {
			openai.WriteError(w, http.StatusNotFound, "not_found",
				"no such endpoint; use POST /v1/chat/completions, POST /v1/responses, POST "+sessions.Path+", POST "+sessions.Path+"/{session}/agent/{agent} or POST "+a2a.Path+" (A2A, its card at GET "+a2a.CardPath+")")
			return
		}
		serve = func(w http.ResponseWriter, r *http.Request) {
			s.sessions.SessionTurn(w, r, session, agent)
		}
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		openai.WriteError(w, http.StatusMethodNotAllowed, "invalid_request_error", "use POST")
		return
	}
	serve(w, r)
}

// MaxMemory is the server's memory budget in bytes: Config.MaxMemory, or
// the default it was given for 0.
func (s *Server) MaxMemory() int64 { return s.engine.Gate.MaxMemory() }
