//go:build unix

package protocol

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	acp "github.com/coder/acp-go-sdk"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// scriptEnv names the script a re-run of this test binary plays as an ACP
// agent, over its real stdin and stdout.
const scriptEnv = "TURNCHECK_ACP_SCRIPT"

// loadEnv names the file by which a scripted agent playing "loadonce"
// knows, across its restarts, that it refused a load already.
const loadEnv = "TURNCHECK_ACP_LOADED"

// scriptedAgent plays an ACP agent as mode says, one JSON-RPC message a
// line: "ok" answers each prompt with the model's reply, "logs" writes
// log lines and a malformed message on stdout among its messages,
// "noinit" never answers initialize, "exit" exits mid-prompt, "callback"
// calls back fs/read_text_file and terminal/create before it answers,
// "ignorecancel" answers end_turn after session/cancel, "empty" answers
// the prompt's reply without the model's call mark, "trailing" with an
// error text after it, "outoforder" holds the first prompt until a second
// comes, runs the second, and runs the first at the next session/new (as
// the harness's model holds a call until it has read the answers before
// it), "errors" answers each prompt with a
// JSON-RPC error, with an HTTP-like status in its data for an odd token
// and none for an even one, "loadonce" advertises loadSession, refuses the
// first session/load (503, as a server still starting might) and takes
// a prompt only on a session made or loaded on its connection (-32002
// otherwise), as ACP's agents do; the file named by loadEnv says a load
// was refused already.
func scriptedAgent(mode string, in io.Reader, out io.Writer) int {
	enc := json.NewEncoder(out)
	send := func(v map[string]any) { v["jsonrpc"] = "2.0"; _ = enc.Encode(v) }
	userTok := regexp.MustCompile(`tc-u(\d+)`)
	lines := bufio.NewScanner(in)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	var prompt map[string]any  // the prompt waiting for session/cancel
	var first []map[string]any // outoforder: the first prompt's messages, held
	open := map[string]bool{}  // loadonce: the sessions made or loaded on this connection
	for lines.Scan() {
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
			Error  *struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(lines.Bytes(), &msg) != nil {
			continue
		}
		if mode == "logs" {
			fmt.Fprintln(out, "agent: got", msg.Method)
			fmt.Fprintln(out, `{"jsonrpc": "2.0", "method": `) // a message cut short
		}
		switch msg.Method {
		case "initialize":
			if mode == "noinit" {
				continue
			}
			send(map[string]any{"id": msg.ID, "result": map[string]any{"protocolVersion": 1,
				"agentCapabilities": map[string]any{"loadSession": mode == "loadonce"}, "authMethods": []any{}}})
		case "session/new":
			for _, m := range first {
				send(m)
			}
			first = nil
			open["s1"] = true
			send(map[string]any{"id": msg.ID, "result": map[string]any{"sessionId": "s1"}})
		case "session/load":
			if f := os.Getenv(loadEnv); f != "" {
				if _, err := os.Stat(f); err != nil {
					_ = os.WriteFile(f, nil, 0o600)
					send(map[string]any{"id": msg.ID, "error": map[string]any{"code": -32603, "message": "Internal error",
						"data": map[string]any{"status": 503, "detail": "starting"}}})
					continue
				}
			}
			open["s1"] = true
			send(map[string]any{"id": msg.ID, "result": map[string]any{}})
		case "session/prompt":
			text := string(msg.Params)
			n := "0"
			if m := userTok.FindStringSubmatch(text); m != nil {
				n = m[1]
			}
			reply := fmt.Sprintf("tc-a%s acknowledges [call 1].", n)
			chunk := func(text string) map[string]any {
				return map[string]any{"method": "session/update", "params": map[string]any{"sessionId": "s1",
					"update": map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": text}}}}
			}
			if mode == "loadonce" && !open["s1"] {
				send(map[string]any{"id": msg.ID, "error": map[string]any{"code": -32002, "message": "Resource not found"}})
				continue
			}
			switch mode {
			case "outoforder":
				msgs := []map[string]any{chunk(reply), {"id": msg.ID, "result": map[string]any{"stopReason": "end_turn"}}}
				if first == nil {
					first = msgs
					continue
				}
				for _, m := range msgs {
					send(m)
				}
				continue
			case "errors":
				e := map[string]any{"code": -32603, "message": "Internal error"}
				if n[len(n)-1]%2 == 1 {
					e["data"] = map[string]any{"status": 502, "detail": "the model failed"}
				}
				send(map[string]any{"id": msg.ID, "error": e})
				continue
			case "exit":
				os.Exit(3)
			case "ignorecancel":
				prompt = map[string]any{"id": msg.ID, "result": map[string]any{"stopReason": "end_turn"}}
				continue
			case "empty":
				reply = fmt.Sprintf("tc-a%s acknowl", n)
			case "trailing":
				reply += "\n\nError: the model's stream broke\n"
			case "callback":
				send(map[string]any{"id": 100, "method": "fs/read_text_file", "params": map[string]any{"sessionId": "s1", "path": "/etc/hostname"}})
				send(map[string]any{"id": 101, "method": "terminal/create", "params": map[string]any{"sessionId": "s1", "command": "true"}})
				codes := []int{}
				for len(codes) < 2 && lines.Scan() {
					var r struct {
						Error *struct {
							Code int `json:"code"`
						} `json:"error"`
					}
					if json.Unmarshal(lines.Bytes(), &r) == nil && r.Error != nil {
						codes = append(codes, r.Error.Code)
					}
				}
				reply = fmt.Sprintf("tc-a%s errors %v [call 1].", n, codes)
			}
			send(map[string]any{"method": "session/update", "params": map[string]any{"sessionId": "s1",
				"update": map[string]any{"sessionUpdate": "agent_message_chunk", "content": map[string]any{"type": "text", "text": reply}}}})
			send(map[string]any{"id": msg.ID, "result": map[string]any{"stopReason": "end_turn"}})
		case "session/cancel":
			if prompt != nil {
				send(prompt)
				prompt = nil
			}
		}
	}
	return 0
}

// startScripted starts this test binary as an agent playing mode, and a
// client of it.
func startScripted(t *testing.T, mode string, timeout time.Duration) (targets.Server, *Client, error) {
	t.Helper()
	p := targets.Profile{Protocol: targets.ACP, Model: "turncheck", ClientTimeout: timeout, ModelTimeout: timeout / 2}
	target := targets.Subprocess{Command: []string{os.Args[0], "-test.run=^$"}, Env: []string{scriptEnv + "=" + mode},
		StartTimeout: timeout, StopGrace: time.Second, Reaches: p}
	srv, err := target.StartContext(context.Background(), "http://127.0.0.1:9/v1")
	if err != nil {
		return nil, nil, err
	}
	t.Cleanup(func() {
		err := srv.Close()
		if mode != "exit" { // one that exited on its own says so as it stops
			assert.NoError(t, err)
		}
	})
	cl := NewClient(targets.URLs(srv), p, "")
	cl.Attach(srv)
	t.Cleanup(cl.Close)
	return srv, cl, nil
}

// prompt sends one turn with token tok on conversation c.
func prompt(cl *Client, ctx context.Context, tok model.Token) Response {
	req := cl.NewRequest(ctx, plan.TurnSend(model.ConversationRef{ID: "c"}, tok, true))
	return cl.Send(ctx, req)
}

// TestACPTurn: a prompt the agent answers with the model's whole reply and
// end_turn is ok; one whose reply lacks the call mark (a part of the
// model's reply, the agent's error text after it) failed in the model.
func TestACPTurn(t *testing.T) {
	_, cl, err := startScripted(t, "ok", 10*time.Second)
	require.NoError(t, err)
	r := prompt(cl, context.Background(), "tc-u7")
	assert.Equal(t, model.OK, r.Outcome, r.Detail)
	assert.Equal(t, "end_turn", r.StopReason)
	assert.Contains(t, r.Reply, "tc-a7")
	assert.Empty(t, r.Breaches)

	for _, mode := range []string{"empty", "trailing"} {
		_, cl, err = startScripted(t, mode, 10*time.Second)
		require.NoError(t, err)
		r = prompt(cl, context.Background(), "tc-u8")
		assert.Equal(t, model.Fail, r.Outcome, mode)
		assert.Equal(t, CauseNoModelReply, r.Cause, mode)
	}
}

// TestACPLogsOnStdout: log lines and a malformed message on the agent's
// stdout are kept in its output, never read as messages, and the turn
// still comes through.
func TestACPLogsOnStdout(t *testing.T) {
	srv, cl, err := startScripted(t, "logs", 10*time.Second)
	require.NoError(t, err)
	r := prompt(cl, context.Background(), "tc-u3")
	assert.Equal(t, model.OK, r.Outcome, r.Detail)
	noise := srv.(targets.ACPServer).ACP().Noise()
	assert.Contains(t, noise, "agent: got session/prompt")
	assert.Contains(t, noise, `{"jsonrpc": "2.0", "method":`)
	assert.Contains(t, srv.(targets.Outputter).Output(), "[stdout, no JSON-RPC] agent: got initialize")
}

// TestACPNeverInitializes: an agent that never answers initialize is not
// ready: its start fails within the start timeout, saying so.
func TestACPNeverInitializes(t *testing.T) {
	_, _, err := startScripted(t, "noinit", time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "did not answer initialize")
}

// TestACPExitMidPrompt: an agent that exits mid-prompt leaves the turn's
// outcome unknown, said so, at once.
func TestACPExitMidPrompt(t *testing.T) {
	_, cl, err := startScripted(t, "exit", 30*time.Second)
	require.NoError(t, err)
	start := time.Now()
	r := prompt(cl, context.Background(), "tc-u1")
	assert.Equal(t, model.Unknown, r.Outcome)
	assert.Equal(t, CauseAgentExited, r.Cause, r.Detail)
	assert.False(t, r.TimedOut, "the exit, not the client's time, ended the wait (%v)", time.Since(start))
}

// TestACPUnadvertisedCallBack: the client answers a call it did not
// advertise with an error (method not found), and the turn says the
// agent breached the protocol.
func TestACPUnadvertisedCallBack(t *testing.T) {
	_, cl, err := startScripted(t, "callback", 10*time.Second)
	require.NoError(t, err)
	r := prompt(cl, context.Background(), "tc-u2")
	assert.Equal(t, model.OK, r.Outcome, r.Detail)
	assert.Contains(t, r.Reply, "errors [-32601 -32601]")
	// The SDK answers calls back at once, each on its own: in either order.
	assert.ElementsMatch(t, []string{
		"the agent called fs/read_text_file, which the client did not advertise",
		"the agent called terminal/create, which the client did not advertise",
	}, r.Breaches)
}

// TestACPCancel: the client's abort sends session/cancel; an answer other
// than cancelled is a breach, and the outcome unknown.
func TestACPCancel(t *testing.T) {
	_, cl, err := startScripted(t, "ignorecancel", 10*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	r := prompt(cl, ctx, "tc-u4")
	assert.Equal(t, model.Unknown, r.Outcome)
	assert.Equal(t, CauseNotCancelled, r.Cause)
	require.Len(t, r.Breaches, 1)
	assert.Contains(t, r.Breaches[0], `"end_turn" after session/cancel`)
}

// TestACPRepliesOfPromptsRunOutOfOrder: two prompts of a session sent at
// once, which the agent runs one at a time but the later first: each
// prompt's reply is the text streamed before its own answer, not the
// oldest prompt's.
func TestACPRepliesOfPromptsRunOutOfOrder(t *testing.T) {
	srv, cl, err := startScripted(t, "outoforder", 10*time.Second)
	require.NoError(t, err)
	// The requests are made one after the other, as the harness makes a
	// burst's (the first makes the session), and sent at once.
	ctx := context.Background()
	reqs := []Request{
		cl.NewRequest(ctx, plan.TurnSend(model.ConversationRef{ID: "c"}, "tc-u1", true)),
		cl.NewRequest(ctx, plan.TurnSend(model.ConversationRef{ID: "c"}, "tc-u2", true)),
	}
	rs := make([]Response, 2)
	answered := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i] = cl.Send(ctx, req)
			answered <- struct{}{}
		}()
	}
	// Once the later prompt's answer is read, the agent runs the other.
	<-answered
	_, err = srv.(targets.ACPServer).ACP().Conn().NewSession(ctx, acp.NewSessionRequest{Cwd: "/", McpServers: []acp.McpServer{}})
	require.NoError(t, err)
	wg.Wait()
	for i, r := range rs {
		assert.Equal(t, model.OK, r.Outcome, "prompt %d: %s", i+1, r.Detail)
		assert.Equal(t, fmt.Sprintf("tc-a%d acknowledges [call 1].", i+1), r.Reply, "prompt %d", i+1)
	}
}

// TestACPErrorStatus: a JSON-RPC error is read as the status its data
// gives, where the agent gives one (the reference server's: 502 for a
// model that failed), and as the client's own reading of its code
// otherwise (500).
func TestACPErrorStatus(t *testing.T) {
	_, cl, err := startScripted(t, "errors", 10*time.Second)
	require.NoError(t, err)
	r := prompt(cl, context.Background(), "tc-u1")
	assert.Equal(t, model.Fail, r.Outcome)
	assert.Equal(t, 502, r.Status, r.Detail)
	assert.Equal(t, CauseRPCError, r.Cause)
	r = prompt(cl, context.Background(), "tc-u2")
	assert.Equal(t, model.Fail, r.Outcome)
	assert.Equal(t, 500, r.Status, r.Detail)
}

// TestACPLoadAgainAfterRefusal: a session whose session/load the agent
// refused after a restart is not on the agent's new connection: the
// client loads it again before the next prompt, rather than prompt a
// session the agent does not have there (-32002).
func TestACPLoadAgainAfterRefusal(t *testing.T) {
	t.Setenv(loadEnv, filepath.Join(t.TempDir(), "refused"))
	srv, cl, err := startScripted(t, "loadonce", 10*time.Second)
	require.NoError(t, err)
	r := prompt(cl, context.Background(), "tc-u1")
	require.Equal(t, model.OK, r.Outcome, r.Detail)
	require.NoError(t, srv.(targets.Restarter).Restart(false, nil))
	r = prompt(cl, context.Background(), "tc-u2")
	assert.Equal(t, model.Fail, r.Outcome)
	assert.Equal(t, 503, r.Status, "the load's refusal, as its data says: %s", r.Detail)
	assert.Contains(t, r.Detail, "session/load")
	r = prompt(cl, context.Background(), "tc-u3")
	assert.Equal(t, model.OK, r.Outcome, r.Detail)
}
