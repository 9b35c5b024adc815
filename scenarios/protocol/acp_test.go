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

// heldLoadEnv names the file a scripted agent playing "heldload" writes
// when it holds a session/load's answer.
const heldLoadEnv = "TURNCHECK_ACP_HELD_LOAD"

// scriptedAgent plays an ACP agent as mode says, one JSON-RPC message a
// line: "ok" answers each prompt with the model's reply, "logs" writes log
// lines and a malformed message on stdout among its messages, "noinit"
// never answers initialize, "exit" exits mid-prompt, "callback" calls back
// fs/read_text_file and terminal/create before it answers, "ignorecancel"
// answers end_turn after session/cancel, "errorcancel" ignores
// session/cancel and answers each prompt with a JSON-RPC error (no status
// in its data) when its own timeout, half a second, passes, "empty"
// answers the prompt's reply without the model's call mark, "trailing"
// with an error text after it, "outoforder" holds the first prompt until a
// second comes, runs the second, and runs the first at the next
// session/new (as the harness's model holds a call until it has read the
// answers before it), "errors" answers each prompt with a JSON-RPC error,
// with an HTTP-like status in its data for an odd token and none for an
// even one, "loadonce" advertises loadSession, refuses the first
// session/load (503, as a server still starting might) and takes a prompt
// only on a session made or loaded on its connection (-32002 otherwise),
// as ACP's agents do; the file named by loadEnv says a load was refused
// already; "heldload" advertises loadSession, replays tc-u1 and its reply
// on session/load, writes the file heldLoadEnv names, and holds the load's
// answer until the next session/new, which answers it (refused with 503 if
// that session/new's cwd is "/refuse"), and takes a prompt only on a
// session made or loaded on its connection, as "loadonce" does.
func scriptedAgent(mode string, in io.Reader, out io.Writer) int {
	enc := json.NewEncoder(out)
	var mu sync.Mutex // errorcancel answers on timers of its own
	send := func(v map[string]any) {
		mu.Lock()
		defer mu.Unlock()
		v["jsonrpc"] = "2.0"
		_ = enc.Encode(v)
	}
	userTok := regexp.MustCompile(`tc-u(\d+)`)
	lines := bufio.NewScanner(in)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	var prompt map[string]any    // the prompt waiting for session/cancel
	var first []map[string]any   // outoforder: the first prompt's messages, held
	open := map[string]bool{}    // loadonce: the sessions made or loaded on this connection
	var heldLoad json.RawMessage // heldload: the id of the load whose answer is held
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
				"agentCapabilities": map[string]any{"loadSession": mode == "loadonce" || mode == "heldload"}, "authMethods": []any{}}})
		case "session/new":
			if heldLoad != nil {
				var p struct {
					Cwd string `json:"cwd"`
				}
				_ = json.Unmarshal(msg.Params, &p)
				if p.Cwd == "/refuse" {
					send(map[string]any{"id": heldLoad, "error": map[string]any{"code": -32603, "message": "Internal error",
						"data": map[string]any{"status": 503, "detail": "starting"}}})
				} else {
					open["s1"] = true
					send(map[string]any{"id": heldLoad, "result": map[string]any{}})
				}
				heldLoad = nil
				send(map[string]any{"id": msg.ID, "result": map[string]any{"sessionId": "s9"}})
				continue
			}
			for _, m := range first {
				send(m)
			}
			first = nil
			open["s1"] = true
			send(map[string]any{"id": msg.ID, "result": map[string]any{"sessionId": "s1"}})
		case "session/load":
			if mode == "heldload" {
				for _, u := range [][2]string{{"user_message_chunk", "Please remember tc-u1."}, {"agent_message_chunk", "tc-a1 acknowledges [call 1]."}} {
					send(map[string]any{"method": "session/update", "params": map[string]any{"sessionId": "s1",
						"update": map[string]any{"sessionUpdate": u[0], "content": map[string]any{"type": "text", "text": u[1]}}}})
				}
				heldLoad = msg.ID
				_ = os.WriteFile(os.Getenv(heldLoadEnv), nil, 0o600)
				continue
			}
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
			if (mode == "loadonce" || mode == "heldload") && !open["s1"] {
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
			case "errorcancel":
				id := msg.ID
				time.AfterFunc(500*time.Millisecond, func() {
					send(map[string]any{"id": id, "error": map[string]any{"code": -32603, "message": "Internal error",
						"data": map[string]any{"detail": "the model did not answer in time"}}})
				})
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
	t.Parallel() // it waits on an agent of its own
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
	t.Parallel() // it waits on an agent of its own
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
	t.Parallel() // it waits on an agent of its own
	_, _, err := startScripted(t, "noinit", time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "did not answer initialize")
}

// TestACPExitMidPrompt: an agent that exits mid-prompt leaves the turn's
// outcome unknown, said so, at once.
func TestACPExitMidPrompt(t *testing.T) {
	t.Parallel() // it waits on an agent of its own
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
	t.Parallel() // it waits on an agent of its own
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
	t.Parallel() // it waits on an agent of its own
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

// TestACPCancelAnsweredWithAnError: ACP wants the prompt turn the client
// cancelled answered stopReason cancelled, never an error: an agent that
// ignores session/cancel and answers the prompt with a JSON-RPC error when
// its own timeout passes breaches the protocol (wire), and the turn is an
// interrupted one. A prompt that waited behind it, which the client's
// cancel (the session's) asked cancelled too, answered with an error is
// an interrupted turn as well, and no breach: ACP does not say what
// becomes of a prompt waiting behind the cancelled turn.
func TestACPCancelAnsweredWithAnError(t *testing.T) {
	t.Parallel() // it waits on an agent of its own
	_, cl, err := startScripted(t, "errorcancel", 10*time.Second)
	require.NoError(t, err)
	conv := model.ConversationRef{ID: "c"}
	ctx := context.Background()
	first := cl.NewRequest(ctx, plan.TurnSend(conv, "tc-u1", true))
	waiting := cl.NewRequest(ctx, plan.TurnSend(conv, "tc-u2", true))
	answered := make(chan Response, 1)
	go func() { answered <- cl.Send(ctx, waiting) }()
	w := cl.wire.(*acpWire)
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.sessions[conv].prompts) == 1
	}, 10*time.Second, time.Millisecond, "the waiting prompt was never sent")
	// The client's abort comes at once; the agent pays it no heed.
	aborted, abort := context.WithCancel(ctx)
	abort()
	r := cl.Send(aborted, first)
	assert.Equal(t, model.Unknown, r.Outcome, r.Detail)
	assert.True(t, r.Cancelled)
	assert.Equal(t, CauseNotCancelled, r.Cause, r.Detail)
	require.Len(t, r.Breaches, 1)
	assert.Contains(t, r.Breaches[0], "a JSON-RPC error after session/cancel")

	q := <-answered
	assert.Equal(t, model.Unknown, q.Outcome, q.Detail)
	assert.True(t, q.Cancelled, q.Detail)
	assert.Equal(t, CauseCancelledWith, q.Cause, q.Detail)
	assert.Empty(t, q.Breaches)
}

// TestACPRepliesOfPromptsRunOutOfOrder: two prompts of a session sent at
// once, which the agent runs one at a time but the later first: each
// prompt's reply is the text streamed before its own answer, not the
// oldest prompt's.
func TestACPRepliesOfPromptsRunOutOfOrder(t *testing.T) {
	t.Parallel() // it waits on an agent of its own
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
	t.Parallel() // it waits on an agent of its own
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

// TestACPPromptsWaitForTheLoad: after a restart, two prompts of one
// session made at once both want the session loaded. The one that finds
// the other's session/load in flight waits for its answer: it is never
// sent to an agent that does not have the session yet (which refuses it,
// -32002, read as a session not found: a false T7), and it shares the
// load's refusal, if the agent refuses it. The replay goes with the
// prompt that loaded the session. A load the agent never answers is no
// refusal: the prompt is not sent, and no status is read.
func TestACPPromptsWaitForTheLoad(t *testing.T) {
	conv := model.ConversationRef{ID: "c"}
	for _, refuse := range []bool{false, true} {
		t.Run(map[bool]string{false: "loaded", true: "refused"}[refuse], func(t *testing.T) {
			held := filepath.Join(t.TempDir(), "held")
			t.Setenv(heldLoadEnv, held)
			srv, cl, err := startScripted(t, "heldload", 10*time.Second)
			require.NoError(t, err)
			ctx := context.Background()
			require.Equal(t, model.OK, prompt(cl, ctx, "tc-u1").Outcome)
			require.NoError(t, srv.(targets.Restarter).Restart(false, nil))

			reqs := make([]Request, 2)
			made := make(chan int, 2)
			newRequest := func(i int, tok model.Token) {
				reqs[i] = cl.NewRequest(ctx, plan.TurnSend(conv, tok, true))
				made <- i
			}
			go newRequest(0, "tc-u2")
			require.Eventually(t, func() bool { _, err := os.Stat(held); return err == nil }, 10*time.Second, 5*time.Millisecond,
				"the agent got no session/load")
			go newRequest(1, "tc-u3")
			// The agent holds the load's answer. A request made meanwhile
			// that did not wait for it is sent now, as the harness sends a
			// burst's; one that waits is not made yet.
			rs := make([]Response, 2)
			left := 2
			select {
			case i := <-made:
				rs[i] = cl.Send(ctx, reqs[i])
				left--
			case <-time.After(300 * time.Millisecond):
			}
			cwd := "/"
			if refuse {
				cwd = "/refuse"
			}
			_, err = srv.(targets.ACPServer).ACP().Conn().NewSession(ctx, acp.NewSessionRequest{Cwd: cwd, McpServers: []acp.McpServer{}})
			require.NoError(t, err)
			for ; left > 0; left-- {
				i := <-made
				rs[i] = cl.Send(ctx, reqs[i])
			}
			for i, r := range rs {
				if refuse {
					assert.Equal(t, model.Fail, r.Outcome, "prompt %d", i+1)
					assert.Equal(t, 503, r.Status, "prompt %d, the load's refusal: %s", i+1, r.Detail)
					assert.Contains(t, reqs[i].Unsent, "session/load", "prompt %d", i+1)
					continue
				}
				assert.Equal(t, model.OK, r.Outcome, "prompt %d: %s", i+1, r.Detail)
			}
			if !refuse {
				assert.Equal(t, []model.Token{"tc-u1", "tc-a1"}, reqs[0].Replay, "the replay goes with the prompt that loaded the session")
				assert.Nil(t, reqs[1].Replay)
			}
		})
	}
	t.Run("unanswered", func(t *testing.T) {
		t.Setenv(heldLoadEnv, filepath.Join(t.TempDir(), "held"))
		srv, cl, err := startScripted(t, "heldload", 10*time.Second)
		require.NoError(t, err)
		require.Equal(t, model.OK, prompt(cl, context.Background(), "tc-u1").Outcome)
		require.NoError(t, srv.(targets.Restarter).Restart(false, nil))
		// The client's time, cut short: the agent holds the load.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		req := cl.NewRequest(ctx, plan.TurnSend(conv, "tc-u2", true))
		r := cl.Send(ctx, req)
		assert.Equal(t, model.Fail, r.Outcome)
		assert.Zero(t, r.Status, "no answer is no refusal: %s", r.Detail)
		assert.Contains(t, req.Unsent, "session/load: no answer within the client's time")
	})
}

// TestReplayTokensOfAnotherCheck: what a session/load replays of another
// check's conversation (a user message with its tag, and the reply after
// it) is set apart from the session's own tokens: a leak, not history;
// the other check is named by its tag.
func TestReplayTokensOfAnotherCheck(t *testing.T) {
	r := &acpReplay{
		texts: []string{"Please remember tc-u6. (tc0a1b2c-1)", "tc-a6 [call 3]", "Please remember tc-u1. (tc0a1b2c-2)", "tc-a1 [call 9]"},
		kinds: []string{"user", "agent", "user", "agent"},
	}
	own, foreign, from := r.tokens("(tc0a1b2c-2)")
	assert.Equal(t, []model.Token{"tc-u1", "tc-a1"}, own)
	assert.Equal(t, []model.Token{"tc-u6", "tc-a6"}, foreign)
	assert.Equal(t, []string{"(tc0a1b2c-1)"}, from)
	own, foreign, from = r.tokens("")
	assert.Len(t, own, 4, "on a server of its own, a check has no other to tell apart")
	assert.Empty(t, foreign)
	assert.Empty(t, from)
}
