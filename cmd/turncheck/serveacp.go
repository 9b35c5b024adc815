package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/turncheck/turncheck/sut"
)

const serveACPHelp = `Usage: turncheck serve acp --model-url URL (--data-dir DIR | --store URL) [flags]

Runs the reference session server as an agent of the Agent Client Protocol
(https://agentclientprotocol.com): an editor, or turncheck, starts it as a
child process and speaks JSON-RPC 2.0 to it over its stdin and stdout, one
message a line. Its log goes to stderr, starting with a line "acp: serving
the Agent Client Protocol on stdin and stdout" once the store is open;
stdout carries the protocol alone.
It serves one client, with as many sessions as it asks for, and exits 0
when its stdin closes (the prompts still running end as if their client
disconnected: --interruption), or on Ctrl-C or SIGTERM (they are dropped,
each answered with an error, nothing of them kept).

The store, the turns, the tools, the agents and the policies are those of
'turncheck serve': a session is a conversation, kept durably in the store,
and a prompt is a turn.

  initialize       answers protocolVersion 1 and agentCapabilities
                   {"loadSession": true}; no auth methods
  session/new      a new session, stored before its id is answered
                   (cwd must be absolute; mcpServers are not connected)
  session/load     replays the session's committed history as session/update
                   notifications (user_message_chunk, tool_call and
                   tool_call_update for each tool call and its result,
                   agent_message_chunk), then answers {}; a session must be
                   created or loaded on the connection before its prompts
  session/prompt   one turn: the prompt's text blocks, joined by newlines,
                   are the user message, passed to the model as written. The
                   reply streams as agent_message_chunk; the answer is
                   stopReason end_turn once the turn is committed, refusal
                   when the model refused it (it answered 400: nothing kept),
                   cancelled after session/cancel, or a JSON-RPC error (a
                   model that failed: nothing kept)
  session/cancel   stops the session's prompts at once, each answered
                   cancelled; what stays is --interruption's

A prompt on a busy session waits its turn (--concurrency serialize),
gets an error at once (reject), or cancels the running prompt, answered
cancelled as after session/cancel, and runs after it (supersede). An error's data names what the HTTP server
would have answered: {"status": 409, "type": "conflict", "detail": ...}.
Codes: -32602 a prompt refused before any model call (blank, too long, a
block other than text or resource_link), -32002 an unknown session, -32603
the rest (a model that failed or timed out, a busy session, the server
stopping). A line that is not a JSON-RPC message gets a JSON-RPC error with
a null id (-32700 not JSON, -32600 not a message, or over --max-body-bytes)
and the server goes on. A client that does not read a line of the server's
output within 30s is taken for gone.

--agent loads agent definitions as for 'turncheck serve'; a new session
binds to the first one given, and records its reference; a session resumes
with it after a relaunch under a changed query (the reference without its
query), and is refused if several loaded references share that.

Example:
  turncheck model --listen 127.0.0.1:9090 &
  printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}' \
    '{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}' |
    turncheck serve acp --model-url http://127.0.0.1:9090/v1 --data-dir ./data
`

// cmdServeACP runs 'turncheck serve acp': the reference server speaking
// ACP on stdin and stdout.
func cmdServeACP(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlags("serve acp", serveACPHelp, stdout, stderr)
	modelURL := fs.String("model-url", "", "the model provider's OpenAI-compatible base URL (required)")
	dataDir := fs.String("data-dir", "", "directory of the durable store, a SQLite database (required without --store)")
	storeURL := fs.String("store", "", "postgres:// URL of a PostgreSQL database to keep the store in (instead of --data-dir)")
	mutant := fs.String("mutant", "", "switch on a mutant (see 'turncheck mutants')")
	convMax := fs.Int("conversations-max", sut.DefaultConversationsMax, "conversations kept in the in-memory cache")
	timeout := fs.Duration("request-timeout", sut.DefaultRequestTimeout, "deadline of each model call, and of each wait for a busy session under serialize")
	concurrency := fs.String("concurrency", string(sut.Serialize), "what a prompt on a busy session gets: serialize (wait its turn), reject (an error) or supersede (the running prompt is cancelled, and the new one runs after it)")
	interruption := fs.String("interruption", string(sut.Rollback), "what a cancelled prompt leaves: rollback (nothing), keep-consistent (its completed tool rounds) or complete (it runs to its end, then commits whole or nothing)")
	compactAfter := fs.Int("compact-after", sut.DefaultCompactAfter, "messages a turn may show the model before earlier turns' tool rounds are hidden from it")
	agents := &repeated{what: "an agent reference"}
	fs.Var(agents, "agent", "agent definition to load: an http(s) URL or a file; repeat for several (a new session binds to the first)")
	maxRequests := fs.Int("max-requests", sut.DefaultMaxRequests, "prompts worked on at once (an error past it)")
	maxBody := fs.Int64("max-body-bytes", sut.DefaultMaxBodyBytes, "bytes of one JSON-RPC message (a line over it is answered with an error and skipped)")
	maxHistMsgs := fs.Int("max-history-messages", sut.DefaultMaxHistoryMessages, "messages of a session (a prompt past it: an error)")
	maxHistBytes := fs.Int64("max-history-bytes", sut.DefaultMaxHistoryBytes, "bytes of a session's text (a prompt past it: an error)")
	maxMemory := &byteSize{}
	fs.Var(maxMemory, "max-memory", "the memory budget, in `bytes`, of the cache and the turns in flight (auto: 1/4 of the machine's or the cgroup's memory)")
	titles := fs.Bool("titles", false, "make a title model call beside each turn, as servers that name their conversations do")
	if code := fs.parse(args); code >= 0 {
		return code
	}
	switch {
	case *modelURL == "":
		return fail(stderr, "serve acp", errors.New("--model-url is required"))
	case *dataDir == "" && *storeURL == "":
		return fail(stderr, "serve acp", errors.New("--data-dir is required (or --store postgres://...)"))
	case *dataDir != "" && *storeURL != "":
		return fail(stderr, "serve acp", errors.New("--data-dir and --store name two stores: give one"))
	case *convMax <= 0 || *timeout <= 0 || *compactAfter <= 0:
		return fail(stderr, "serve acp", errors.New("--conversations-max, --request-timeout and --compact-after must be positive"))
	case *maxRequests <= 0 || *maxBody <= 0 || *maxHistMsgs <= 0 || *maxHistBytes <= 0:
		return fail(stderr, "serve acp", errors.New("--max-requests, --max-body-bytes and --max-history-* must be positive"))
	}
	m, err := sut.ParseMutant(*mutant)
	if err != nil {
		return fail(stderr, "serve acp", err)
	}
	policy, err := sut.ParseConcurrency(*concurrency)
	if err != nil {
		return fail(stderr, "serve acp", fmt.Errorf("--concurrency: %w", err))
	}
	onInterrupt, err := sut.ParseInterruption(*interruption)
	if err != nil {
		return fail(stderr, "serve acp", fmt.Errorf("--interruption: %w", err))
	}
	err = sut.ServeACP(ctx, sut.Config{
		ModelURL:           *modelURL,
		DataDir:            *dataDir,
		Store:              *storeURL,
		ConversationsMax:   *convMax,
		RequestTimeout:     *timeout,
		Concurrency:        policy,
		Interruption:       onInterrupt,
		CompactAfter:       *compactAfter,
		Agents:             agents.values,
		Mutant:             m,
		Logger:             slog.New(slog.NewTextHandler(stderr, nil)),
		MaxRequests:        *maxRequests,
		MaxBodyBytes:       *maxBody,
		MaxHistoryMessages: *maxHistMsgs,
		MaxHistoryBytes:    *maxHistBytes,
		MaxMemory:          maxMemory.n,
		Titles:             *titles,
	}, stdin, stdout)
	if err != nil {
		return fail(stderr, "serve acp", err)
	}
	return exitOK
}
