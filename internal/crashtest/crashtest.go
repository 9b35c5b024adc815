// Package crashtest holds servers that go down, for the harness's own
// tests of its crash finding (PROTOCOL.md, "A server stays up") and of
// the setup errors a profile causes, and two that stay up but leak
// conversations into each other, for what the harness says after a
// first finding (PROTOCOL.md, "One root cause, one finding") and how a
// leak between checks replays. Each is the reference server with
// one defect: it panics after a streamed turn whose client went away, as
// docker-agent's "send on closed channel" does; a kill -9 leaves a lock
// behind that fails the next start once; it fails the starts it is told
// to, for the start finding (PROTOCOL.md, "A server starts"); or its
// command line takes one agent reference only. A test binary whose TestMain calls Main first
// plays one, re-executed with Env set (Profile writes the profile that
// does so); Target runs the first in process.
package crashtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turncheck/turncheck/sut"
)

// Env names the mode a re-executed test binary plays (Main).
const Env = "TURNCHECK_CRASHTEST"

// Mode is one defect of the reference server.
type Mode string

// The modes.
const (
	// PanicOnAbort panics, in a goroutine of its own, once it has served
	// a streamed turn whose client went away before the end: the process
	// exits with status 2 and the runtime's "send on closed channel".
	PanicOnAbort Mode = "panic-on-abort"
	// StaleLock holds a lock file in its data dir while it runs and
	// removes it when it is stopped: after a kill -9 the next start finds
	// it, removes it and exits with status 1, so that a crash the harness
	// draws does not come back, and the start after it does.
	StaleLock Mode = "stale-lock"
	// OneAgent takes exactly one agent reference on its command line, as
	// docker-agent's serve api does: with two it exits with status 1 and
	// a usage error before it serves.
	OneAgent Mode = "one-agent"
	// ACPExitOnEmpty is the reference server as an ACP agent (stdio,
	// loadSession advertised, durable) that exits with status 3 when it is
	// sent a session/prompt with no text in it, as an agent that
	// dereferences the prompt's first block does: the harness must restart
	// it before the run goes on, and judge nothing it could not send.
	ACPExitOnEmpty Mode = "acp-exit-on-empty"
	// ACPForgets is the reference ACP agent that advertises loadSession
	// but keeps its sessions in a directory of its own run, new at each
	// start: after a restart, session/load is refused (not found), as an
	// agent that keeps sessions in memory refuses it. Its profile declares
	// it durable: T7, and nothing else, is its finding.
	ACPForgets Mode = "acp-forgets"
	// FailStarts fails the starts StartsEnv lists, each counted across
	// every process its profile starts (StartsProfile): such a start
	// exits with status 3 before it listens, saying so, as a gateway that
	// fails to start under load does; every other start serves as the
	// reference server.
	FailStarts Mode = "fail-starts"
	// SharedHistory keeps every conversation in one history, as a server
	// whose sessions share one list does: it stays up, and leaks each
	// conversation into every other (T5), across the checks of a run
	// too, which share the process.
	SharedHistory Mode = "shared-history"
	// ShortIDs names a conversation by the last six characters of its
	// id (ShortenIDs), as a server that keeps ids that short does: one
	// check's conversations stay apart, but the harness's namespace goes,
	// and two checks' conversations of one name ("conv-1") are one on
	// the process the run's checks share. A leak between checks alone.
	ShortIDs Mode = "short-ids"
)

// StartsEnv names the starts FailStarts fails: numbers from 1, by commas
// ("1,2": its first two starts), and N- for the N-th and every one after
// ("4-"). CountEnv names the directory its starts are counted in.
const (
	StartsEnv = "TURNCHECK_CRASHTEST_FAIL_STARTS"
	CountEnv  = "TURNCHECK_CRASHTEST_STARTS_DIR"
)

// ShortenIDs serves h with each conversation id (X-Conversation-Id) cut
// to its last six characters, as ShortIDs does: in process too, for a
// target that shares its server among a run's checks.
func ShortenIDs(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("X-Conversation-Id"); len(id) > 6 {
			r.Header.Set("X-Conversation-Id", id[len(id)-6:])
		}
		h.ServeHTTP(w, r)
	})
}

// Main plays the server of the mode Env names, when it is set, and never
// returns then: the test binary is re-executed with {addr}, {model_url},
// {data_dir} and the agent references as its arguments. Call it first in
// TestMain.
func Main() {
	mode := os.Getenv(Env)
	if mode == "" {
		return
	}
	os.Exit(serve(Mode(mode), os.Args[1:]))
}

// Profile writes a profile (YAML) that starts this test binary as the
// server of mode m, and returns its path: durable across restarts and
// crashes, with the agent helper for OneAgent (which does not say that it
// loads one source at a time: that is the setup error it shows).
func Profile(tb testing.TB, m Mode) string {
	tb.Helper()
	return ProfileWith(tb, m)
}

// ProfileWith is Profile, with more lines in the profile's server
// section ("start_tries: 2"); not for the ACP modes.
func ProfileWith(tb testing.TB, m Mode, server ...string) string {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	// A new conversation binds to the agent by its name, the model's
	// default; without one, any model name serves.
	agent, model := "", "\nmodel: turncheck"
	if m == OneAgent {
		agent, model = "\n  agent: helper", ""
	}
	if m == ACPExitOnEmpty || m == ACPForgets {
		yaml := fmt.Sprintf(`server:
  command: [%q, acp, "{model_url}", "{data_dir}", "{agents}"]
  env: {%s: %s}
  agent: helper
  stop_grace: 2s
  ready: {timeout: 30s}
protocol: acp
model_timeout: 1s
policies:
  interruption: rollback
  durability: {restart: true, crash: true}
`, exe, Env, m)
		return writeProfile(tb, m, yaml)
	}
	for _, line := range server {
		agent += "\n  " + line
	}
	yaml := fmt.Sprintf(`server:
  command: [%q, "{addr}", "{model_url}", "{data_dir}", "{agents}"]
  env: {%s: %s}%s
  stop_grace: 2s
  ready: {timeout: 30s}%s
model_timeout: 1s
policies:
  durability: {restart: true, crash: true}
`, exe, Env, m, agent, model)
	return writeProfile(tb, m, yaml)
}

// StartsProfile writes a profile (YAML) that starts this test binary as
// FailStarts's server, failing the starts fail names (StartsEnv), and
// returns its path. Its starts are counted in a directory of tb's,
// whatever process makes them: the first start, one for each check
// (server lines "fresh_per_check: true"), restarts. durable declares
// that committed turns survive a restart and a crash, so that the
// harness draws them, never rationed whatever the machine's speed
// (restart_share: 1); server are more lines of its server section
// ("start_tries: 2").
func StartsProfile(tb testing.TB, fail string, durable bool, server ...string) string {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	policies := ""
	if durable {
		policies = "\npolicies:\n  durability: {restart: true, crash: true}"
		server = append(server, "restart_share: 1")
	}
	extra := ""
	for _, line := range server {
		extra += "\n  " + line
	}
	yaml := fmt.Sprintf(`server:
  command: [%q, "{addr}", "{model_url}", "{data_dir}", "{agents}"]
  env: {%s: %s, %s: %q, %s: %q}
  stop_grace: 2s
  ready: {timeout: 30s}%s
model: turncheck
model_timeout: 1s%s
`, exe, Env, FailStarts, StartsEnv, fail, CountEnv, tb.TempDir(), extra, policies)
	return writeProfile(tb, FailStarts, yaml)
}

// Starts is how many starts FailStarts's servers made under the profile
// at path (StartsProfile), the failed ones included.
func Starts(tb testing.TB, path string) int {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	_, dir, ok := strings.Cut(string(b), CountEnv+": ")
	if !ok {
		tb.Fatalf("%s is no profile of FailStarts", path)
	}
	dir, err = strconv.Unquote(strings.SplitN(dir, "}", 2)[0])
	if err != nil {
		tb.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return len(entries)
}

// countStart counts a start in dir and returns its number, from 1: the
// first name start-N that this process creates, which no other can
// create too (O_EXCL), whatever starts at once.
func countStart(dir string) (int, error) {
	for n := 1; ; n++ {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("start-%d", n)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		return n, f.Close()
	}
}

// fails reports whether spec (StartsEnv) names start n.
func fails(spec string, n int) bool {
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if from, ok := strings.CutSuffix(part, "-"); ok {
			if k, err := strconv.Atoi(from); err == nil && n >= k {
				return true
			}
			continue
		}
		if k, err := strconv.Atoi(part); err == nil && n == k {
			return true
		}
	}
	return false
}

// writeProfile writes yaml as mode m's profile in a temp dir of tb's.
func writeProfile(tb testing.TB, m Mode, yaml string) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), string(m)+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		tb.Fatal(err)
	}
	return path
}

// lockFile is StaleLock's lock, in its data dir.
const lockFile = "LOCK"

// serve runs mode's server with args, and returns its exit status.
func serve(mode Mode, args []string) int {
	if len(args) < 3 {
		fmt.Fprintf(os.Stderr, "crashtest: want addr, model URL, data dir and agent references; got %q\n", args)
		return 2
	}
	addr, modelURL, dataDir, agents := args[0], args[1], args[2], args[3:]
	switch mode {
	case OneAgent:
		if len(agents) != 1 {
			fmt.Fprintf(os.Stderr, "Error: accepts 1 arg(s), received %d\nUsage:\n  crashtest AGENT [flags]\n", len(agents))
			return 1
		}
	case StaleLock:
		lock := filepath.Join(dataDir, lockFile)
		if _, err := os.Stat(lock); err == nil {
			// As a server that finds its store locked by a run that died:
			// it clears the lock, and fails this start.
			fmt.Fprintf(os.Stderr, "crashtest: the store is locked by an earlier run (%s); removed the stale lock, start again\n", lock)
			_ = os.Remove(lock)
			return 1
		}
		if err := os.WriteFile(lock, []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "crashtest:", err)
			return 2
		}
	case FailStarts:
		n, err := countStart(os.Getenv(CountEnv))
		if err != nil {
			fmt.Fprintln(os.Stderr, "crashtest:", err)
			return 2
		}
		if fails(os.Getenv(StartsEnv), n) {
			fmt.Fprintf(os.Stderr, "crashtest: start %d: the gateway failed to start (%s=%s)\n", n, StartsEnv, os.Getenv(StartsEnv))
			return 3
		}
	case PanicOnAbort, SharedHistory, ShortIDs:
	case ACPExitOnEmpty:
		return serveACP(modelURL, dataDir, agents, true)
	case ACPForgets:
		// A directory of this run's own, in the data dir the harness
		// removes: a kill -9 leaves nothing behind elsewhere.
		own := filepath.Join(dataDir, fmt.Sprintf("run-%d", os.Getpid()))
		if err := os.Mkdir(own, 0o700); err != nil {
			fmt.Fprintln(os.Stderr, "crashtest:", err)
			return 2
		}
		return serveACP(modelURL, own, agents, false)
	default:
		fmt.Fprintf(os.Stderr, "crashtest: unknown mode %q\n", mode)
		return 2
	}
	srv, err := sut.New(sut.Config{ModelURL: modelURL, DataDir: dataDir, RequestTimeout: time.Second, Agents: agents})
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashtest:", err)
		return 2
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashtest:", err)
		return 2
	}
	var h http.Handler = srv
	switch mode {
	case PanicOnAbort:
		h = panicOnAbort(srv)
	case SharedHistory:
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Conversation-Id") != "" {
				r.Header.Set("X-Conversation-Id", "shared")
			}
			srv.ServeHTTP(w, r)
		})
	case ShortIDs:
		h = ShortenIDs(srv)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() { _ = http.Serve(ln, h) }()
	<-term
	_ = ln.Close()
	err = srv.Close()
	_ = os.Remove(filepath.Join(dataDir, lockFile))
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashtest:", err)
		return 1
	}
	return 0
}

// panicOnAbort serves h, and once it has served a streamed request whose
// client went away before the stream ended, sends on a closed channel in
// a goroutine of its own: the runtime's panic ends the process.
func panicOnAbort(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		streamed := Streamed(r)
		ended := &endWriter{ResponseWriter: w}
		w = ended
		defer func() {
			if streamed && !ended.done && r.Context().Err() != nil {
				go func() {
					events := make(chan string)
					close(events)
					events <- "stream ended" // panics: send on closed channel
				}()
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// endWriter is a ResponseWriter that notes whether what was written so
// far ends a stream ("data: [DONE]"): a client gone after that left a
// stream that ended, not one cut short.
type endWriter struct {
	http.ResponseWriter
	done bool
}

func (e *endWriter) Write(b []byte) (int, error) {
	e.done = bytes.HasSuffix(bytes.TrimRight(b, "\n"), []byte("data: [DONE]"))
	return e.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController flush the stream.
func (e *endWriter) Unwrap() http.ResponseWriter { return e.ResponseWriter }

// Streamed reports whether r asks for a streamed answer ("stream": true
// in its JSON body), leaving its body to be read again.
func Streamed(r *http.Request) bool {
	if r.Body == nil {
		return false
	}
	body, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return false
	}
	var req struct {
		Stream bool `json:"stream"`
	}
	return json.Unmarshal(body, &req) == nil && req.Stream
}

// errDied is what an in-process server that died says it did.
var errDied = errors.New("exited with status 2")

// panicText is what an in-process server that dies writes last, as the Go
// runtime would.
var panicText = strings.Join([]string{
	"panic: send on closed channel",
	"",
	"goroutine 41 [running]:",
	"github.com/turncheck/turncheck/internal/crashtest.panicOnAbort.func1.1()",
	"exit status 2",
}, "\n")

// serveACP plays the reference ACP agent on stdin and stdout, on
// dataDir; where exitOnEmpty (ACPExitOnEmpty), behind a reader that exits
// the process when a session/prompt carries no text.
func serveACP(modelURL, dataDir string, agents []string, exitOnEmpty bool) int {
	in, toAgent := io.Pipe()
	go func() {
		rd := bufio.NewReader(os.Stdin)
		for {
			line, err := rd.ReadBytes('\n')
			if exitOnEmpty && emptyPrompt(line) {
				fmt.Fprintln(os.Stderr, "panic: runtime error: index out of range [0] with length 0 (an empty prompt)")
				os.Exit(3)
			}
			if _, werr := toAgent.Write(line); werr != nil || err != nil {
				_ = toAgent.CloseWithError(err)
				return
			}
		}
	}()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err := sut.ServeACP(ctx, sut.Config{ModelURL: modelURL, DataDir: dataDir, RequestTimeout: time.Second, Agents: agents,
		Interruption: sut.Rollback}, in, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashtest:", err)
		return 1
	}
	return 0
}

// emptyPrompt reports whether line is a session/prompt whose prompt holds
// no text.
func emptyPrompt(line []byte) bool {
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Prompt []struct {
				Text string `json:"text"`
			} `json:"prompt"`
		} `json:"params"`
	}
	if json.Unmarshal(line, &msg) != nil || msg.Method != "session/prompt" {
		return false
	}
	for _, b := range msg.Params.Prompt {
		if strings.TrimSpace(b.Text) != "" {
			return false
		}
	}
	return true
}
