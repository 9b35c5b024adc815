// Package config holds what every layer of the server reads: its Config,
// the mutants, the concurrency and interruption policies, the client
// protocols and the deadlines. It imports nothing of the server, so that
// every package may.
package config

import (
	"log/slog"
	"time"

	"github.com/turncheck/turncheck/sut/internal/admission"
)

// Defaults for the zero values of Config.
const (
	DefaultConversationHeader = "X-Conversation-Id"
	DefaultConversationsMax   = 1000
	DefaultRequestTimeout     = 60 * time.Second
	DefaultMaxBodyBytes       = 1 << 20
	DefaultModelName          = "turncheck-reference"
	// DefaultHeaderTimeout bounds reading a request's headers.
	DefaultHeaderTimeout = 10 * time.Second
	// DefaultBodyTimeout bounds reading a request's body: a 1 MiB body
	// at 64 KiB/s.
	DefaultBodyTimeout = 15 * time.Second
	// DefaultIdleTimeout is how long a keep-alive connection may wait for
	// its next request.
	DefaultIdleTimeout = 60 * time.Second
	// DefaultMaxConns bounds open client connections. Go raises the soft
	// limit on file descriptors to the hard one at start (commonly 2^20,
	// at least 4096 on most systems), so the cap is reached long before
	// the server runs out of descriptors for its store and its model.
	DefaultMaxConns = 1024
	// DefaultMaxRequests bounds the turns worked on at once; each may
	// hold a model connection and a reply of up to 4 MiB.
	DefaultMaxRequests = 512
	// DefaultMaxHistoryMessages bounds a conversation's messages.
	DefaultMaxHistoryMessages = 2000
	// DefaultMaxHistoryBytes bounds a conversation's text: about what a
	// model with a large context takes (a token is about 4 bytes).
	DefaultMaxHistoryBytes = 4 << 20
	// StreamWriteTimeout bounds one write to a client: a chunk of a
	// stream, or a whole reply. A client that does not read for that long
	// is taken for gone, and its turn rolls back.
	StreamWriteTimeout = 30 * time.Second
)

// DefaultCompactAfter is the default of Config.CompactAfter.
const DefaultCompactAfter = 64

// Config configures a Server.
type Config struct {
	// ModelURL is the model provider's OpenAI-compatible base URL; the
	// server calls {ModelURL}/chat/completions. Required.
	ModelURL string
	// DataDir holds the durable store, a SQLite database. Required when
	// Store is "".
	DataDir string
	// Store, if not "", is the URL of a PostgreSQL database
	// (postgres://user:password@host:port/db?sslmode=..., or
	// postgresql://) that holds the durable store in place of DataDir.
	// Servers on one database are replicas of one server: a turn
	// committed on one is seen by every other's next turn, turns on one
	// conversation run one after another across all of them (a lease
	// in the store, waited for under Serialize for at most
	// RequestTimeout, tried under Reject), and a commit is durable when
	// acknowledged.
	Store string
	// ConversationsMax bounds the in-memory conversation cache.
	ConversationsMax int
	// RequestTimeout bounds each model call of a turn; past it the turn
	// fails (504). It bounds each lookup too; past it the lookup's result
	// is an error and the turn goes on. Under Serialize it also bounds the
	// wait for a conversation's turn; past it the request gives up (503
	// conversation_busy).
	RequestTimeout time.Duration
	// Deadlines starts each model call's and each lookup's deadline; nil
	// uses the clock.
	Deadlines Deadlines
	// ConversationHeader names the header carrying the conversation id.
	ConversationHeader string
	// Keys, if any, are the bearer keys the server accepts; conversations
	// are scoped per key.
	Keys []string
	// MaxBodyBytes bounds a request body (413 past it, at once when the
	// request declares a longer Content-Length).
	MaxBodyBytes int64
	// BodyTimeout bounds reading a request's body, from the end of its
	// headers; past it the request gets 408 and its connection closes.
	BodyTimeout time.Duration
	// HeaderTimeout bounds reading a request's headers; past it the
	// connection closes. Start and Serve only.
	HeaderTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait for its
	// next request. Start and Serve only.
	IdleTimeout time.Duration
	// MaxConns bounds the client connections open at once; past it a new
	// one takes the place of a stalled one, else of the oldest newcomer
	// with no request head yet, or gets 503 with Retry-After if every one
	// has a request in (conns.go). Start and Serve only.
	MaxConns int
	// MaxRequests bounds the turn requests worked on at once, counted
	// from the end of their body (running, or waiting for their
	// conversation); past it 503 with Retry-After. It also sizes the pool
	// of idle connections to the model.
	MaxRequests int
	// MaxStoreConns bounds the connections to PostgreSQL (Store) that the
	// server opens; 0 means DefaultMaxStoreConns(MaxRequests), and it
	// must be at least 2. A turn on a conversation holds one only while
	// it is in the store (its lease and load, its commit), never at its
	// model; turns may hold all but one, the last is for what runs beside
	// them. One more, the server's connection of life, says it is alive
	// (store.Leases).
	// A turn that finds none free waits its turn for one, first come first
	// served, within RequestTimeout, and is otherwise refused before any
	// model call (503 with Retry-After); so is one the database refuses a
	// connection for want of room (too many clients) until then. Replicas
	// on one database must fit in its max_connections together. Unused
	// with SQLite (DataDir), which has one connection.
	MaxStoreConns int
	// MaxHistoryMessages bounds a conversation's messages: a turn that
	// would take it past them, its reply included, is refused with 400
	// and nothing changes (limits.go).
	MaxHistoryMessages int
	// MaxHistoryBytes bounds the text of a conversation's messages: a
	// turn whose new message would take it past them is refused with 400
	// and nothing changes (limits.go).
	MaxHistoryBytes int64
	// MaxMemory is the server's memory budget, in bytes (memory.go): the
	// conversation cache, the request bodies being read and the turns in
	// flight (each model call's history and the reply it streams) reserve
	// what they cost from it before they allocate it. The cache drops its
	// least recently used conversations to stay inside it and to make
	// room for requests (they are loaded again from the store); a request
	// that still finds no room gets 503 with Retry-After, and a turn whose
	// reply outgrows it fails (503, or an error chunk on a stream that
	// began), nothing committed. 0 means DefaultMaxMemory().
	MaxMemory int64
	// AllowedHosts are host names (or addresses), besides loopback and the
	// address a request came in on, that requests may name in their Host,
	// and pages in their Origin (guard.go).
	AllowedHosts []string
	// ModelName is the model name sent to the provider.
	ModelName string
	// Concurrency is what the server does with a request for a
	// conversation whose turn is already running; "" means Serialize.
	Concurrency Concurrency
	// Interruption is what a turn leaves when its client disconnects
	// while it runs; "" means Rollback. Under Rollback and KeepConsistent
	// the turn stops at once (its model call or tool run is cancelled, and
	// none starts after). Under Rollback nothing of the turn is committed.
	// Under KeepConsistent, if at least one tool round completed (its
	// assistant tool call message and all its results are in), the user
	// message and the completed rounds are committed, durably and under
	// the conversation's lock, though the client is gone: a T9-consistent
	// prefix, never a round cut short and never a reply; with no round
	// completed nothing is. Under Complete the turn runs to its end
	// (interruption.go) and commits whole if it ends ok, nothing if it
	// fails; the conversation's lock stays held, and the request counts
	// as working (Gauge), until it ends. A crash is no interruption: it
	// commits nothing.
	Interruption Interruption
	// CompactAfter is how many messages (the system prompt not counted) a
	// stateful turn may show the model before compaction hides the tool
	// rounds of earlier turns from it (compaction.go). 0 means
	// DefaultCompactAfter.
	CompactAfter int
	// Gauge, if set, counts the requests the server is working on and
	// those waiting for their conversation's turn; nil counts nothing.
	Gauge *admission.Gauge
	// Agents are references to the agent definitions to load at start-up:
	// http(s) URLs, fetched by New (within 5 s, at most 64 KiB), or file
	// paths. A definition is one YAML document with a non-blank "name" and
	// "instruction" and no other field. A new conversation binds to an
	// agent by the request's "model" and records its source key (the
	// reference as given); a resumed one runs with the agent it recorded,
	// or the one loaded source that shares its stable key (PROTOCOL.md,
	// T8). A bound turn sends the model the agent's instruction as its
	// system message. Stateless requests, and conversations started with no
	// agents loaded, are bound to none. Empty: no agents, no binding.
	Agents []string
	// Mutant brings back one real bug; Clean for the correct server.
	Mutant Mutant
	// Logger receives a line per turn that failed or was rolled back, and
	// per store error; nil discards.
	Logger *slog.Logger
	// TurnDelay, if not 0, is waited before each authorized turn request
	// (of any client protocol) is worked on: a deliberately slow server, to measure what checking
	// one costs. It changes no behaviour but time.
	TurnDelay time.Duration
	// StartDelay, if not 0, is waited before an Instance listens, at each
	// start and restart: a server slow to start, as those that load a
	// runtime or a model catalogue are. It changes no behaviour but time.
	StartDelay time.Duration
	// Stall, if not 0, pauses for a random 0..Stall before each model
	// call, before each commit and before each write to a client (a chunk
	// of a stream, or a whole answer): a machine made slow, to show that
	// no verdict of a check depends on its speed (stall.go). It changes no
	// behaviour but time.
	Stall time.Duration
	// Titles makes a title model call beside each turn, as real servers
	// do to name a conversation (title.go): an auxiliary call, which a
	// correct server may make and which the contract never judges as the
	// turn's history (PROTOCOL.md, "Auxiliary model calls").
	Titles bool
	// ResponsesLine runs the Responses API as openclaw documents its own:
	// previous_response_id names the conversation line the response
	// belongs to, and a turn chained from any response of it runs on the
	// line as it stands (its lock, its concurrency policy), as a
	// conversation does; a request that names no response runs on the
	// line of its user field, if any; an id it does not know starts a
	// new line (200), and store: false is ignored. Response ids name
	// nothing after a restart (openclaw keeps them in memory); lines
	// named by user outlive it.
	ResponsesLine bool
}
