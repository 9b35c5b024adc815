package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/crashtest"
	"github.com/turncheck/turncheck/internal/procs"
	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/internal/tmpfs"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// TestMain fails the tests on a leaked goroutine, and on a server process
// that outlived them. Started as a flooder (floodEnv), the binary floods
// instead; as a hog (hogEnv), it spins; as a server that goes down
// (crashtest.Env), it serves.
func TestMain(m *testing.M) {
	tmpfs.Use() // its servers' data dirs in memory
	crashtest.Main()
	if spec := os.Getenv(floodEnv); spec != "" {
		os.Exit(flooder(spec))
	}
	if os.Getenv(hogEnv) != "" {
		os.Exit(hog())
	}
	procs.WaitBound(3)
	goleak.VerifyTestMain(procs.Checked(m))
}

// outOfTheWay is args of a run of check or conform with results kept in
// a temporary directory unless args say where (--out): never in the
// package's, nor the repository's.
func outOfTheWay(t *testing.T, args []string) []string {
	if len(args) > 0 && slices.Contains([]string{"check", "self-check", "conform"}, args[0]) && !slices.Contains(args, "--out") {
		return append(slices.Clone(args), "--out", t.TempDir())
	}
	return args
}

// runIn runs the turncheck binary bin with args in dir, as a user would
// from there, and returns its exit status and output: tests that need a
// working directory of their own run at once with the others, where
// t.Chdir would make them run alone.
func runIn(t *testing.T, dir, bin string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), stdout.String(), stderr.String()
	}
	require.NoError(t, err, "turncheck %s did not run", strings.Join(args, " "))
	return 0, stdout.String(), stderr.String()
}

// runCLI runs the CLI with args and returns its exit status and output.
// A run of check or conform keeps its results in a temporary directory
// unless args say where (--out): never in the package's.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	args = outOfTheWay(t, args)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestUsageErrorsExit2(t *testing.T) {
	code, _, stderr := runCLI(t)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "Usage:")
	for _, args := range [][]string{
		{"bogus"},
		{"check", "--bogus"},
		{"check", "--mutant", "no-such-mutant"},
		{"check", "--checks", "0"},
		{"check", "--concurrency", "sometimes"},
		{"check", "extra-arg"},
		{"replay"},
		{"replay", "no-such-file.json"},
		{"replay", "a.json", "--seed", "1"},
		{"replay", "a.json", "b.json"},
		{"serve"},
		{"serve", "--model-url", "http://127.0.0.1:1/v1"},
		{"serve", "--data-dir", t.TempDir()},
		{"serve", "--model-url", "ftp://x", "--data-dir", t.TempDir()},
		{"serve", "--model-url", "http://127.0.0.1:1/v1", "--data-dir", t.TempDir(), "--listen", "nonsense"},
		{"serve", "--model-url", "http://127.0.0.1:1/v1", "--data-dir", t.TempDir(), "--store", "postgres://127.0.0.1:1/db"},
		{"serve", "--model-url", "http://127.0.0.1:1/v1", "--store", "mysql://127.0.0.1:1/db", "--listen", "127.0.0.1:0"},
		{"model", "--listen", "nonsense"},
	} {
		code, _, stderr := runCLI(t, args...)
		assert.Equal(t, exitUsage, code, "turncheck %s", strings.Join(args, " "))
		assert.NotEmpty(t, stderr, "turncheck %s says nothing", strings.Join(args, " "))
		assert.Equal(t, 1, strings.Count(stderr, "\n"), "turncheck %s: want a one-line error, got %q", strings.Join(args, " "), stderr)
		assert.NotContains(t, stderr, "panic", "turncheck %s", strings.Join(args, " "))
	}
}

func TestUnwritableDataDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	code, _, stderr := runCLI(t, "serve", "--model-url", "http://127.0.0.1:1/v1", "--data-dir", filepath.Join(file, "data"), "--listen", "127.0.0.1:0")
	assert.Equal(t, exitUsage, code)
	assert.Equal(t, 1, strings.Count(strings.TrimSpace(stderr), "\n")+1, "want a one-line error, got %q", stderr)
	assert.Contains(t, stderr, "data dir")
}

func TestHelpTeaches(t *testing.T) {
	code, stdout, _ := runCLI(t, "--help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "Examples:")
	for _, cmd := range []string{"check", "replay", "serve", "model", "mutants"} {
		code, stdout, _ := runCLI(t, cmd, "--help")
		assert.Equal(t, exitOK, code, cmd)
		assert.Contains(t, stdout, "Usage: turncheck "+cmd, cmd)
		assert.Contains(t, stdout, "xample", cmd)
	}
	code, stdout, _ = runCLI(t, "version", "--help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "Usage: turncheck version", "version --help says what version does, not the version")
}

// TestHelpSaysWhatItDoes: each command's help says what the command does
// today: the protocols and shapes of server conform reaches, check's exit
// statuses, that the standalone model injects nothing (check and conform
// run their own), where the mutants of replicas are caught.
func TestHelpSaysWhatItDoes(t *testing.T) {
	for cmd, wants := range map[string][]string{
		"":        {"replicas", "front"},
		"conform": {"server.replicas: N", "server.front", "profiles/"},
		"check":   {"Exit status: 0", "crash finding", "Ctrl-C"},
		"model":   {"/tools/lookup", "injects no fault", "'turncheck conform'"},
		"mutants": {"profiles/reference-replicas.yaml"},
		"merge":   {"Exit status:"},
	} {
		args := []string{"--help"}
		if cmd != "" {
			args = []string{cmd, "--help"}
		}
		code, stdout, _ := runCLI(t, args...)
		require.Equal(t, exitOK, code, cmd)
		for _, want := range wants {
			assert.Contains(t, stdout, want, "turncheck %s --help", cmd)
		}
	}
}

// TestOneListOfProtocols: every help text that names the protocols names
// each of the one registry's (targets.Protocols), as do the error for one
// that is none of them and the documents a person reads; check reaches
// the reference server through each.
func TestOneListOfProtocols(t *testing.T) {
	for _, cmd := range []string{"", "conform", "check"} {
		args := []string{"--help"}
		if cmd != "" {
			args = []string{cmd, "--help"}
		}
		code, stdout, _ := runCLI(t, args...)
		require.Equal(t, exitOK, code, cmd)
		for _, p := range targets.Protocols {
			assert.Contains(t, stdout, fmt.Sprintf("  %-10s %s\n", p.Name, p.Says), "turncheck %s --help", cmd)
		}
		assert.NotContains(t, stdout, "{protocol", "turncheck %s --help", cmd)
	}
	names := targets.ProtocolNames()
	code, _, stderr := runCLI(t, "check", "--protocol", "grpc")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, `--protocol: "grpc"; want `+names)
	_, err := scenarios.ParseProfile([]byte("url: http://127.0.0.1:1\nprotocol: grpc\n"))
	assert.ErrorContains(t, err, `protocol: "grpc"; want `+names)
	commands, err := os.ReadFile("../../docs/commands.md")
	require.NoError(t, err)
	assert.Contains(t, string(commands), "[--protocol "+strings.ReplaceAll(strings.ReplaceAll(names, ", ", `\|`), " or ", `\|`)+"]", "docs/commands.md: check's --protocol")
	for _, doc := range []string{"../../README.md", "../../docs/checks.md", "../../profiles/README.md", "../../PROTOCOL.md"} {
		text, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, p := range targets.Protocols {
			assert.Contains(t, string(text), "`"+string(p.Name)+"`", "%s names no protocol %s", doc, p.Name)
		}
	}
	for _, p := range []targets.Protocol{targets.ACP, targets.A2A} {
		code, stdout, stderr := runCLI(t, "check", "--protocol", string(p), "--checks", "1", "--steps", "5", "--seed", "1", "--out", t.TempDir())
		assert.Equal(t, exitOK, code, stdout+stderr)
		assert.Contains(t, stdout, "protocol "+string(p)+", seed 1")
	}
}

// TestSelfCheckIsCheck: self-check, the name that says which server it
// checks, runs check.
func TestSelfCheckIsCheck(t *testing.T) {
	code, stdout, stderr := runCLI(t, "self-check", "--checks", "2", "--seed", "1")
	require.Equal(t, exitOK, code, stdout+stderr)
	assert.Contains(t, stdout, "turncheck check: reference server")
	code, stdout, _ = runCLI(t, "self-check", "--help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "Usage: turncheck check")
}

func TestMutantsLists(t *testing.T) {
	code, stdout, _ := runCLI(t, "mutants", "--list")
	require.Equal(t, exitOK, code)
	for _, name := range []string{"mutate-before-run", "replay-without-user", "commit-on-stream-error", "cross-key-leak",
		"fork-new-session", "no-conversation-lock", "#2890", "#2947", "#84575"} {
		assert.Contains(t, stdout, name)
	}
}

// TestTrackRecord: the mutants named are run after the clean server, a
// row each, as a table and as JSON: the clean server passes and each
// mutant is caught as the invariant its bug breaks. One mutant of each
// protocol (chat, Responses, sessions, ACP, A2A) shows the command's
// work; that every mutant is caught is TestMutantsCaught's (selfcheck).
// The seed is fixed: whether a few checks reach a bug is the search's
// luck, not the command's behaviour.
func TestTrackRecord(t *testing.T) {
	t.Parallel()
	named := []sut.Mutant{sut.ReplayWithoutUser, sut.FailedResponseChainable, sut.SessionEmptyRuns, sut.ACPLoadDiffers,
		sut.A2ATaskRerun, sut.ReplicaLocalLock}
	args := []string{"mutants", "--checks", "6", "--seed", "1", "--shrink-time", "200ms", "--json"}
	for _, m := range named {
		args = append(args, string(m))
	}
	code, stdout, stderr := runCLI(t, args...)
	require.Equal(t, exitOK, code, stdout+stderr)
	var rows []trackRow
	require.NoError(t, json.Unmarshal([]byte(stdout), &rows))
	// The mutant of replicas is caught through a replicated profile
	// (TestConformMutantsThroughProfile), not in process: it is named
	// as such, and has no row.
	assert.Contains(t, stderr, string(sut.ReplicaLocalLock))
	require.Len(t, rows, len(named), "the clean server and each mutant named but the replicas' one")
	assert.Equal(t, "none", rows[0].Mutant)
	assert.True(t, rows[0].Passed, "the clean server")
	caught := map[string]trackRow{}
	for _, r := range rows[1:] {
		assert.True(t, r.Caught, r.Mutant)
		assert.Contains(t, r.Reproduce, "--mutant "+r.Mutant)
		caught[r.Mutant] = r
	}
	for _, m := range sut.Mutants() {
		if !slices.Contains(named, m.Mutant) || m.Replicas > 0 {
			continue
		}
		r, ok := caught[string(m.Mutant)]
		if assert.True(t, ok, "no row for %s", m.Mutant) {
			assert.Contains(t, namedAs(m), r.Invariant, m.Mutant)
		}
	}

	code, _, stderr = runCLI(t, "mutants", "--checks", "1", string(sut.ReplayWithoutUser), "no-such-bug")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "no mutant named no-such-bug")
}

func TestCheckPassesOnCleanServer(t *testing.T) {
	code, stdout, stderr := runCLI(t, "check", "--checks", "5")
	require.Equal(t, exitOK, code, stdout+stderr)
	assert.Contains(t, stdout, "PASS")
	assert.Contains(t, stdout, "faults injected:")
	assert.Contains(t, stdout, "invariants checked:")
}

var replayLine = regexp.MustCompile(`replay: (?:turncheck|go run \./cmd/turncheck) replay (\S+\.json)`)

// TestCheckCatchesAndReplays: a mutant exits 1 with a report, saves the
// failure, and the saved file replays to identical output twice in a row.
func TestCheckCatchesAndReplays(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := runCLI(t, "check", "--mutant", "replay-without-user", "--checks", "50", "--seed", "1", "--shrink-time", "2s",
		"--save", dir)
	require.Equal(t, exitViolation, code, stdout+stderr)
	assert.Contains(t, stdout, "FAIL: T3 (no replay) broken")
	assert.Contains(t, stdout, "curl -sS")
	m := replayLine.FindStringSubmatch(stdout)
	require.NotNil(t, m, "no replay command in:\n%s", stdout)
	assert.FileExists(t, strings.TrimSuffix(m[1], ".json")+".html")

	code, first, stderr := runCLI(t, "replay", m[1])
	require.Equal(t, exitViolation, code, first+stderr)
	assert.Contains(t, first, "FAIL: T3 (no replay) broken")
	_, again, _ := runCLI(t, "replay", m[1])
	assert.Equal(t, scrubPorts(first), scrubPorts(again), "a saved failure replays to the same output")

	// A damaged file is a one-line error, never a panic.
	saved, err := os.ReadFile(m[1])
	require.NoError(t, err)
	damaged := filepath.Join(dir, "damaged.json")
	require.NoError(t, os.WriteFile(damaged, regexp.MustCompile(`"release": \[[^\]]*\]`).ReplaceAll(saved, []byte(`"release": [7]`)), 0o644))
	code, _, stderr = runCLI(t, "replay", damaged)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "release order")
	assert.Equal(t, 1, strings.Count(stderr, "\n"), stderr)
}

// TestCheckUnderReject: the policy reaches the server, and the clean
// server passes under it.
func TestCheckUnderReject(t *testing.T) {
	code, stdout, stderr := runCLI(t, "check", "--concurrency", "reject", "--checks", "5")
	require.Equal(t, exitOK, code, stdout+stderr)
	assert.Contains(t, stdout, "concurrency reject")
}

// scrubPorts blanks loopback ports, which differ from run to run.
func scrubPorts(s string) string {
	return regexp.MustCompile(`127\.0\.0\.1:\d+`).ReplaceAllString(s, "127.0.0.1:PORT")
}

// TestReports: --json, --junit and --html write the report, pass or fail,
// and the JSON one is what replay reads.
func TestReports(t *testing.T) {
	dir := t.TempDir()
	js, junit, page := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.xml"), filepath.Join(dir, "r.html")
	code, stdout, stderr := runCLI(t, "check", "--concurrency", "reject", "--mutant", "no-conversation-lock",
		"--shrink-time", "2s", "--save", "", "--json", js, "--junit", junit, "--html", page)
	require.Equal(t, exitViolation, code, stdout+stderr)
	assert.Contains(t, stdout, "FAIL: T4 (one conversation, one line) broken")
	xmlReport, err := os.ReadFile(junit)
	require.NoError(t, err)
	assert.Contains(t, string(xmlReport), `<failure message="T4 (one conversation, one line) violated`)
	assert.Contains(t, string(xmlReport), `name="T3 no replay"`)
	html, err := os.ReadFile(page)
	require.NoError(t, err)
	assert.True(t, strings.Contains(string(html), `id="violating-step"`), "the page marks no violating step")

	code, stdout, stderr = runCLI(t, "replay", js)
	require.Equal(t, exitViolation, code, stdout+stderr)
	assert.Contains(t, stdout, "concurrency reject")

	code, stdout, stderr = runCLI(t, "check", "--checks", "3", "--junit", junit)
	require.Equal(t, exitOK, code, stdout+stderr)
	xmlReport, err = os.ReadFile(junit)
	require.NoError(t, err)
	assert.Contains(t, string(xmlReport), `failures="0"`)
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// startCommand runs a long-running command until the returned stop is
// called, and returns the URL it printed.
func startCommand(t *testing.T, args ...string) (url string, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &stdout, &stderr) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := listening.FindStringSubmatch(stdout.String()); m != nil {
			url = m[1]
			break
		}
		select {
		case code := <-done:
			cancel()
			t.Fatalf("turncheck %v exited %d before listening: %s", args, code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("turncheck %v did not print its address", args)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return url, func() int { cancel(); return <-done }
}

// TestServeAndModel runs the two servers as a person would, sends a turn
// through them, and stops them.
func TestServeAndModel(t *testing.T) {
	modelURL, stopModel := startCommand(t, "model", "--listen", "127.0.0.1:0")
	serverURL, stopServer := startCommand(t, "serve", "--listen", "127.0.0.1:0",
		"--model-url", modelURL+"/v1", "--data-dir", t.TempDir(), "--key", "k1")

	client := &http.Client{Timeout: 10 * time.Second}
	send := func(msg string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, serverURL+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"`+msg+`"}]}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer k1")
		req.Header.Set("X-Conversation-Id", "c1")
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := send("hello tc-u1")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "tc-a1")
	code, body = send("again tc-u2")
	assert.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "tc-a2")
	client.CloseIdleConnections()

	assert.Equal(t, exitOK, stopServer())
	assert.Equal(t, exitOK, stopModel())
}

// serveTurn sends one non-stream turn on conversation conv to a server
// started by 'turncheck serve', naming modelName.
func serveTurn(client *http.Client, serverURL, conv, modelName, text string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, serverURL+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+modelName+`","messages":[{"role":"user","content":"`+text+`"}]}`))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("X-Conversation-Id", conv)
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// startFakeModel starts a fake model the test closes when it ends.
func startFakeModel(t *testing.T) *faults.Model {
	t.Helper()
	m, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// awaitNotListening waits until nothing accepts connections at url's
// address: the server has begun to stop.
func awaitNotListening(t *testing.T, url string) {
	t.Helper()
	addr := strings.TrimPrefix(url, "http://")
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	}, 10*time.Second, 5*time.Millisecond, "the server never stopped listening")
}

// TestServeStopDrainsTurnsInFlight: on a stop (Ctrl-C, SIGTERM) the server
// stops listening, lets a turn in flight finish and commit, and exits 0.
func TestServeStopDrainsTurnsInFlight(t *testing.T) {
	m := startFakeModel(t)
	dir := t.TempDir()
	gate := m.Gate("tc-u1")
	serverURL, stop := startCommand(t, "serve", "--listen", "127.0.0.1:0", "--model-url", m.URL(), "--data-dir", dir)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()

	type result struct {
		code int
		body string
		err  error
	}
	turn := make(chan result, 1)
	go func() {
		code, body, err := serveTurn(client, serverURL, "c1", "m", "hello tc-u1")
		turn <- result{code, body, err}
	}()
	<-gate.Arrived()
	stopped := make(chan int, 1)
	go func() { stopped <- stop() }()
	awaitNotListening(t, serverURL)
	gate.Release()
	r := <-turn
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusOK, r.code, r.body)
	assert.Contains(t, r.body, "tc-a1")
	assert.Equal(t, exitOK, <-stopped)

	serverURL, stop = startCommand(t, "serve", "--listen", "127.0.0.1:0", "--model-url", m.URL(), "--data-dir", dir)
	code, body, err := serveTurn(client, serverURL, "c1", "m", "again tc-u2")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, body)
	calls := m.CallsAfter(0)
	assert.Equal(t, "tc-u1 tc-a1 tc-u2", model.FormatTokens(calls[len(calls)-1].History), "the drained turn was committed")
	client.CloseIdleConnections()
	assert.Equal(t, exitOK, stop())
}

// TestServeStopIsBounded: a turn that does not end within --grace is
// dropped (its client hears no success, nothing is committed) and the
// server still exits 0, saying so.
func TestServeStopIsBounded(t *testing.T) {
	m := startFakeModel(t)
	dir := t.TempDir()
	arrived := m.Script("tc-u1", faults.Fault{Kind: faults.Hold})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--model-url", m.URL(), "--data-dir", dir,
			"--grace", "200ms"}, &stdout, &stderr)
	}()
	require.Eventually(t, func() bool { return listening.MatchString(stdout.String()) }, 10*time.Second, 5*time.Millisecond)
	serverURL := listening.FindStringSubmatch(stdout.String())[1]
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()

	turn := make(chan int, 1)
	go func() {
		code, _, _ := serveTurn(client, serverURL, "c1", "m", "hello tc-u1")
		turn <- code
	}()
	<-arrived
	start := time.Now()
	cancel()
	assert.Equal(t, exitOK, <-exited, stderr.String())
	assert.Less(t, time.Since(start), 5*time.Second, "the stop waited past its grace")
	assert.Contains(t, stderr.String(), "after 200ms were dropped")
	assert.NotEqual(t, http.StatusOK, <-turn, "a dropped turn is no success")

	serverURL, stop := startCommand(t, "serve", "--listen", "127.0.0.1:0", "--model-url", m.URL(), "--data-dir", dir)
	code, body, err := serveTurn(client, serverURL, "c1", "m", "again tc-u2")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, body)
	calls := m.CallsAfter(0)
	assert.Equal(t, "tc-u2", model.FormatTokens(calls[len(calls)-1].History), "the dropped turn was not committed")
	client.CloseIdleConnections()
	assert.Equal(t, exitOK, stop())
}

// TestServeAgents: --agent loads a definition, repeatable; a conversation
// names its agent by the request's model, and a reference that does not
// load is a one-line error naming it.
func TestServeAgents(t *testing.T) {
	m := startFakeModel(t)
	base := "http://" + m.Addr() + "/agents/"
	serverURL, stop := startCommand(t, "serve", "--listen", "127.0.0.1:0", "--model-url", m.URL(), "--data-dir", t.TempDir(),
		"--agent", base+"helper.yaml?tag=v1", "--agent", base+"other.yaml")
	client := &http.Client{Timeout: 10 * time.Second}
	code, body, err := serveTurn(client, serverURL, "c1", "helper", "hello tc-u1")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, body)
	code, body, err = serveTurn(client, serverURL, "c2", "nobody", "hello tc-u2")
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, code, body)
	client.CloseIdleConnections()
	assert.Equal(t, exitOK, stop())

	for _, args := range [][]string{
		{"--agent", base + "no.such.yaml"},
		{"--agent", ""},
	} {
		code, _, stderr := runCLI(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--model-url", m.URL(),
			"--data-dir", t.TempDir()}, args...)...)
		assert.Equal(t, exitUsage, code, "%v", args)
		assert.Equal(t, 1, strings.Count(stderr, "\n"), "want a one-line error, got %q", stderr)
		assert.Contains(t, stderr, "agent", "%v", args)
	}
	_, stdout, _ := runCLI(t, "serve", "--help")
	assert.Contains(t, stdout, "--agent 'http://127.0.0.1:9090/agents/helper.yaml?tag=v1'", "the help shows an example")
}

// TestFlagsAnywhere: flags may follow a command's arguments, and --help
// shows them as they are written.
func TestFlagsAnywhere(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.json")
	code, _, stderr := runCLI(t, "replay", missing, "--json", filepath.Join(t.TempDir(), "out.json"))
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "missing.json", "the file was taken as the argument and read")
	assert.NotContains(t, stderr, "unexpected argument")

	code, _, stderr = runCLI(t, "replay", "--", "--not-a-flag.json")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--not-a-flag.json", "after --, an argument")
	assert.NotContains(t, stderr, "flag provided but not defined")

	code, stdout, _ := runCLI(t, "conform", "--help")
	assert.Equal(t, exitOK, code)
	assert.Contains(t, stdout, "\n  --checks int\n")
	assert.NotContains(t, stdout, "\n  -checks")

	code, stdout, _ = runCLI(t, "version")
	assert.Equal(t, exitOK, code)
	assert.True(t, strings.HasPrefix(stdout, "turncheck "), stdout)
}

// TestInvariantTableHolds: every test and mutant PROTOCOL.md's table of
// invariants per protocol names as holding a cell exists, so that the
// table cannot point at a test or a mutant that is gone.
func TestInvariantTableHolds(t *testing.T) {
	doc, err := os.ReadFile("../../PROTOCOL.md")
	require.NoError(t, err)
	text := string(doc)
	start := strings.Index(text, "### Which rule judges each invariant, per protocol")
	require.GreaterOrEqual(t, start, 0, "PROTOCOL.md has the table")
	end := strings.Index(text[start:], "\n### ")
	require.Greater(t, end, 0)
	table := text[start : start+end]
	header := table[strings.Index(table, "| invariant |"):]
	header = header[:strings.Index(header, "\n")]
	for _, p := range targets.Protocols {
		assert.Contains(t, header, "| "+string(p.Name)+" |", "the table has a column per protocol")
	}
	var sources strings.Builder
	require.NoError(t, filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		sources.Write(b)
		return err
	}))
	for _, m := range regexp.MustCompile("`(Test[A-Za-z0-9]+)`").FindAllStringSubmatch(table, -1) {
		if m[1] == "TestInvariantTableHolds" || m[1] == "TestMutantsCaught" || m[1] == "TestConformMutantsThroughProfile" {
			continue
		}
		assert.True(t, strings.Contains(sources.String(), "func "+m[1]+"("), "PROTOCOL.md's table names %s, a test that does not exist", m[1])
	}
	mutants := map[string]bool{}
	for _, info := range sut.Mutants() {
		mutants[string(info.Mutant)] = true
	}
	named := regexp.MustCompile("mutant `([a-z0-9-]+)`").FindAllStringSubmatch(table, -1)
	require.NotEmpty(t, named)
	for _, m := range named {
		assert.True(t, mutants[m[1]], "PROTOCOL.md's table names mutant %s", m[1])
	}
}
