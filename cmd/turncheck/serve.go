package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/sut"
)

const serveHelp = `Usage: turncheck serve --model-url URL --data-dir DIR [flags]

Runs the reference session server: POST /v1/chat/completions, with the
conversation named by the X-Conversation-Id header kept server-side in a
SQLite store under --data-dir. It prints the address it listens on. On
Ctrl-C or SIGTERM it stops listening, lets the turns in flight end for at
most --grace (then drops the rest, which roll back), and exits 0.

--agent loads an agent definition at start-up, from an http(s) URL or a
file: YAML with a "name" and an "instruction" (no other field). Repeat it
for several. A new conversation binds to the agent its request's "model"
names (the reference exactly, the reference without its query, or the
agent's name; several matches: 409, none: 404) and records the reference;
a resumed one keeps its agent, found after a relaunch under a changed query
by the reference without its query (several such: 409, nothing changes).
The agent's instruction is the system message of the conversation's every
model call.

--concurrency decides what happens to a request for a conversation whose
turn is still running:
  serialize  the request waits its turn, first come first served, for at
             most --request-timeout; past it, 503 conversation_busy with
             Retry-After: 1 (the default)
  reject     the request gets 409 conflict at once, before any model call,
             and nothing changes

Examples:
  turncheck model --listen 127.0.0.1:9090 &
  turncheck serve --model-url http://127.0.0.1:9090/v1 --data-dir ./data --key secret --concurrency reject
  curl -sS http://127.0.0.1:8080/v1/chat/completions -H 'Authorization: Bearer secret' \
    -H 'X-Conversation-Id: c1' -d '{"model":"m","messages":[{"role":"user","content":"hi tc-u1"}]}'

  # an agent served by the fake model; the conversation names it by name
  turncheck serve --model-url http://127.0.0.1:9090/v1 --data-dir ./data \
    --agent 'http://127.0.0.1:9090/agents/helper.yaml?tag=v1'
  curl -sS http://127.0.0.1:8080/v1/chat/completions -H 'X-Conversation-Id: c2' \
    -d '{"model":"helper","messages":[{"role":"user","content":"hi tc-u2"}]}'
`

const modelHelp = `Usage: turncheck model [--listen ADDR]

Runs the fake model provider: an OpenAI-compatible POST /v1/chat/completions
(stream or not) that answers every request with a reply carrying the reply
token of the request's last user message (tc-u7 -> tc-a7), and logs the
tokens each request carried: what the server holds for the conversation.
It also serves agent definitions, for 'turncheck serve --agent': GET
/agents/NAME.yaml answers "name: NAME" and an instruction that echoes the
request's query. Faults are injected only by 'turncheck check'.

Example:
  turncheck model --listen 127.0.0.1:9090
  curl -sS 'http://127.0.0.1:9090/agents/helper.yaml?tag=v1'
`

// defaultGrace is how long a stop lets the turns in flight finish: long
// enough for a model's usual reply, short enough for a supervisor's
// patience (systemd waits 90 s, Kubernetes 30 s before SIGKILL).
const defaultGrace = 10 * time.Second

// keyList is a repeatable --key flag.
type keyList []string

func (k *keyList) String() string { return strings.Join(*k, ",") }
func (k *keyList) Set(v string) error {
	if v == "" {
		return errors.New("a key may not be empty")
	}
	*k = append(*k, v)
	return nil
}

// agentList is a repeatable --agent flag.
type agentList []string

func (a *agentList) String() string { return strings.Join(*a, " ") }
func (a *agentList) Set(v string) error {
	if strings.TrimSpace(v) == "" {
		return errors.New("an agent reference may not be empty")
	}
	*a = append(*a, v)
	return nil
}

func cmdServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("serve", serveHelp, stdout, stderr)
	listen := fs.String("listen", "127.0.0.1:8080", "address to listen on (loopback by default)")
	modelURL := fs.String("model-url", "", "the model provider's OpenAI-compatible base URL (required)")
	dataDir := fs.String("data-dir", "", "directory of the durable store (required)")
	mutant := fs.String("mutant", "", "switch on a mutant (see 'turncheck mutants')")
	convMax := fs.Int("conversations-max", sut.DefaultConversationsMax, "conversations kept in the in-memory cache")
	timeout := fs.Duration("request-timeout", sut.DefaultRequestTimeout, "deadline of each model call, and of each wait for a busy conversation under serialize")
	header := fs.String("conversation-header", sut.DefaultConversationHeader, "header that names the conversation")
	concurrency := fs.String("concurrency", string(sut.Serialize), "what a request for a busy conversation gets: serialize (wait its turn) or reject (409)")
	grace := fs.Duration("grace", defaultGrace, "on Ctrl-C or SIGTERM, how long turns in flight may take to finish before they are dropped")
	var keys keyList
	fs.Var(&keys, "key", "API key to accept as a bearer token; repeat for several (none: no auth)")
	var agents agentList
	fs.Var(&agents, "agent", "agent definition to load: an http(s) URL or a file; repeat for several (none: no agents)")
	if code := fs.parse(args); code >= 0 {
		return code
	}
	switch {
	case *modelURL == "":
		return fail(stderr, "serve", errors.New("--model-url is required"))
	case *dataDir == "":
		return fail(stderr, "serve", errors.New("--data-dir is required"))
	case *convMax <= 0:
		return fail(stderr, "serve", errors.New("--conversations-max must be positive"))
	case *timeout <= 0:
		return fail(stderr, "serve", errors.New("--request-timeout must be positive"))
	case *grace <= 0:
		return fail(stderr, "serve", errors.New("--grace must be positive"))
	}
	if err := checkListen(*listen); err != nil {
		return fail(stderr, "serve", err)
	}
	m, err := sut.ParseMutant(*mutant)
	if err != nil {
		return fail(stderr, "serve", err)
	}
	policy, err := sut.ParseConcurrency(*concurrency)
	if err != nil {
		return fail(stderr, "serve", fmt.Errorf("--concurrency: %w", err))
	}
	run, err := sut.Start(sut.Config{
		ModelURL:           *modelURL,
		DataDir:            *dataDir,
		ConversationsMax:   *convMax,
		RequestTimeout:     *timeout,
		ConversationHeader: *header,
		Concurrency:        policy,
		Keys:               keys,
		Agents:             agents,
		Mutant:             m,
		Logger:             slog.New(slog.NewTextHandler(stderr, nil)),
	}, *listen)
	if err != nil {
		return fail(stderr, "serve", err)
	}
	fmt.Fprintf(stdout, "turncheck serve: listening on %s\n", run.URL())
	<-ctx.Done()
	return stopServer(run, *grace, stderr)
}

// stopServer stops a server gracefully: turns in flight get grace to end,
// then the rest are dropped (they roll back: their clients never heard
// they ended ok), and what is not durable yet is written. Running past the
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

var _ flag.Value = (*agentList)(nil)

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

// checkListen refuses an address that is not host:port.
func checkListen(addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("--listen %q: want host:port, such as 127.0.0.1:8080", addr)
	}
	return nil
}

var _ flag.Value = (*keyList)(nil)
