package config

import (
	"fmt"
	"strings"
)

// Mutant is a switch that brings a real bug back into the reference server,
// so that the harness can prove it catches that bug. The zero value is the
// clean server.
type Mutant string

// The mutants, each from a real bug report in shared/seeds.
const (
	// Clean is the reference server as it should be.
	Clean Mutant = ""
	// MutateBeforeRun applies the turn's user message to the cached
	// conversation before the model is called, so a failed turn stays in
	// the history and a retry sees it twice.
	MutateBeforeRun Mutant = "mutate-before-run"
	// ReplayWithoutUser answers a continuation without a usable new user
	// message by re-using the latest earlier user message in the array,
	// replaying that turn, instead of refusing it with 400.
	ReplayWithoutUser Mutant = "replay-without-user"
	// ReplayOnToolOutput answers a Responses API request whose input holds
	// no usable user message (a client tool's output, a blank message) by
	// appending its input and then the last user message of the history
	// it continues, which the model sees again as the new one: that turn
	// runs again.
	ReplayOnToolOutput Mutant = "replay-on-tool-output"
	// CommitOnStreamError commits a turn whose model stream failed midway,
	// with the partial reply, though the client was told the turn failed.
	CommitOnStreamError Mutant = "commit-on-stream-error"
	// CrossKeyLeak does not scope conversation ids by API key, so a second
	// key naming the same id continues the first key's conversation.
	CrossKeyLeak Mutant = "cross-key-leak"
	// ForkNewSession resolves the conversation before taking its lock: a
	// request for a conversation with nothing committed yet runs without
	// the lock, so concurrent first requests each start their own history,
	// and the later commit overwrites the earlier.
	ForkNewSession Mutant = "fork-new-session"
	// NoConversationLock takes no per-conversation lock at all: turns on
	// one conversation run at once on the same committed base, and the
	// later commit overwrites the earlier.
	NoConversationLock Mutant = "no-conversation-lock"
	// ExactSourceKeyOnly resumes a conversation only with the agent source
	// of the exact key it recorded: after a relaunch that loads the agent
	// under another query, the resume fails with 500 "agent not found".
	ExactSourceKeyOnly Mutant = "exact-source-key-only"
	// AckBeforeDurable acknowledges a commit once it is in the cache and
	// writes it to the store in the background, every 500 ms and on a
	// graceful stop: a crash loses acknowledged turns.
	AckBeforeDurable Mutant = "ack-before-durable"
	// LostOnEvict deletes a conversation from the store when the cache
	// evicts it, though the server claims durable storage.
	LostOnEvict Mutant = "lost-on-evict"
	// OrphanToolCallOnInterrupt persists an interrupted turn's working
	// copy as it stands, whatever the interruption policy: a tool round
	// whose results are not all in leaves an assistant tool call without
	// its result in the conversation.
	OrphanToolCallOnInterrupt Mutant = "orphan-tool-call-on-interrupt"
	// ShallowClone runs a turn on a copy of the conversation that shares
	// its message structs with the committed one, so that the compaction
	// marks of a turn that fails show in the committed conversation.
	ShallowClone Mutant = "shallow-clone"
	// ToolRunsAfterCancel runs tools on a context detached from the
	// request and looks for an interruption only before a model call:
	// after the client disconnects, the tools left in the round still
	// start. The turn still rolls back.
	ToolRunsAfterCancel Mutant = "tool-runs-after-cancel"
	// RefuseConcurrentNew refuses, as busy with a 500, a first request
	// for a conversation with nothing committed yet that finds the
	// conversation's lock taken by another first request, instead of
	// making it wait its turn (or, under Reject, answering 409).
	// Continuations of a conversation with a committed turn wait as the
	// clean server's do.
	RefuseConcurrentNew Mutant = "refuse-concurrent-new"
	// FailedResponseChainable stores a Responses API response whose turn
	// failed (a model error, a broken stream, a timeout), with its user
	// input and any partial reply: chaining from it (its id is known to a
	// streaming client from response.created) succeeds and shows its
	// input.
	FailedResponseChainable Mutant = "failed-response-chainable"
	// StoreFalseKept stores a Responses API response whose request said
	// store: false, as if it had said true: a request chained from it
	// succeeds and sends the model its turn.
	StoreFalseKept Mutant = "store-false-kept"
	// ResponseCrossKey looks a previous_response_id up without the API
	// key's scope: another key chains from the response and sees its
	// history.
	ResponseCrossKey Mutant = "response-cross-key"
	// SessionExactSourceKey is ExactSourceKeyOnly for the turns of the
	// sessions API alone (chat turns resume as they should): after a
	// relaunch that loads the agent under another query, a session's
	// resume fails with 500 "agent not found". A turn whose path names a
	// source key is looked up by that key, as docker-agent did: a client
	// that names the key its session was created under sees the bug, one
	// that names the source loaded now does not.
	SessionExactSourceKey Mutant = "session-exact-source-key"
	// BranchMutatesBase appends each Responses API turn to the cached
	// history of the response it chains from, in place, instead of to a
	// copy: a request chained from P runs on P's cached history itself,
	// so every later request chained from P sees the earlier ones' turns
	// that completed (their input and their reply). Requests chained from
	// one P take a lock keyed by P, and so run one after the other.
	BranchMutatesBase Mutant = "branch-mutates-base"
	// ReplicaLocalLock takes, on PostgreSQL, only the conversation lock of
	// its own process, not the lease every replica shares: turns
	// on one conversation sent to two replicas at once run on the same
	// committed base, and the later commit overwrites the earlier. One
	// replica alone, or SQLite, serializes as it should.
	ReplicaLocalLock Mutant = "replica-local-lock"
	// ReplicaStaleCache serves, on PostgreSQL, a cached conversation
	// unchecked when the turn finds the conversation's lock free, as if no
	// other replica could have committed since it cached it (only a turn
	// that waited for another replica's checks its cache): a replica runs
	// its next turn on its stale copy although another replica committed
	// a turn since, and commits over that turn.
	ReplicaStaleCache Mutant = "replica-stale-cache"
	// ReplicaCommitUnlocked loads the turn's base, on PostgreSQL, and
	// checks its cache against the store, under the lock of its own
	// process, before it takes the lease every replica shares,
	// and its commit writes without a check that nothing was committed
	// since that base (last writer wins): a turn that waited there for
	// another replica's turn runs on the base from before that turn, and
	// its commit overwrites it.
	ReplicaCommitUnlocked Mutant = "replica-commit-unlocked"
	// StoreErrorAcked drops the error of a commit's store write and
	// acknowledges the turn from the cache all the same, as a server that
	// discards its store's errors does: a turn whose commit the store
	// never got (its network broke) ends ok, and is gone from the next
	// turn on another replica, or on this one once its cache is checked
	// against the store.
	StoreErrorAcked Mutant = "store-error-acked"
	// ACPRefusalKeepsPrompt keeps, in an ACP session, the prompt of a
	// turn the model refused (stopReason refusal), as an agent that adds
	// the user message to its session before it runs the model does:
	// ACP says a refused prompt is not part of the next one, but the next
	// turn's model call carries it.
	ACPRefusalKeepsPrompt Mutant = "acp-refusal-keeps-prompt"
	// ACPCancelCommitsPrompt commits, in an ACP session, the prompt of a
	// turn that session/cancel ended, whatever the interruption policy:
	// under rollback the next turn's model call carries it.
	ACPCancelCommitsPrompt Mutant = "acp-cancel-commits-prompt"
	// ACPConcurrentPrompts runs the prompts of one ACP session without the
	// session's lock: a second session/prompt sent while the first runs
	// starts on the same committed history, and the later commit
	// overwrites the earlier.
	ACPConcurrentPrompts Mutant = "acp-concurrent-prompts"
	// ACPLoadDiffers replays, on session/load, the session's history
	// without its last committed turn, while the model goes on being sent
	// the whole history: what the client shows is not what the agent
	// holds.
	ACPLoadDiffers Mutant = "acp-load-differs"
	// ACPCancelAnswersError ends, on session/cancel, the session's
	// prompts in flight as the clean server does, but answers each with
	// the JSON-RPC error of a turn whose client went away, not stopReason
	// cancelled: the error the abort raised reaches the prompt's answer,
	// which ACP says an agent must catch. The client sees what it sees of
	// an agent that ignores the cancel and answers the prompt with an
	// error when its own timeout passes: a JSON-RPC error to a
	// prompt it cancelled.
	ACPCancelAnswersError Mutant = "acp-cancel-answers-error"
	// SessionEmptyRuns runs a session turn whose messages hold no usable
	// user message (none at all, or blank ones only) on the session as it
	// is, as docker-agent's session API does: the model is sent the last
	// committed user message as the newest, and that turn runs again.
	SessionEmptyRuns Mutant = "session-empty-runs"
	// A2AContextRace runs the tasks of one A2A context without the
	// context's lock, as docker-agent's serve a2a does (nothing
	// serializes them): a second message sent while a task of its
	// context runs starts on the same committed history, and the later
	// commit overwrites the earlier.
	A2AContextRace Mutant = "a2a-context-race"
	// A2AFailedTaskStays keeps the message of an A2A task that failed, as
	// docker-agent's serve a2a adds it to the context's session before
	// the run: the next task of the context sends it to the model.
	A2AFailedTaskStays Mutant = "a2a-failed-task-stays"
	// A2ACancelCommits answers a task tasks/cancel ended canceled, but
	// commits its message (and the tool rounds it completed), whatever the
	// interruption policy.
	A2ACancelCommits Mutant = "a2a-cancel-commits"
	// A2ATaskHistoryContext answers tasks/get with the context's whole
	// history as the task's: the task shows turns it never sent the
	// model.
	A2ATaskHistoryContext Mutant = "a2a-task-history-context"
	// A2ACancelIgnored answers tasks/cancel canceled at once, on the
	// answer and the task's stream, but runs the task on, detached from
	// its request (a dropped stream does not stop it either), and
	// commits it whole if its model call is answered.
	A2ACancelIgnored Mutant = "a2a-cancel-ignored"
	// A2ATaskRerun runs a message that names a task that ended as that
	// task again: its message, as a new task of its context.
	A2ATaskRerun Mutant = "a2a-task-rerun"
)

// MutantInfo documents a mutant: the bug it brings back and where that bug
// was reported.
type MutantInfo struct {
	Mutant Mutant
	// Issue is the real report the bug comes from.
	Issue string
	// Breaks is the invariant a correct harness reports, or, for a bug
	// that two triggers set off, the invariants ("T1, T10"), each a
	// finding of its own.
	Breaks string
	// Bug says what the server gets wrong.
	Bug string
	// Interruption is the policy the server with the bug declares, where
	// the bug is one of a server with that policy ("" for any): goose,
	// where the orphaned tool call comes from, keeps what an interrupted
	// turn completed.
	Interruption Interruption
	// Protocol is the client protocol through which the harness catches
	// the bug: "" for chat completions (POST /v1/chat/completions),
	// "responses" for the Responses API (POST /v1/responses), "sessions"
	// for the sessions API (POST /api/sessions), "acp" for the Agent
	// Client Protocol over stdio ('turncheck serve acp'), "a2a" for the
	// Agent2Agent protocol ('turncheck serve a2a'). A bug of one protocol
	// may not show through another.
	Protocol string
	// Replicas is how many replicas of the server, over one PostgreSQL,
	// the harness runs to catch the bug; 0 for one process on SQLite.
	Replicas int
}

// Mutants lists every mutant, in a stable order.
func Mutants() []MutantInfo {
	return []MutantInfo{
		{MutateBeforeRun, "docker-agent #2890", "T1, T10",
			"a continuation appends its user message to the cached conversation before the run: a failed turn stays and a retry sees it twice (T1), and so does the message of a turn whose client disconnected (T10), a trigger of its own", "", "", 0},
		{ReplayWithoutUser, "docker-agent #2947", "T3",
			"a continuation without a usable new user message re-uses an earlier user message from the array and replays that turn instead of 400", "", "", 0},
		{ReplayOnToolOutput, "docker-agent #2947 (responses: a continuation with tool outputs only)", "T3",
			"a Responses API request whose input holds no user message (a client tool's output) appends it, then the last user message of the history it continues, which the model runs again as new", "", string(ProtoResponses), 0},
		{CommitOnStreamError, "docker-agent #2890 (stream errors)", "T1",
			"a turn whose model stream failed midway is committed with its partial reply although the client got an error", "", "", 0},
		{CrossKeyLeak, "PROTOCOL.md T5 (conversations scoped per key)", "T5",
			"conversation ids are not scoped per API key: another key naming the same id continues the conversation", "", "", 0},
		{ForkNewSession, "openclaw #84575", "T4",
			"the session is resolved before the per-conversation lane: concurrent first requests for a new id each start a fresh history, and the later commit overwrites the earlier", "", "", 0},
		{NoConversationLock, "PROTOCOL.md T4 (one conversation, one line)", "T4",
			"turns on one conversation are not serialized: concurrent continuations run on the same committed base, and the later commit overwrites the earlier", "", "", 0},
		{ExactSourceKeyOnly, "docker-agent #3410", "T8",
			"a resume looks up the exact source key the conversation recorded (the full URL, query included); relaunched under another query, it fails with 500 \"agent not found\"", "", "", 0},
		{AckBeforeDurable, "PROTOCOL.md T7 (durability)", "T7",
			"a commit is acknowledged once it is in the cache; the store write is queued and flushed every 500 ms and on a graceful stop, so a kill -9 loses acknowledged turns", "", "", 0},
		{LostOnEvict, "PROTOCOL.md T2 (committed turns stay)", "T2",
			"a conversation evicted from the cache is deleted from the store, though the server claims durable storage: it comes back empty", "", "", 0},
		{OrphanToolCallOnInterrupt, "goose #7785", "T9",
			"on an interruption the working copy is persisted as it stands (replace_conversation), whatever the policy: a tool round cut short leaves an assistant tool call without its result",
			KeepConsistent, "", 0},
		{ShallowClone, "docker-agent #2947 (deep-copy hardening)", "T11",
			"the working copy shares its message structs with the committed conversation (only the slice is copied): a failed turn's compaction marks hide tool rounds from every later turn", "", "", 0},
		{ToolRunsAfterCancel, "goose #7785/#7827", "T10",
			"tools run on a context detached from the request, and cancellation is checked only before a model call: after the client disconnects, the tools left in the round still start", "", "", 0},
		{RefuseConcurrentNew, "openclaw #84575 (serialize: a refusal instead of a wait)", "T4",
			"a first request for a new id that finds another first request's turn running is refused at once with 500 \"session is busy\" instead of waiting its turn; continuations of a committed conversation still wait", "", "", 0},
		{FailedResponseChainable, "PROTOCOL.md T1 (responses: a failed response is never a base)", "T1",
			"a response whose turn failed is stored anyway, with its user input and any partial reply: a request chaining from it (previous_response_id, known from response.created) succeeds and sends the model the failed input", "", string(ProtoResponses), 0},
		{StoreFalseKept, "PROTOCOL.md T1 (responses: a response not stored is no base)", "T1",
			"a Responses API response whose request said store: false is stored all the same: a request chained from it succeeds and sends the model its turn", "", string(ProtoResponses), 0},
		{ResponseCrossKey, "PROTOCOL.md T5 (responses scoped per key)", "T5",
			"previous_response_id is looked up without the API key's scope: another key chains from the response and the model sees its history", "", string(ProtoResponses), 0},
		{SessionExactSourceKey, "docker-agent #3410", "T8",
			"a session's resume looks up an exact source key (the one the turn's path names, else the one the session recorded; chat turns resume correctly); relaunched under another query, a session turn naming its old key fails with 500 \"agent not found\"", "", string(ProtoSessions), 0},
		{BranchMutatesBase, "PROTOCOL.md T4 (responses: branches stay apart)", "T4",
			"a request chained from a response runs on that response's cached history in place, not on a copy: a second request chained from it sees the first one's input and reply", "", string(ProtoResponses), 0},
		{ReplicaLocalLock, "openclaw #84575 across replicas", "T4",
			"on PostgreSQL the conversation lock is only the replica's own, not the lease the replicas share: turns on one conversation sent to two replicas at once run on one base, and the later commit overwrites the earlier", "", "", 3},
		{ReplicaStaleCache, "PROTOCOL.md T2 across replicas", "T2",
			"a turn that finds the conversation's lock free serves the replica's cached copy without a check against the store: after another replica committed a turn, the next turn on this replica runs on its stale copy and commits over that turn", "", "", 3},
		{ReplicaCommitUnlocked, "PROTOCOL.md T4 across replicas (the base loaded before the shared lock)", "T4",
			"a turn's base is loaded, and the cache checked, under the replica's own lock, before the lease the replicas share, and the commit writes over whatever is there: a turn that waited for another replica's turn runs on the base from before it, and its commit overwrites it", "", "", 3},
		{StoreErrorAcked, "Gitlawb/zero #471 (session persistence errors discarded)", "T2",
			"a commit's store write that fails is ignored and the turn acknowledged from the cache: when the network to the store breaks mid-turn, the acknowledged turn never reached the store, and the next turn, on any replica, runs without it", "", "", 3},
		{ACPRefusalKeepsPrompt, "docker-agent #2890 (ACP: the prompt is added to the session before the model runs)", "T1",
			"a prompt the model refused (stopReason refusal) stays in the session: the next turn's model call carries it, though ACP says a refused prompt is left out of the next one", "", string(ProtoACP), 0},
		{ACPCancelCommitsPrompt, "docker-agent #2890 (a client abort keeps the prompt)", "T10",
			"session/cancel ends the turn but commits its prompt, whatever the interruption policy: under rollback the next turn's model call carries the cancelled prompt", "", string(ProtoACP), 0},
		{ACPConcurrentPrompts, "openclaw #84575 (ACP: two prompts on one session)", "T4",
			"the prompts of one session run without the session's lock: a second session/prompt sent while the first runs starts on the same committed history, and the later commit overwrites the earlier", "", string(ProtoACP), 0},
		{ACPLoadDiffers, "PROTOCOL.md T7 (ACP: session/load replays the conversation)", "T7",
			"session/load replays the session without its last committed turn, while the model is sent the whole history: what the client is shown after a restart is not what the agent holds", "", string(ProtoACP), 0},
		{SessionEmptyRuns, "docker-agent #2947 (serve api: a turn with no message runs the session as it is)", "T3",
			"a session turn whose messages are empty, or blank only, appends nothing and runs the model on the session as it is: the last committed user message is sent as the newest, and its turn runs again", "", string(ProtoSessions), 0},
		{ACPCancelAnswersError, "PROTOCOL.md ACP T10 (a cancelled prompt is answered cancelled, never with a JSON-RPC error)", "wire",
			"a prompt the client cancelled (session/cancel) is stopped, but answered with a JSON-RPC error, the one its abort raised, where ACP wants stopReason cancelled", "", string(ProtoACP), 0},
		{A2AContextRace, "docker-agent serve a2a (nothing serializes the tasks of a context)", "T4",
			"the tasks of one context run without the context's lock: a second message sent while a task of its context runs starts on the same committed history, and the later commit overwrites the earlier", "", string(ProtoA2A), 0},
		{A2AFailedTaskStays, "docker-agent serve a2a (the message is added to the context before the run)", "T1",
			"a task that ends failed keeps its message in its context, with any partial reply: the next task of the context sends them to the model", "", string(ProtoA2A), 0},
		{A2ACancelCommits, "docker-agent #2890 (A2A: tasks/cancel keeps the message)", "T10",
			"tasks/cancel ends the task, answered canceled, but its message is committed, whatever the interruption policy: under rollback the next task's model call carries it", "", string(ProtoA2A), 0},
		{A2ATaskHistoryContext, "PROTOCOL.md wire (A2A: tasks/get shows the task's own messages)", "wire",
			"tasks/get answers a task's history with its context's whole history: the task shows messages it never sent the model", "", string(ProtoA2A), 0},
		{A2ATaskRerun, "PROTOCOL.md A2A T3 (a task that ended does not run again)", "T3",
			"a message that names a task that ended (its taskId) runs that task's message again, as a new task of its context, where A2A refuses it: the model is sent a committed user message again as the new one", "", string(ProtoA2A), 0},
		{A2ACancelIgnored, "a2a-go executors (AgentExecutor.Cancel writes a canceled event; Execute never hears of it)", "T10",
			"tasks/cancel is answered canceled, and the task's stream ends canceled, but the task runs on, detached from its request (a dropped stream does not stop it either): once its model call is answered, the whole turn is committed, whatever the interruption policy", "", string(ProtoA2A), 0},
	}
}

// ParseMutant returns the mutant named s ("", "none" or "clean" for the
// clean server), or an error listing the valid names.
func ParseMutant(s string) (Mutant, error) {
	if s == "" || s == "none" || s == "clean" {
		return Clean, nil
	}
	names := make([]string, 0, len(Mutants()))
	for _, m := range Mutants() {
		if string(m.Mutant) == s {
			return m.Mutant, nil
		}
		names = append(names, string(m.Mutant))
	}
	return Clean, fmt.Errorf("unknown mutant %q (known: %s)", s, strings.Join(names, ", "))
}
