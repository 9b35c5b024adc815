package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/syncbuf"
)

// TestServeACPSpeaksOnStdio: 'serve acp' answers on stdout, one JSON-RPC
// message a line and nothing else, logs on stderr, runs a prompt through
// the model, and exits 0 when its stdin closes.
func TestServeACPSpeaksOnStdio(t *testing.T) {
	m, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	defer m.Close()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	var stderr syncbuf.Buffer
	code := make(chan int, 1)
	go func() {
		code <- cmdServeACP(context.Background(), []string{"--model-url", m.URL(), "--data-dir", t.TempDir()}, inR, outW, &stderr)
		_ = outW.Close()
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func() map[string]any {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "stdout ended early")
			var msg map[string]any
			require.NoError(t, json.Unmarshal([]byte(l), &msg), "stdout carries JSON-RPC alone: %q", l)
			assert.Equal(t, "2.0", msg["jsonrpc"])
			return msg
		case <-time.After(10 * time.Second):
			require.FailNow(t, "no answer")
			return nil
		}
	}
	send := func(line string) {
		_, err := io.WriteString(inW, line+"\n")
		require.NoError(t, err)
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`)
	init := next()
	assert.Equal(t, true, init["result"].(map[string]any)["agentCapabilities"].(map[string]any)["loadSession"])
	send(`{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}`)
	session := next()["result"].(map[string]any)["sessionId"].(string)
	send(`{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"` + session + `","prompt":[{"type":"text","text":"Please remember tc-u1."}]}}`)
	var reply strings.Builder
	for {
		msg := next()
		if msg["method"] == "session/update" {
			u := msg["params"].(map[string]any)["update"].(map[string]any)
			assert.Equal(t, "agent_message_chunk", u["sessionUpdate"])
			reply.WriteString(u["content"].(map[string]any)["text"].(string))
			continue
		}
		assert.EqualValues(t, 3, msg["id"])
		assert.Equal(t, map[string]any{"stopReason": "end_turn"}, msg["result"])
		break
	}
	assert.Contains(t, reply.String(), "tc-a1")
	require.NoError(t, inW.Close())
	select {
	case c := <-code:
		assert.Equal(t, exitOK, c, stderr.String())
	case <-time.After(10 * time.Second):
		require.FailNow(t, "serve acp did not exit when its stdin closed")
	}
	_, open := <-lines
	assert.False(t, open, "nothing more on stdout")
	assert.Contains(t, stderr.String(), "acp: serving the Agent Client Protocol on stdin and stdout")
	assert.Contains(t, stderr.String(), "acp: the client closed its end")
}

// TestServeACPRefusesBadFlags: a bad flag is a one-line error, before
// anything is read from stdin.
func TestServeACPRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--data-dir", "x"},
		{"--model-url", "http://127.0.0.1:1/v1"},
		{"--model-url", "http://127.0.0.1:1/v1", "--data-dir", "x", "--store", "postgres://h/db"},
		{"--model-url", "http://127.0.0.1:1/v1", "--data-dir", "x", "--concurrency", "queue"},
		{"--model-url", "http://127.0.0.1:1/v1", "--data-dir", "x", "--interruption", "keep"},
		{"--model-url", "http://127.0.0.1:1/v1", "--data-dir", "x", "--mutant", "no-such"},
		{"--model-url", "http://127.0.0.1:1/v1", "--data-dir", "x", "--max-body-bytes", "0"},
		{"--model-url", "htp://127.0.0.1:1/v1", "--data-dir", t.TempDir()},
	} {
		var stdout, stderr syncbuf.Buffer
		code := cmdServeACP(context.Background(), args, strings.NewReader(""), &stdout, &stderr)
		assert.Equal(t, exitUsage, code, "%v", args)
		assert.Equal(t, 1, strings.Count(stderr.String(), "\n"), "%v: want a one-line error, got %q", args, stderr.String())
		assert.Empty(t, stdout.String(), "%v", args)
	}
	code, help, _ := runCLI(t, "serve", "acp", "--help")
	assert.Equal(t, exitOK, code)
	for _, word := range []string{"session/load", "session/cancel", "loadSession", "refusal", "cancelled", "-32602", "-32002", "-32700"} {
		assert.Contains(t, help, word)
	}
}
