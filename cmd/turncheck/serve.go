package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/sut"
)

const serveHelp = `Usage: turncheck serve --model-url URL (--data-dir DIR | --store URL) [flags]
       turncheck serve a2a --model-url URL (--data-dir DIR | --store URL) [flags]
       turncheck serve acp --model-url URL (--data-dir DIR | --store URL) [flags]

Runs the reference session server: POST /v1/chat/completions, with the
conversation named by the X-Conversation-Id header kept server-side in a
SQLite store under --data-dir (made 0700, its files 0600); over the same
store, the Responses API (POST /v1/responses, chained by
previous_response_id), a session API (POST /api/sessions, then POST
/api/sessions/{session}/agent/{agent} with the messages) and the
Agent2Agent protocol (JSON-RPC at POST /a2a, its agent card at GET
/.well-known/agent-card.json; each context a conversation, each message a
task). 'turncheck serve a2a' is the same server, named for what an A2A
client reaches. It prints the
address it listens on. On Ctrl-C or SIGTERM it stops listening, closes the
connections on which no turn runs (idle, or still sending a request), lets
the turns in flight end for at most --grace, and exits 0. Past it, the
rest are dropped and rolled back, whatever --interruption says: each
client is answered 503 with a JSON error and Retry-After (on a stream
that had begun, an error chunk and [DONE]), and the log says the server
dropped the turn.

--store postgres://USER:PASSWORD@HOST:PORT/DB keeps the store in that
PostgreSQL database instead (no --data-dir needed). Servers started on
one database are replicas of one server, behind any load balancer: a turn
committed on one is seen by the next turn on any other, turns on one
conversation run one after another across all of them (--concurrency
holds across replicas), and a turn is acknowledged once PostgreSQL has it
durably. The password may also come from PGPASSWORD or ~/.pgpass, as for
psql, so that it does not show in ps.

Keys: --key (repeatable), --key-file PATH (one key per line; blank lines
and lines starting with # are skipped) and TURNCHECK_KEYS (comma-separated)
add up; none of them: no auth. Prefer the file or the environment: a --key
shows in ps. Conversations are stored under a keyed digest (HMAC-SHA256)
of their key, with a random secret the store keeps.

Who may call it: a request whose Host is not a loopback name (localhost,
127.0.0.1, [::1]), the address it came in on, or an --allow-host name gets
421; one with an Origin that is not on loopback or an --allow-host name
gets 403 (web pages cannot write into conversations); a Content-Type other
than application/json gets 415.

Model failures: a client gets 502 "the model failed" or 504 "the model
timed out"; what the model said goes to the log (stderr), credentials
redacted.

Limits and timeouts (flag, default):
  --header-timeout        10s      to send a request's headers (connection closed)
  --body-timeout          15s      to send a request's body, once its headers are in (408)
  --idle-timeout          1m0s     a keep-alive connection waits for its next request
  --request-timeout       1m0s     each model call (504), each lookup (an "error: "
                                   result), and each wait for a busy conversation
                                   under serialize (503)
  --grace                 10s      on stop, for turns in flight
  --max-conns             1024     open client connections; past it a new one replaces
                                   a stalled one: first one that has waited 1s for a
                                   request head, then one idle for 1s, then one whose
                                   body has not come within 1s of its head; else the
                                   oldest newcomer with no head yet; never one with a
                                   request in: if every one has, 503 with Retry-After: 1
                                   (the cap being hit is logged at most every 10s)
  --max-requests          512      chat requests worked on at once, from the end of
                                   their body (503 with Retry-After: 1); also the
                                   model connections kept idle for reuse
  --max-store-conns       auto     connections to PostgreSQL (--store); auto: one for
                                   every 20 --max-requests, at least 8 (26 at 512). A
                                   turn holds one only while in the store (its lease
                                   and load, its commit), none at its model; one is
                                   kept for the rest. A turn that gets none within
                                   --request-timeout (all held: it waits its turn,
                                   first come first served; or PostgreSQL has no
                                   room): 503 with Retry-After: 1, before any model
                                   call. Each replica holds one more, its connection
                                   of life; replicas on one database must fit in its
                                   max_connections together
  --max-body-bytes        1048576  a request body (413; at once when Content-Length says so)
  --max-history-messages  2000     a conversation's messages, its next reply included
  --max-history-bytes     4194304  a conversation's text, its new message included
                                   (a turn past either: 400, nothing changes; start
                                   a new conversation)
  --max-memory            auto     the memory budget the conversation cache, request
                                   bodies and turns in flight (each model call's history,
                                   the reply it streams) draw from; auto: 1/4 of the
                                   machine's memory, or of the cgroup's limit if lower
                                   (the log says which). The cache drops its least
                                   recently used conversations to stay inside it (they
                                   stay on disk); a request that finds no room gets 503
                                   with Retry-After: 1, a turn whose reply outgrows it
                                   fails (503, or an error chunk on a stream that began),
                                   nothing changed. The process's GC limit is the budget
                                   plus 32MiB. Bytes, or with KiB, MiB, GiB (or KB, MB, GB)
  --conversations-max     1000     conversations cached in memory (the rest are on disk)
  --compact-after         64       messages a turn may show the model before the tool
                                   rounds of earlier turns are hidden from it (kept on
                                   disk; the turn's own rounds are always shown)
Fixed: headers 65536 bytes (431); "model" 256 bytes, each message's content
65536 bytes, 1024 messages per request, a conversation id 256 bytes (400);
a model reply 4194304 bytes; each write to a client 30s (a client that does
not read is taken for gone); an --agent fetch 5s and 65536 bytes.

--agent loads an agent definition at start-up, from an http(s) URL or a
file: YAML with a "name" and an "instruction" (no other field). Repeat it
for several. A new conversation binds to the agent its request's "model"
names (the reference exactly, the reference without its query, or the
agent's name; several matches: 409, none: 404) and records the reference;
a resumed one keeps its agent, found after a relaunch under a changed query
by the reference without its query (several such: 409, nothing changes).
The agent's instruction is the system message of the conversation's every
model call.

Tools: every model call offers two tools, echo {"text"} (answers the
text) and lookup {"key"} (answers the body of GET
{model-url}/tools/lookup?key=KEY, at most 65536 bytes; bounded by
--request-timeout). A failed tool, an unknown tool or bad arguments give
the model a result starting "error: ", and the turn goes on. A turn runs
at most 8 rounds of tools; a model that asks a 9th time fails the turn
(502). A turn commits its user message, every tool round and the reply
together, or nothing.

--interruption decides what a turn leaves when its client disconnects
mid-turn. Under rollback and keep-consistent the turn stops at once: its
model call or lookup is cancelled, and no model call or tool run starts
after.
  rollback         nothing: the conversation is as it was before the turn
                   (the default)
  keep-consistent  the user message and the tool rounds that completed (each
                   call with all its results), committed though the client
                   is gone; never a round cut short, never a reply; nothing
                   if no round completed
  complete         the whole turn if it ends ok, nothing if it fails: it runs
                   on to its end as if the client had stayed (each model call
                   and lookup still bounded by --request-timeout), holding the
                   conversation until then; a stop waits for it like any turn
                   in flight, and one past --grace drops it (nothing kept)

--concurrency decides what happens to a request for a conversation whose
turn is still running:
  serialize  the request waits its turn, first come first served, for at
             most --request-timeout; past it, 503 conversation_busy with
             Retry-After: 1 (the default)
  reject     the request gets 409 conflict at once, before any model call,
             and nothing changes

Examples:
  turncheck model --listen 127.0.0.1:9090 &
  echo secret > keys.txt; chmod 600 keys.txt
  turncheck serve --model-url http://127.0.0.1:9090/v1 --data-dir ./data --key-file keys.txt --concurrency reject \
    --interruption keep-consistent
  curl -sS http://127.0.0.1:8080/v1/chat/completions -H 'Authorization: Bearer secret' \
    -H 'Content-Type: application/json' -H 'X-Conversation-Id: c1' \
    -d '{"model":"m","messages":[{"role":"user","content":"hi tc-u1"}]}'

  # an agent served by the fake model; the conversation names it by name
  turncheck serve --model-url http://127.0.0.1:9090/v1 --data-dir ./data \
    --agent 'http://127.0.0.1:9090/agents/helper.yaml?tag=v1'
  curl -sS http://127.0.0.1:8080/v1/chat/completions -H 'X-Conversation-Id: c2' \
    -H 'Content-Type: application/json' \
    -d '{"model":"helper","messages":[{"role":"user","content":"hi tc-u2"}]}'

  # the same server as an ACP agent on stdin and stdout: see 'turncheck serve acp --help'

  # the Responses API: the second turn chains from the first's id
  curl -sS http://127.0.0.1:8080/v1/responses -H 'Content-Type: application/json' \
    -d '{"model":"helper","input":"hi tc-u3"}'
  curl -sS http://127.0.0.1:8080/v1/responses -H 'Content-Type: application/json' \
    -d '{"model":"helper","input":"and tc-u4","previous_response_id":"resp_..."}'
`

const modelHelp = `Usage: turncheck model [--listen ADDR]

Runs the fake model provider: an OpenAI-compatible POST /v1/chat/completions
(stream or not) that answers every request with a reply carrying the reply
token of the request's last user message (tc-u7 -> tc-a7), and logs the
tokens each request carried: what the server holds for the conversation.
It also serves agent definitions, for 'turncheck serve --agent': GET
/agents/NAME.yaml answers "name: NAME" and an instruction that echoes the
request's query; and the lookup tool's results, GET /tools/lookup?key=K.
Standalone, it injects no fault: 'turncheck check' and 'turncheck conform'
run a fake model of their own, which they script to fail, hold calls, cut
streams and send malformed chunks.

Example:
  turncheck model --listen 127.0.0.1:9090
  curl -sS 'http://127.0.0.1:9090/agents/helper.yaml?tag=v1'
`

// defaultGrace is how long a stop lets the turns in flight finish: long
// enough for a model's usual reply, short enough for a supervisor's
// patience (systemd waits 90 s, Kubernetes 30 s before SIGKILL).
const defaultGrace = 10 * time.Second

// repeated is a flag that may be given several times, each value
// non-empty; what names the value in the error for an empty one.
type repeated struct {
	values []string
	what   string
}

func (r *repeated) String() string { return strings.Join(r.values, ",") }
func (r *repeated) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return fmt.Errorf("%s may not be empty", r.what)
	}
	r.values = append(r.values, v)
	return nil
}

// keysEnv names the environment variable that holds API keys,
// comma-separated: unlike --key, the environment does not show in ps.
const keysEnv = "TURNCHECK_KEYS"

func cmdServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "acp" {
		return cmdServeACP(ctx, args[1:], os.Stdin, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "a2a" {
		// The same server: its A2A endpoint and card are always served.
		args = args[1:]
	}
	fs := newFlags("serve", serveHelp, stdout, stderr)
	listen := fs.String("listen", "127.0.0.1:8080", "address to listen on (loopback by default)")
	modelURL := fs.String("model-url", "", "the model provider's OpenAI-compatible base URL (required)")
	dataDir := fs.String("data-dir", "", "directory of the durable store, a SQLite database (required without --store)")
	storeURL := fs.String("store", "", "postgres:// URL of a PostgreSQL database to keep the store in, shared by replicas (instead of --data-dir)")
	mutant := fs.String("mutant", "", "switch on a mutant (see 'turncheck mutants')")
	convMax := fs.Int("conversations-max", sut.DefaultConversationsMax, "conversations kept in the in-memory cache")
	timeout := fs.Duration("request-timeout", sut.DefaultRequestTimeout, "deadline of each model call, and of each wait for a busy conversation under serialize")
	header := fs.String("conversation-header", sut.DefaultConversationHeader, "header that names the conversation")
	concurrency := fs.String("concurrency", string(sut.Serialize), "what a request for a busy conversation gets: serialize (wait its turn) or reject (409)")
	interruption := fs.String("interruption", string(sut.Rollback), "what a turn whose client disconnects leaves: rollback (nothing), keep-consistent (its completed tool rounds) or complete (it runs to its end, then commits whole or nothing)")
	compactAfter := fs.Int("compact-after", sut.DefaultCompactAfter, "messages a turn may show the model before earlier turns' tool rounds are hidden from it")
	grace := fs.Duration("grace", defaultGrace, "on Ctrl-C or SIGTERM, how long turns in flight may take to finish before they are dropped")
	keys := &repeated{what: "a key"}
	fs.Var(keys, "key", "API key to accept as a bearer token; repeat for several (none: no auth)")
	keyFile := fs.String("key-file", "", "file of API keys to accept, one per line (# comments); adds to --key and $"+keysEnv)
	agents := &repeated{what: "an agent reference"}
	fs.Var(agents, "agent", "agent definition to load: an http(s) URL or a file; repeat for several (none: no agents)")
	hosts := &repeated{what: "a host name"}
	fs.Var(hosts, "allow-host", "a host name requests may name in their Host (and pages in their Origin) besides loopback and the listen address; repeat for several")
	headerTimeout := fs.Duration("header-timeout", sut.DefaultHeaderTimeout, "time a client has to send a request's headers")
	bodyTimeout := fs.Duration("body-timeout", sut.DefaultBodyTimeout, "time a client has to send a request's body, once its headers are in (408 past it)")
	idleTimeout := fs.Duration("idle-timeout", sut.DefaultIdleTimeout, "time a keep-alive connection may wait for its next request")
	maxConns := fs.Int("max-conns", sut.DefaultMaxConns, "client connections open at once")
	maxRequests := fs.Int("max-requests", sut.DefaultMaxRequests, "chat requests worked on at once, from the end of their body (503 past it)")
	maxStoreConns := fs.Int("max-store-conns", 0, "connections to PostgreSQL (--store), at least 2; 0: auto, one for every 20 --max-requests, at least 8")
	maxBody := fs.Int64("max-body-bytes", sut.DefaultMaxBodyBytes, "bytes of a request body (413 past it)")
	maxHistMsgs := fs.Int("max-history-messages", sut.DefaultMaxHistoryMessages, "messages of a conversation (a turn past it: 400)")
	maxHistBytes := fs.Int64("max-history-bytes", sut.DefaultMaxHistoryBytes, "bytes of a conversation's text (a turn past it: 400)")
	maxMemory := &byteSize{}
	fs.Var(maxMemory, "max-memory", "the memory budget, in `bytes`, of the cache, request bodies and turns in flight (auto: 1/4 of the machine's or the cgroup's memory; units KiB, MiB, GiB)")
	turnDelay := fs.Duration("turn-delay", 0, "wait this long before working on each chat request: a deliberately slow server, to measure what checking one costs")
	responsesLine := fs.Bool("responses-line", false, "run the Responses API as openclaw does: previous_response_id names the conversation line its response belongs to, and a turn runs on that line as it stands; an unknown id starts a new line, and store: false is ignored")
	titles := fs.Bool("titles", false, "make a title model call beside each turn, carrying the conversation's user messages, as servers that name their conversations do: an auxiliary call, never judged as the turn's history")
	stall := fs.Duration("stall", 0, "pause a random 0..this before each model call, each commit and each write to a client: a machine made slow, to show that a check's verdicts do not depend on its speed")
	if code := fs.parse(args); code >= 0 {
		return code
	}
	switch {
	case *modelURL == "":
		return fail(stderr, "serve", errors.New("--model-url is required"))
	case *dataDir == "" && *storeURL == "":
		return fail(stderr, "serve", errors.New("--data-dir is required (or --store postgres://...)"))
	case *dataDir != "" && *storeURL != "":
		return fail(stderr, "serve", errors.New("--data-dir and --store name two stores: give one"))
	case *convMax <= 0:
		return fail(stderr, "serve", errors.New("--conversations-max must be positive"))
	case *timeout <= 0:
		return fail(stderr, "serve", errors.New("--request-timeout must be positive"))
	case *grace <= 0:
		return fail(stderr, "serve", errors.New("--grace must be positive"))
	case *headerTimeout <= 0 || *bodyTimeout <= 0 || *idleTimeout <= 0:
		return fail(stderr, "serve", errors.New("--header-timeout, --body-timeout and --idle-timeout must be positive"))
	case *maxConns <= 0 || *maxRequests <= 0 || *maxBody <= 0 || *maxHistMsgs <= 0 || *maxHistBytes <= 0:
		return fail(stderr, "serve", errors.New("--max-conns, --max-requests, --max-body-bytes and --max-history-* must be positive"))
	case *maxStoreConns < 0:
		return fail(stderr, "serve", errors.New("--max-store-conns must not be negative (0: auto)"))
	case *compactAfter <= 0:
		return fail(stderr, "serve", errors.New("--compact-after must be positive"))
	case *turnDelay < 0 || *stall < 0:
		return fail(stderr, "serve", errors.New("--turn-delay and --stall must not be negative"))
	}
	if err := checkListen(*listen); err != nil {
		return fail(stderr, "serve", err)
	}
	envKeys, envSet := os.LookupEnv(keysEnv)
	allKeys, err := gatherKeys(keys.values, *keyFile, envKeys, envSet, stderr)
	if err != nil {
		return fail(stderr, "serve", err)
	}
	m, err := sut.ParseMutant(*mutant)
	if err != nil {
		return fail(stderr, "serve", err)
	}
	policy, err := sut.ParseConcurrency(*concurrency)
	if err == nil && policy == sut.Supersede {
		err = errors.New("supersede is an ACP agent's policy ('turncheck serve acp'): over HTTP, serialize or reject")
	}
	if err != nil {
		return fail(stderr, "serve", fmt.Errorf("--concurrency: %w", err))
	}
	onInterrupt, err := sut.ParseInterruption(*interruption)
	if err != nil {
		return fail(stderr, "serve", fmt.Errorf("--interruption: %w", err))
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	run, err := sut.Start(sut.Config{
		ModelURL:           *modelURL,
		DataDir:            *dataDir,
		Store:              *storeURL,
		ConversationsMax:   *convMax,
		RequestTimeout:     *timeout,
		ConversationHeader: *header,
		Concurrency:        policy,
		Interruption:       onInterrupt,
		CompactAfter:       *compactAfter,
		Keys:               allKeys,
		Agents:             agents.values,
		Mutant:             m,
		Logger:             logger,
		MaxMemory:          maxMemory.n,
		AllowedHosts:       hosts.values,
		HeaderTimeout:      *headerTimeout,
		BodyTimeout:        *bodyTimeout,
		IdleTimeout:        *idleTimeout,
		MaxConns:           *maxConns,
		MaxRequests:        *maxRequests,
		MaxStoreConns:      *maxStoreConns,
		MaxBodyBytes:       *maxBody,
		MaxHistoryMessages: *maxHistMsgs,
		MaxHistoryBytes:    *maxHistBytes,
		TurnDelay:          *turnDelay,
		Stall:              *stall,
		Titles:             *titles,
		ResponsesLine:      *responsesLine,
	}, *listen)
	if err != nil {
		return fail(stderr, "serve", err)
	}
	// The budget counts what clients and the model make the server hold;
	// the GC keeps the heap, garbage included, within the margin of what
	// the budget does not count. The old limit is back when serve returns
	// (it matters only to a process that goes on: tests).
	budget, from := run.MaxMemory(), "--max-memory"
	if maxMemory.n == 0 {
		_, from = sut.DefaultMaxMemory()
	}
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(budget + memoryMargin))
	logger.Info("memory budget", "max_memory", budget, "from", from, "gc_limit", budget+memoryMargin)
	fmt.Fprintf(stdout, "turncheck serve: listening on %s\n", run.URL())
	<-ctx.Done()
	return stopServer(run, *grace, stderr)
}

// gatherKeys returns the API keys of --key, of --key-file (one a line;
// blank lines and # comments skipped) and of $TURNCHECK_KEYS
// (comma-separated), in that order, each once. A key file or a set
// variable that holds no key is an error: auth must not be off by a
// mistake. A key file others may read gets a warning.
func gatherKeys(flagKeys []string, keyFile, env string, envSet bool, stderr io.Writer) ([]string, error) {
	all := slices.Clone(flagKeys)
	if keyFile != "" {
		f, err := os.Open(keyFile)
		if err != nil {
			return nil, fmt.Errorf("--key-file: %w", err)
		}
		defer f.Close()
		if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o077 != 0 {
			fmt.Fprintf(stderr, "turncheck serve: warning: --key-file %s can be read by others (mode %v): chmod 600 it\n", keyFile, fi.Mode().Perm())
		}
		n := len(all)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
				all = append(all, line)
			}
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("--key-file %s: %w", keyFile, err)
		}
		if len(all) == n {
			return nil, fmt.Errorf("--key-file %s holds no key", keyFile)
		}
	}
	if envSet && strings.TrimSpace(env) != "" {
		n := len(all)
		for k := range strings.SplitSeq(env, ",") {
			if k = strings.TrimSpace(k); k != "" {
				all = append(all, k)
			}
		}
		if len(all) == n {
			return nil, fmt.Errorf("$%s holds no key", keysEnv)
		}
	}
	var out []string
	for _, k := range all {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

// stopServer stops a server gracefully: turns in flight get grace to end,
// then the rest are dropped (they end as interrupted turns: their clients
// never heard they ended ok), and what is not durable yet is written. Running past the
// grace is how a stop is bounded, not a failure; only a store that does not
// close is.
func stopServer(run *sut.Running, grace time.Duration, stderr io.Writer) int {
	stopCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := run.Shutdown(stopCtx)
	if errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintf(stderr, "turncheck serve: turns still in flight after %s were dropped\n", grace)
		err = withoutDeadline(err)
	}
	if err != nil {
		fmt.Fprintf(stderr, "turncheck serve: stop: %v\n", err)
		return exitUsage
	}
	return exitOK
}

// withoutDeadline is err without the context.DeadlineExceeded that
// errors.Join put in it, or nil if that was all.
func withoutDeadline(err error) error {
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil
		}
		return err
	}
	var rest []error
	for _, e := range joined.Unwrap() {
		if e = withoutDeadline(e); e != nil {
			rest = append(rest, e)
		}
	}
	return errors.Join(rest...)
}

func cmdModel(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("model", modelHelp, stdout, stderr)
	listen := fs.String("listen", "127.0.0.1:9090", "address to listen on (loopback by default)")
	if code := fs.parse(args); code >= 0 {
		return code
	}
	if err := checkListen(*listen); err != nil {
		return fail(stderr, "model", err)
	}
	m, err := faults.StartModel(faults.ModelConfig{Addr: *listen, Log: stderr})
	if err != nil {
		return fail(stderr, "model", err)
	}
	fmt.Fprintf(stdout, "turncheck model: listening on %s (base URL %s)\n", "http://"+m.Addr(), m.URL())
	<-ctx.Done()
	_ = m.Close()
	return exitOK
}

// memoryMargin is what the process needs besides its memory budget: the
// Go runtime and the binary, SQLite's page cache, the stacks and buffers
// of up to --max-conns connections, and room for the GC to work in
// (measured: an idle server's RSS is about 20 MiB).
const memoryMargin = 32 << 20

// byteSize is a flag of a number of bytes, with an optional unit; 0 (the
// default, printed "auto") leaves the choice to the server.
type byteSize struct{ n int64 }

func (b *byteSize) String() string {
	if b == nil || b.n == 0 {
		return "auto"
	}
	return strconv.FormatInt(b.n, 10)
}

// byteUnits are the units a byteSize may carry, longest first.
var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

func (b *byteSize) Set(v string) error {
	v = strings.TrimSpace(v)
	if v == "auto" {
		b.n = 0
		return nil
	}
	num, mult := v, int64(1)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(v, u.suffix); ok {
			num, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > math.MaxInt64/mult {
		return fmt.Errorf("%q: want a positive number of bytes, such as 512MiB or 2GiB, or auto", v)
	}
	b.n = n * mult
	return nil
}

// checkListen refuses an address that is not host:port.
func checkListen(addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("--listen %q: want host:port, such as 127.0.0.1:8080", addr)
	}
	return nil
}

var _ flag.Value = (*repeated)(nil)
