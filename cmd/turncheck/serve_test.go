package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/sut"
)

// runStart runs the CLI with a context that has ended already: a command
// that gets through its start-up stops at once (exit 0) instead of
// serving on, so that a configuration error the start missed fails the
// test rather than hanging it.
func runStart(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stdout, stderr syncbuf.Buffer
	code := run(ctx, args, &stdout, &stderr)
	return code, stderr.String()
}

// TestServeHelpDocumentsEveryLimit: every limit and timeout of the server
// is in 'serve --help' with its default, as the flags' own defaults say.
func TestServeHelpDocumentsEveryLimit(t *testing.T) {
	code, help, _ := runCLI(t, "serve", "--help")
	require.Equal(t, exitOK, code)
	for flag, def := range map[string]string{
		"--header-timeout":       sut.DefaultHeaderTimeout.String(),
		"--body-timeout":         sut.DefaultBodyTimeout.String(),
		"--idle-timeout":         sut.DefaultIdleTimeout.String(),
		"--request-timeout":      sut.DefaultRequestTimeout.String(),
		"--grace":                defaultGrace.String(),
		"--max-conns":            strconv.Itoa(sut.DefaultMaxConns),
		"--max-requests":         strconv.Itoa(sut.DefaultMaxRequests),
		"--max-body-bytes":       strconv.Itoa(sut.DefaultMaxBodyBytes),
		"--max-history-messages": strconv.Itoa(sut.DefaultMaxHistoryMessages),
		"--max-history-bytes":    strconv.Itoa(sut.DefaultMaxHistoryBytes),
		"--conversations-max":    strconv.Itoa(sut.DefaultConversationsMax),
		"--compact-after":        strconv.Itoa(sut.DefaultCompactAfter),
	} {
		row := regexp.MustCompile(`(?m)^  ` + flag + `\s+(\S+)`).FindStringSubmatch(help)
		if assert.NotNil(t, row, "the limits table has no row for %s", flag) {
			assert.Equal(t, def, row[1], "%s: the table's default is not the flag's", flag)
		}
		assert.Regexp(t, `(?m)^  `+flag+` (int|duration)$`, help, "%s is not a flag", flag) // the flag list: "  --flag type"
	}
	row := regexp.MustCompile(`(?m)^  --max-memory\s+(\S+)`).FindStringSubmatch(help)
	if assert.NotNil(t, row, "the limits table has no row for --max-memory") {
		assert.Equal(t, "auto", row[1])
	}
	assert.Regexp(t, `(?m)^  --max-memory bytes$`, help)
	row = regexp.MustCompile(`(?m)^  --max-store-conns\s+(\S+)`).FindStringSubmatch(help)
	if assert.NotNil(t, row, "the limits table has no row for --max-store-conns") {
		assert.Equal(t, "auto", row[1])
	}
	assert.Regexp(t, `(?m)^  --max-store-conns int$`, help)
	assert.Contains(t, help, "("+strconv.Itoa(sut.DefaultMaxStoreConns(sut.DefaultMaxRequests))+" at "+strconv.Itoa(sut.DefaultMaxRequests)+")",
		"the table says what auto comes to at the default --max-requests")
	assert.Contains(t, help, "1/"+strconv.Itoa(sut.MemoryShare)+" of the")
	for _, fixed := range []int{sut.MaxHeaderBytes, sut.MaxModelBytes, sut.MaxContentBytes, sut.MaxMessages, sut.MaxConversationIDBytes} {
		assert.Contains(t, help, strconv.Itoa(fixed))
	}
	assert.Contains(t, help, sut.StreamWriteTimeout.String())
	for _, word := range []string{"--key-file", keysEnv, "--allow-host", "415", "421", "403", "503", "Retry-After", "408", "413", "0700", "0600", "HMAC",
		"--interruption", string(sut.Rollback), string(sut.KeepConsistent), sut.ToolEcho, sut.ToolLookup, "/tools/lookup",
		strconv.Itoa(sut.MaxToolRounds) + " rounds"} {
		assert.Contains(t, help, word)
	}
}

// TestServeRefusesABadModelURLWithoutItsCredentials: a model URL with
// credentials and a typo is a one-line error that does not print them.
func TestServeRefusesABadModelURLWithoutItsCredentials(t *testing.T) {
	for _, u := range []string{
		"http://svc:hunter2@llm-gw.corp.internal:80x/v1",
		"htp://svc:hunter2@llm-gw.corp.internal/v1",
		"http//svc:hunter2@llm-gw.corp.internal/v1",
		"http://svc:hunter2@/v1",
		"svc:hunter2@llm-gw.corp.internal",
	} {
		code, stderr := runStart(t, "serve", "--listen", "127.0.0.1:0", "--model-url", u, "--data-dir", t.TempDir())
		assert.Equal(t, exitUsage, code, u)
		assert.Equal(t, 1, strings.Count(stderr, "\n"), "want a one-line error, got %q", stderr)
		assert.Contains(t, stderr, "model URL")
		assert.NotContains(t, stderr, "hunter2")
		assert.NotContains(t, stderr, "svc")
	}
}

func TestServeRefusesBadLimits(t *testing.T) {
	for _, args := range [][]string{
		{"--body-timeout", "0s"}, {"--header-timeout", "-1s"}, {"--idle-timeout", "0s"},
		{"--max-conns", "0"}, {"--max-requests", "-1"}, {"--max-body-bytes", "0"},
		{"--max-history-messages", "0"}, {"--max-history-bytes", "0"},
		{"--compact-after", "0"}, {"--compact-after", "-1"}, {"--interruption", "keep"}, {"--interruption", "Rollback"},
		{"--allow-host", ""}, {"--allow-host", "host:8080"},
		{"--max-memory", "0"}, {"--max-memory", "-1GiB"}, {"--max-memory", "lots"}, {"--max-memory", "12XB"},
		{"--max-memory", "9999999999TiB"}, {"--max-memory", "1MiB"}, {"--stall", "-1ms"}, {"--turn-delay", "-1ms"},
	} {
		code, stderr := runStart(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--model-url", "http://127.0.0.1:1/v1",
			"--data-dir", t.TempDir()}, args...)...)
		assert.Equal(t, exitUsage, code, "%v", args)
		assert.Equal(t, 1, strings.Count(stderr, "\n"), "%v: want a one-line error, got %q", args, stderr)
	}
}

// TestServeTakesAMemoryBudget: --max-memory takes bytes with or without a
// unit, or auto; one too small for a turn at the limits says what it
// would need.
func TestServeTakesAMemoryBudget(t *testing.T) {
	for v, want := range map[string]int64{"auto": 0, "67108864": 64 << 20, "64MiB": 64 << 20, "2GiB": 2 << 30, "100MB": 100e6, "3 GiB": 3 << 30} {
		var b byteSize
		if assert.NoError(t, b.Set(v), v) {
			assert.Equal(t, want, b.n, v)
		}
	}
	code, stderr := runStart(t, "serve", "--listen", "127.0.0.1:0", "--model-url", "http://127.0.0.1:1/v1",
		"--data-dir", t.TempDir(), "--max-memory", "8MiB")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "want at least")
}

// TestServeTakesTheToolPolicies: --interruption and --compact-after reach
// the server, which starts with either policy.
func TestServeTakesTheToolPolicies(t *testing.T) {
	for _, policy := range []sut.Interruption{sut.Rollback, sut.KeepConsistent} {
		code, stderr := runStart(t, "serve", "--listen", "127.0.0.1:0", "--model-url", "http://127.0.0.1:1/v1",
			"--data-dir", t.TempDir(), "--interruption", string(policy), "--compact-after", "8")
		assert.Equal(t, exitOK, code, "%s: %s", policy, stderr)
	}
	code, stderr := runStart(t, "serve", "--listen", "127.0.0.1:0", "--model-url", "http://127.0.0.1:1/v1",
		"--data-dir", t.TempDir(), "--interruption", "commit")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--interruption")
	assert.Contains(t, stderr, string(sut.KeepConsistent), "the error names the valid values")
}

// sendWithKey sends a turn with key as its bearer token and returns the
// status.
func sendWithKey(t *testing.T, client *http.Client, serverURL, key, text string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, serverURL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"`+text+`"}]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestServeKeysFromFileAndEnvironment: keys come from --key, --key-file
// and $TURNCHECK_KEYS, which add up; a file or a variable that holds no
// key is an error, and a key file others can read gets a warning.
func TestServeKeysFromFileAndEnvironment(t *testing.T) {
	m := startFakeModel(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	require.NoError(t, os.WriteFile(file, []byte("# the team's keys\nfile-key-1\n\n  file-key-2  \n"), 0o600))
	t.Setenv(keysEnv, " env-key-1 ,env-key-2,")
	serverURL, stop := startCommand(t, "serve", "--listen", "127.0.0.1:0", "--model-url", m.URL(), "--data-dir", t.TempDir(),
		"--key", "flag-key", "--key-file", file)
	client := &http.Client{Timeout: 10 * time.Second}
	for i, key := range []string{"flag-key", "file-key-1", "file-key-2", "env-key-1", "env-key-2"} {
		assert.Equal(t, http.StatusOK, sendWithKey(t, client, serverURL, key, fmt.Sprintf("tc-u%d", i+1)), key)
	}
	for _, key := range []string{"# the team's keys", "", "other", "env-key"} {
		assert.Equal(t, http.StatusUnauthorized, sendWithKey(t, client, serverURL, key, "tc-u9"), "%q", key)
	}
	client.CloseIdleConnections()
	assert.Equal(t, exitOK, stop())

	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("# nothing\n\n"), 0o600))
	for name, tc := range map[string]struct {
		env  string
		args []string
	}{
		"empty key file":   {"", []string{"--key-file", empty}},
		"no such key file": {"", []string{"--key-file", filepath.Join(dir, "nope")}},
		"empty variable":   {" , ,", nil},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(keysEnv, tc.env)
			code, stderr := runStart(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--model-url", m.URL(), "--data-dir", t.TempDir()}, tc.args...)...)
			assert.Equal(t, exitUsage, code)
			assert.Equal(t, 1, strings.Count(stderr, "\n"), "want a one-line error, got %q", stderr)
		})
	}

	t.Run("readable key file", func(t *testing.T) {
		t.Setenv(keysEnv, "")
		open := filepath.Join(dir, "open")
		require.NoError(t, os.WriteFile(open, []byte("k\n"), 0o644))
		require.NoError(t, os.Chmod(open, 0o644))
		code, stderr := runStart(t, "serve", "--listen", "127.0.0.1:0", "--model-url", m.URL(), "--data-dir", t.TempDir(), "--key-file", open)
		assert.Equal(t, exitOK, code, stderr)
		assert.Contains(t, stderr, "chmod 600")
	})
}

// TestServeStopDoesNotWaitForStalledClients: a client stalled mid-body does
// not hold a stop for --grace (the issue saw 30 s).
func TestServeStopDoesNotWaitForStalledClients(t *testing.T) {
	m := startFakeModel(t)
	serverURL, stop := startCommand(t, "serve", "--listen", "127.0.0.1:0", "--model-url", m.URL(), "--data-dir", t.TempDir(),
		"--grace", "30s", "--body-timeout", "1m")
	c, err := net.Dial("tcp", strings.TrimPrefix(serverURL, "http://"))
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	require.NoError(t, err)
	// The server has the request once a second client is served after it.
	client := &http.Client{Timeout: 10 * time.Second}
	code, body, err := serveTurn(client, serverURL, "c1", "m", "hello tc-u1")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, body)
	client.CloseIdleConnections()

	start := time.Now()
	assert.Equal(t, exitOK, stop())
	assert.Less(t, time.Since(start), 3*time.Second, "the stop waited for a stalled client")
}

// TestServeAllowHost: --allow-host adds a name requests may use as their
// Host; any other name is refused (421).
func TestServeAllowHost(t *testing.T) {
	m := startFakeModel(t)
	serverURL, stop := startCommand(t, "serve", "--listen", "127.0.0.1:0", "--model-url", m.URL(), "--data-dir", t.TempDir(),
		"--allow-host", "llm.internal.example")
	client := &http.Client{Timeout: 10 * time.Second}
	send := func(host string) int {
		req, err := http.NewRequest(http.MethodPost, serverURL+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"tc-u1"}]}`))
		require.NoError(t, err)
		req.Host = host
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusOK, send("llm.internal.example"))
	assert.Equal(t, http.StatusMisdirectedRequest, send("other.example"))
	client.CloseIdleConnections()
	assert.Equal(t, exitOK, stop())
}
