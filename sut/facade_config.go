package sut

import (
	"github.com/turncheck/turncheck/sut/internal/config"
)

// Concurrency is what the server does with a request for a conversation
// whose turn is already running.
type Concurrency = config.Concurrency

// The concurrency policies PROTOCOL.md allows a server to declare (T4).
const (
	// Serialize makes the request wait its turn, first come first served,
	// for at most RequestTimeout (then 503 conversation_busy).
	Serialize = config.Serialize
	// Reject answers the request 409 conflict at once, before any model
	// call; nothing changes.
	Reject = config.Reject
	// Supersede, for an ACP prompt, cancels the session's running prompt
	// (answered stopReason cancelled, its turn ended as one whose client
	// sent session/cancel: the interruption policy decides what stays),
	// then runs the new one once it is done, as docker-agent's and
	// openclaw's agents do. Other protocols serialize.
	Supersede = config.Supersede
)

// Defaults for the zero values of Config.
const (
	DefaultConversationHeader = config.DefaultConversationHeader
	DefaultConversationsMax   = config.DefaultConversationsMax
	DefaultRequestTimeout     = config.DefaultRequestTimeout
	DefaultMaxBodyBytes       = config.DefaultMaxBodyBytes
	DefaultModelName          = config.DefaultModelName
	// DefaultHeaderTimeout bounds reading a request's headers.
	DefaultHeaderTimeout = config.DefaultHeaderTimeout
	// DefaultBodyTimeout bounds reading a request's body: a 1 MiB body
	// at 64 KiB/s.
	DefaultBodyTimeout = config.DefaultBodyTimeout
	// DefaultIdleTimeout is how long a keep-alive connection may wait for
	// its next request.
	DefaultIdleTimeout = config.DefaultIdleTimeout
	// DefaultMaxConns bounds open client connections. Go raises the soft
	// limit on file descriptors to the hard one at start (commonly 2^20,
	// at least 4096 on most systems), so the cap is reached long before
	// the server runs out of descriptors for its store and its model.
	DefaultMaxConns = config.DefaultMaxConns
	// DefaultMaxRequests bounds the turns worked on at once; each may
	// hold a model connection and a reply of up to 4 MiB.
	DefaultMaxRequests = config.DefaultMaxRequests
	// DefaultMaxHistoryMessages bounds a conversation's messages.
	DefaultMaxHistoryMessages = config.DefaultMaxHistoryMessages
	// DefaultMaxHistoryBytes bounds a conversation's text: about what a
	// model with a large context takes (a token is about 4 bytes).
	DefaultMaxHistoryBytes = config.DefaultMaxHistoryBytes
	// StreamWriteTimeout bounds one write to a client: a chunk of a
	// stream, or a whole reply. A client that does not read for that long
	// is taken for gone, and its turn rolls back.
	StreamWriteTimeout = config.StreamWriteTimeout
)

// DefaultCompactAfter is the default of Config.CompactAfter.
const DefaultCompactAfter = config.DefaultCompactAfter

// Config configures a Server.
type Config = config.Config

// Deadlines starts the deadline of every model call. The default uses the
// clock; a test can stand in ManualDeadlines to decide when a held call
// times out, at a known point rather than after a timer.
type Deadlines = config.Deadlines

// ManualDeadlines are deadlines that pass only when Expire says so, whatever
// their duration. The zero value is ready to use.
type ManualDeadlines = config.ManualDeadlines

// Interruption is what a turn leaves in its conversation when its client
// disconnects while it runs (PROTOCOL.md, T10). Under Rollback and
// KeepConsistent the turn stops at once: no model call and no tool run
// starts for it after the disconnect is seen. Under Complete it runs on to
// its end, as if the client had stayed.
type Interruption = config.Interruption

// The interruption policies PROTOCOL.md allows a server to declare (T10).
const (
	// Rollback leaves the conversation as it was before the turn: nothing
	// of the turn is committed.
	Rollback = config.Rollback
	// KeepConsistent commits, if at least one of the turn's tool rounds
	// completed, the turn's user message and its completed rounds (each
	// assistant tool call message with all its results), and nothing
	// after: never a round whose results are not all in, never a reply.
	// With no round completed it commits nothing, as Rollback.
	KeepConsistent = config.KeepConsistent
	// Complete does not stop the turn: it runs to its end (its model
	// calls and tool rounds go on, each still bounded by RequestTimeout)
	// on a context detached from the client, and commits the turn whole
	// if it ends ok, nothing if it fails, as if the client had stayed. The
	// conversation's lock is held, and the request counts as working, until
	// then. Only the server itself ends such a turn early: a crash, or a
	// stop that drops the turns still running (Running.Close, or
	// Running.Shutdown past its deadline); it then commits nothing.
	Complete = config.Complete
)

// Mutant is a switch that brings a real bug back into the reference server,
// so that the harness can prove it catches that bug. The zero value is the
// clean server.
type Mutant = config.Mutant

// The mutants, each from a real bug report in shared/seeds.
const (
	// Clean is the reference server as it should be.
	Clean = config.Clean
	// MutateBeforeRun applies the turn's user message to the cached
	// conversation before the model is called, so a failed turn stays in
	// the history and a retry sees it twice.
	MutateBeforeRun = config.MutateBeforeRun
	// ReplayWithoutUser answers a continuation without a usable new user
	// message by re-using the latest earlier user message in the array,
	// replaying that turn, instead of refusing it with 400.
	ReplayWithoutUser = config.ReplayWithoutUser
	// ReplayOnToolOutput answers a Responses API request whose input holds
	// no usable user message (a client tool's output, a blank message) by
	// appending its input and then the last user message of the history
	// it continues, which the model sees again as the new one: that turn
	// runs again.
	ReplayOnToolOutput = config.ReplayOnToolOutput
	// CommitOnStreamError commits a turn whose model stream failed midway,
	// with the partial reply, though the client was told the turn failed.
	CommitOnStreamError = config.CommitOnStreamError
	// CrossKeyLeak does not scope conversation ids by API key, so a second
	// key naming the same id continues the first key's conversation.
	CrossKeyLeak = config.CrossKeyLeak
	// ForkNewSession resolves the conversation before taking its lock: a
	// request for a conversation with nothing committed yet runs without
	// the lock, so concurrent first requests each start their own history,
	// and the later commit overwrites the earlier.
	ForkNewSession = config.ForkNewSession
	// NoConversationLock takes no per-conversation lock at all: turns on
	// one conversation run at once on the same committed base, and the
	// later commit overwrites the earlier.
	NoConversationLock = config.NoConversationLock
	// ExactSourceKeyOnly resumes a conversation only with the agent source
	// of the exact key it recorded: after a relaunch that loads the agent
	// under another query, the resume fails with 500 "agent not found".
	ExactSourceKeyOnly = config.ExactSourceKeyOnly
	// AckBeforeDurable acknowledges a commit once it is in the cache and
	// writes it to the store in the background, every 500 ms and on a
	// graceful stop: a crash loses acknowledged turns.
	AckBeforeDurable = config.AckBeforeDurable
	// LostOnEvict deletes a conversation from the store when the cache
	// evicts it, though the server claims durable storage.
	LostOnEvict = config.LostOnEvict
	// OrphanToolCallOnInterrupt persists an interrupted turn's working
	// copy as it stands, whatever the interruption policy: a tool round
	// whose results are not all in leaves an assistant tool call without
	// its result in the conversation.
	OrphanToolCallOnInterrupt = config.OrphanToolCallOnInterrupt
	// ShallowClone runs a turn on a copy of the conversation that shares
	// its message structs with the committed one, so that the compaction
	// marks of a turn that fails show in the committed conversation.
	ShallowClone = config.ShallowClone
	// ToolRunsAfterCancel runs tools on a context detached from the
	// request and looks for an interruption only before a model call:
	// after the client disconnects, the tools left in the round still
	// start. The turn still rolls back.
	ToolRunsAfterCancel = config.ToolRunsAfterCancel
	// RefuseConcurrentNew refuses, as busy with a 500, a first request
	// for a conversation with nothing committed yet that finds the
	// conversation's lock taken by another first request, instead of
	// making it wait its turn (or, under Reject, answering 409).
	// Continuations of a conversation with a committed turn wait as the
	// clean server's do.
	RefuseConcurrentNew = config.RefuseConcurrentNew
	// FailedResponseChainable stores a Responses API response whose turn
	// failed (a model error, a broken stream, a timeout), with its user
	// input and any partial reply: chaining from it (its id is known to a
	// streaming client from response.created) succeeds and shows its
	// input.
	FailedResponseChainable = config.FailedResponseChainable
	// StoreFalseKept stores a Responses API response whose request said
	// store: false, as if it had said true: a request chained from it
	// succeeds and sends the model its turn.
	StoreFalseKept = config.StoreFalseKept
	// ResponseCrossKey looks a previous_response_id up without the API
	// key's scope: another key chains from the response and sees its
	// history.
	ResponseCrossKey = config.ResponseCrossKey
	// SessionExactSourceKey is ExactSourceKeyOnly for the turns of the
	// sessions API alone (chat turns resume as they should): after a
	// relaunch that loads the agent under another query, a session's
	// resume fails with 500 "agent not found". A turn whose path names a
	// source key is looked up by that key, as docker-agent did: a client
	// that names the key its session was created under sees the bug, one
	// that names the source loaded now does not.
	SessionExactSourceKey = config.SessionExactSourceKey
	// BranchMutatesBase appends each Responses API turn to the cached
	// history of the response it chains from, in place, instead of to a
	// copy: a request chained from P runs on P's cached history itself,
	// so every later request chained from P sees the earlier ones' turns
	// that completed (their input and their reply). Requests chained from
	// one P take a lock keyed by P, and so run one after the other.
	BranchMutatesBase = config.BranchMutatesBase
	// ReplicaLocalLock takes, on PostgreSQL, only the conversation lock of
	// its own process, not the lease every replica shares: turns
	// on one conversation sent to two replicas at once run on the same
	// committed base, and the later commit overwrites the earlier. One
	// replica alone, or SQLite, serializes as it should.
	ReplicaLocalLock = config.ReplicaLocalLock
	// ReplicaStaleCache serves, on PostgreSQL, a cached conversation
	// unchecked when the turn finds the conversation's lock free, as if no
	// other replica could have committed since it cached it (only a turn
	// that waited for another replica's checks its cache): a replica runs
	// its next turn on its stale copy although another replica committed
	// a turn since, and commits over that turn.
	ReplicaStaleCache = config.ReplicaStaleCache
	// ReplicaCommitUnlocked loads the turn's base, on PostgreSQL, and
	// checks its cache against the store, under the lock of its own
	// process, before it takes the lease every replica shares,
	// and its commit writes without a check that nothing was committed
	// since that base (last writer wins): a turn that waited there for
	// another replica's turn runs on the base from before that turn, and
	// its commit overwrites it.
	ReplicaCommitUnlocked = config.ReplicaCommitUnlocked
	// StoreErrorAcked drops the error of a commit's store write and
	// acknowledges the turn from the cache all the same, as a server that
	// discards its store's errors does: a turn whose commit the store
	// never got (its network broke) ends ok, and is gone from the next
	// turn on another replica, or on this one once its cache is checked
	// against the store.
	StoreErrorAcked = config.StoreErrorAcked
	// ACPRefusalKeepsPrompt keeps, in an ACP session, the prompt of a
	// turn the model refused (stopReason refusal), as an agent that adds
	// the user message to its session before it runs the model does:
	// ACP says a refused prompt is not part of the next one, but the next
	// turn's model call carries it.
	ACPRefusalKeepsPrompt = config.ACPRefusalKeepsPrompt
	// ACPCancelCommitsPrompt commits, in an ACP session, the prompt of a
	// turn that session/cancel ended, whatever the interruption policy:
	// under rollback the next turn's model call carries it.
	ACPCancelCommitsPrompt = config.ACPCancelCommitsPrompt
	// ACPConcurrentPrompts runs the prompts of one ACP session without the
	// session's lock: a second session/prompt sent while the first runs
	// starts on the same committed history, and the later commit
	// overwrites the earlier.
	ACPConcurrentPrompts = config.ACPConcurrentPrompts
	// ACPLoadDiffers replays, on session/load, the session's history
	// without its last committed turn, while the model goes on being sent
	// the whole history: what the client shows is not what the agent
	// holds.
	ACPLoadDiffers = config.ACPLoadDiffers
	// ACPCancelAnswersError ends, on session/cancel, the session's
	// prompts in flight as the clean server does, but answers each with
	// the JSON-RPC error of a turn whose client went away, not stopReason
	// cancelled: the error the abort raised reaches the prompt's answer,
	// which ACP says an agent must catch. The client sees what it sees of
	// an agent that ignores the cancel and answers the prompt with an
	// error when its own timeout passes: a JSON-RPC error to a
	// prompt it cancelled.
	ACPCancelAnswersError = config.ACPCancelAnswersError
	// SessionEmptyRuns runs a session turn whose messages hold no usable
	// user message (none at all, or blank ones only) on the session as it
	// is, as docker-agent's session API does: the model is sent the last
	// committed user message as the newest, and that turn runs again.
	SessionEmptyRuns = config.SessionEmptyRuns
	// A2AContextRace runs the tasks of one A2A context without the
	// context's lock: two messages of a context run on one base.
	A2AContextRace = config.A2AContextRace
	// A2AFailedTaskStays keeps the message of an A2A task that failed.
	A2AFailedTaskStays = config.A2AFailedTaskStays
	// A2ACancelCommits commits the message of a task tasks/cancel ended.
	A2ACancelCommits = config.A2ACancelCommits
	// A2ATaskHistoryContext answers tasks/get with the context's whole
	// history as the task's.
	A2ATaskHistoryContext = config.A2ATaskHistoryContext
	// A2ACancelIgnored answers tasks/cancel canceled but runs the task
	// on, and commits it.
	A2ACancelIgnored = config.A2ACancelIgnored
	// A2ATaskRerun runs a message naming a task that ended as that task
	// again.
	A2ATaskRerun = config.A2ATaskRerun
)

// MutantInfo documents a mutant: the bug it brings back and where that bug
// was reported.
type MutantInfo = config.MutantInfo

// ParseConcurrency returns the policy named s ("" for Serialize), or an
// error naming the valid values.
func ParseConcurrency(s string) (Concurrency, error) { return config.ParseConcurrency(s) }

// ParseInterruption returns the policy named s ("" for Rollback), or an
// error naming the valid values.
func ParseInterruption(s string) (Interruption, error) { return config.ParseInterruption(s) }

// Mutants lists every mutant, in a stable order.
func Mutants() []MutantInfo { return config.Mutants() }

// ParseMutant returns the mutant named s ("", "none" or "clean" for the
// clean server), or an error listing the valid names.
func ParseMutant(s string) (Mutant, error) { return config.ParseMutant(s) }
