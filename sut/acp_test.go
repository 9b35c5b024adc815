package sut_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Harness: an ACP client on the server's stdin and stdout, in process (over
// io.Pipe) or to a real subprocess (this test binary, re-run as the server).

// rpcMsg is one JSON-RPC message the server wrote.
type rpcMsg struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

// status is the HTTP status an error's data names; 0 if none.
func (m rpcMsg) status() int {
	var d struct {
		Status int `json:"status"`
	}
	if m.Error != nil {
		_ = json.Unmarshal(m.Error.Data, &d)
	}
	return d.Status
}

// stopReason is a prompt's answer's stop reason; "" for an error.
func (m rpcMsg) stopReason() string {
	var r struct {
		StopReason string `json:"stopReason"`
	}
	_ = json.Unmarshal(m.Result, &r)
	return r.StopReason
}

// update is a session/update notification's params.
type update struct {
	SessionID string `json:"sessionId"`
	Update    struct {
		SessionUpdate string `json:"sessionUpdate"`
		Content       json.RawMessage
		ToolCallID    string `json:"toolCallId"`
		Status        string `json:"status"`
		Title         string `json:"title"`
	} `json:"update"`
}

// text is the text of a message chunk, or of a tool call update's first
// content.
func (u update) text() string {
	var block struct {
		Type    string `json:"type"`
		Text    string `json:"text"`
		Content *struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if json.Unmarshal(u.Update.Content, &block) == nil && block.Type == "text" {
		return block.Text
	}
	var list []struct {
		Content struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if json.Unmarshal(u.Update.Content, &list) == nil && len(list) > 0 {
		return list[0].Content.Text
	}
	return ""
}

// acpConn is a client of a server's stdin (in) and stdout.
type acpConn struct {
	t    testing.TB
	in   io.WriteCloser
	read chan struct{} // closed when stdout ends

	mu    sync.Mutex
	next  int
	waits map[string]chan rpcMsg
	msgs  []rpcMsg // every message read, in order
	grew  chan struct{}
}

// newACPConn reads out until it ends.
func newACPConn(t testing.TB, in io.WriteCloser, out io.Reader) *acpConn {
	c := &acpConn{t: t, in: in, read: make(chan struct{}), waits: map[string]chan rpcMsg{}, grew: make(chan struct{})}
	go func() {
		defer close(c.read)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 8<<20)
		for sc.Scan() {
			var m rpcMsg
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				m = rpcMsg{Method: "(not JSON: " + sc.Text() + ")"}
			}
			c.mu.Lock()
			c.msgs = append(c.msgs, m)
			if w := c.waits[string(m.ID)]; w != nil && m.Method == "" {
				delete(c.waits, string(m.ID))
				w <- m
			}
			close(c.grew)
			c.grew = make(chan struct{})
			c.mu.Unlock()
		}
	}()
	return c
}

// raw writes line and a newline.
func (c *acpConn) raw(line string) {
	c.t.Helper()
	_, err := io.WriteString(c.in, line+"\n")
	require.NoError(c.t, err)
}

// start sends a request and returns where its answer comes.
func (c *acpConn) start(method string, params any) <-chan rpcMsg {
	c.t.Helper()
	c.mu.Lock()
	c.next++
	id := fmt.Sprint(c.next)
	ch := make(chan rpcMsg, 1)
	c.waits[id] = ch
	c.mu.Unlock()
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.next, "method": method, "params": params})
	require.NoError(c.t, err)
	c.raw(string(b))
	return ch
}

// wait returns the answer that comes on ch.
func (c *acpConn) wait(ch <-chan rpcMsg) rpcMsg {
	c.t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(requestDeadline):
		require.FailNow(c.t, "the server did not answer")
		return rpcMsg{}
	}
}

// call sends a request and returns its answer.
func (c *acpConn) call(method string, params any) rpcMsg {
	c.t.Helper()
	return c.wait(c.start(method, params))
}

// notify sends a notification.
func (c *acpConn) notify(method string, params any) {
	c.t.Helper()
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
	require.NoError(c.t, err)
	c.raw(string(b))
}

// mark is where the messages read so far end.
func (c *acpConn) mark() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// since returns the messages read after mark.
func (c *acpConn) since(mark int) []rpcMsg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]rpcMsg(nil), c.msgs[mark:]...)
}

// awaitMsg waits for a message after mark that matches.
func (c *acpConn) awaitMsg(mark int, match func(rpcMsg) bool) rpcMsg {
	c.t.Helper()
	deadline := time.After(requestDeadline)
	for {
		c.mu.Lock()
		for _, m := range c.msgs[mark:] {
			if match(m) {
				c.mu.Unlock()
				return m
			}
		}
		grew := c.grew
		c.mu.Unlock()
		select {
		case <-grew:
		case <-deadline:
			require.FailNow(c.t, "the server did not write the message awaited")
		}
	}
}

// updates are the session/update notifications of session after mark.
func (c *acpConn) updates(mark int, session string) []update {
	c.t.Helper()
	var out []update
	for _, m := range c.since(mark) {
		if m.Method != "session/update" {
			continue
		}
		var u update
		require.NoError(c.t, json.Unmarshal(m.Params, &u))
		if u.SessionID == session {
			out = append(out, u)
		}
	}
	return out
}

// handshake initializes the connection and returns the result.
func (c *acpConn) handshake() map[string]any {
	c.t.Helper()
	r := c.call("initialize", map[string]any{"protocolVersion": 1,
		"clientCapabilities": map[string]any{"fs": map[string]any{"readTextFile": false, "writeTextFile": false}}})
	require.Nil(c.t, r.Error, "%s", r.Error)
	var res map[string]any
	require.NoError(c.t, json.Unmarshal(r.Result, &res))
	return res
}

// newSession creates a session and returns its id.
func (c *acpConn) newSession() string {
	c.t.Helper()
	r := c.call("session/new", map[string]any{"cwd": "/", "mcpServers": []any{}})
	require.Nil(c.t, r.Error, "%+v", r.Error)
	var res struct {
		SessionID string `json:"sessionId"`
	}
	require.NoError(c.t, json.Unmarshal(r.Result, &res))
	require.NotEmpty(c.t, res.SessionID)
	return res.SessionID
}

// load sends session/load.
func (c *acpConn) load(session string) rpcMsg {
	c.t.Helper()
	return c.call("session/load", map[string]any{"sessionId": session, "cwd": "/", "mcpServers": []any{}})
}

// promptParams are a session/prompt's params: one text block.
func promptParams(session, text string) map[string]any {
	return map[string]any{"sessionId": session, "prompt": []any{map[string]any{"type": "text", "text": text}}}
}

// promptText is the prompt a turn of token tok sends, as the harness
// words it.
func promptText(tok model.Token) string { return "Please remember " + string(tok) + "." }

// prompt sends a turn of tok to session and returns its answer.
func (c *acpConn) prompt(session string, tok model.Token) rpcMsg {
	c.t.Helper()
	return c.call("session/prompt", promptParams(session, promptText(tok)))
}

// acpEnv is a fake model and a reference server speaking ACP in process,
// restartable on its data dir.
type acpEnv struct {
	t     *testing.T
	model *faults.Model
	cfg   sut.Config
	c     *acpConn
	stop  context.CancelFunc
	done  chan error
	out   *io.PipeReader
}

// startACP serves cfg over ACP in front of a fresh fake model, on a fresh
// data dir, and handshakes.
func startACP(t *testing.T, cfg sut.Config) *acpEnv {
	t.Helper()
	e := &acpEnv{t: t, model: startModel(t)}
	cfg.ModelURL, cfg.DataDir = e.model.URL(), t.TempDir()
	e.cfg = cfg
	e.start()
	t.Cleanup(func() { e.close() })
	return e
}

// start serves e.cfg on new pipes, and handshakes.
func (e *acpEnv) start() {
	e.t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, stop := context.WithCancel(context.Background())
	e.stop, e.done, e.out = stop, make(chan error, 1), outR
	go func() {
		err := sut.ServeACP(ctx, e.cfg, inR, outW)
		_ = outW.Close()
		_ = inR.Close()
		e.done <- err
	}()
	e.c = newACPConn(e.t, inW, outR)
	e.c.handshake()
}

// close closes the client's end of stdin and waits for the server to
// end: a clean exit.
func (e *acpEnv) close() error {
	e.t.Helper()
	if e.c == nil {
		return nil
	}
	_ = e.c.in.Close()
	var err error
	select {
	case err = <-e.done:
	case <-time.After(requestDeadline):
		require.FailNow(e.t, "the server did not end when its stdin closed")
	}
	_ = e.out.Close()
	<-e.c.read
	e.stop()
	e.c = nil
	return err
}

// restart ends the server as its client would (stdin closed) and starts
// it again on the same data dir.
func (e *acpEnv) restart() {
	e.t.Helper()
	require.NoError(e.t, e.close())
	e.start()
}

// ok sends a turn of tok that must end end_turn, with the model's reply
// streamed as agent_message_chunk, and returns the history its one model
// call carried.
func (e *acpEnv) ok(session string, tok model.Token) []model.Token {
	e.t.Helper()
	n, mark := e.model.CallCount(), e.c.mark()
	r := e.c.prompt(session, tok)
	require.Nil(e.t, r.Error, "%+v", r.Error)
	require.Equal(e.t, "end_turn", r.stopReason(), "%s", r.Result)
	var text strings.Builder
	for _, u := range e.c.updates(mark, session) {
		require.Equal(e.t, "agent_message_chunk", u.Update.SessionUpdate)
		text.WriteString(u.text())
	}
	assert.Equal(e.t, strings.Join(faults.ReplyChunks(tok), ""), model.WithoutCallMarks(text.String()))
	return oneCall(e.t, e.model, n, tok)
}

// ---------------------------------------------------------------------------
// The protocol.

// TestACPHandshakeAndTurns: initialize advertises loadSession and protocol
// version 1; each session is a conversation of its own whose turns see
// their history, the prompt's text passed to the model as is.
func TestACPHandshakeAndTurns(t *testing.T) {
	e := startACP(t, sut.Config{})
	init := e.c.handshake()
	assert.EqualValues(t, 1, init["protocolVersion"])
	caps, _ := init["agentCapabilities"].(map[string]any)
	assert.Equal(t, true, caps["loadSession"], "%v", init)
	assert.Equal(t, []any{}, init["authMethods"])

	s1, s2 := e.c.newSession(), e.c.newSession()
	assert.NotEqual(t, s1, s2)
	assert.Equal(t, toks("u1"), e.ok(s1, "tc-u1"))
	assert.Equal(t, toks("u2"), e.ok(s2, "tc-u2"), "another session")
	assert.Equal(t, toks("u1", "a1", "u3"), e.ok(s1, "tc-u3"))

	// Several text blocks are one message, joined by newlines.
	n := e.model.CallCount()
	r := e.c.call("session/prompt", map[string]any{"sessionId": s2, "prompt": []any{
		map[string]any{"type": "text", "text": "first tc-u4"},
		map[string]any{"type": "resource_link", "name": "x", "uri": "file:///x"},
		map[string]any{"type": "text", "text": "second"},
	}})
	require.Nil(t, r.Error, "%+v", r.Error)
	assert.Equal(t, "end_turn", r.stopReason())
	assert.Equal(t, toks("u2", "a2", "u4"), oneCall(t, e.model, n, "tc-u4"))
}

// TestACPPromptRefusals: what the HTTP server answers 400 or 404 before any
// model call, ACP answers with a JSON-RPC error, and nothing changes.
func TestACPPromptRefusals(t *testing.T) {
	e := startACP(t, sut.Config{})
	s := e.c.newSession()
	require.Equal(t, toks("u1"), e.ok(s, "tc-u1"))
	n := e.model.CallCount()
	for name, tc := range map[string]struct {
		method string
		params any
		code   int
	}{
		"blank prompt":      {"session/prompt", promptParams(s, " \n\t"), -32602},
		"no block":          {"session/prompt", map[string]any{"sessionId": s, "prompt": []any{}}, -32602},
		"image":             {"session/prompt", map[string]any{"sessionId": s, "prompt": []any{map[string]any{"type": "image", "data": "AA==", "mimeType": "image/png"}}}, -32602},
		"no prompt":         {"session/prompt", map[string]any{"sessionId": s}, -32602},
		"unknown session":   {"session/prompt", promptParams("sess_nope", promptText("tc-u2")), -32002},
		"load unknown":      {"session/load", map[string]any{"sessionId": "sess_nope", "cwd": "/", "mcpServers": []any{}}, -32002},
		"relative cwd":      {"session/new", map[string]any{"cwd": "here", "mcpServers": []any{}}, -32602},
		"unknown method":    {"session/teleport", map[string]any{}, -32601},
		"resume not served": {"session/resume", map[string]any{"sessionId": s, "cwd": "/"}, -32601},
	} {
		r := e.c.call(tc.method, tc.params)
		require.NotNil(t, r.Error, "%s: %s", name, r.Result)
		assert.Equal(t, tc.code, r.Error.Code, "%s: %+v", name, r.Error)
	}
	assert.Equal(t, n, e.model.CallCount(), "no refusal reaches the model")
	assert.Equal(t, toks("u1", "a1", "u3"), e.ok(s, "tc-u3"))
}

// TestACPModelFailureAndRefusal: a model that fails is a JSON-RPC error
// naming the HTTP server's 502; a model that refuses (400) ends the turn
// with stopReason refusal. Neither keeps anything of the turn.
func TestACPModelFailureAndRefusal(t *testing.T) {
	e := startACP(t, sut.Config{})
	s := e.c.newSession()
	require.Equal(t, toks("u1"), e.ok(s, "tc-u1"))

	e.model.Script("tc-u2", faults.Fault{Kind: faults.Status, Status: 500})
	r := e.c.prompt(s, "tc-u2")
	require.NotNil(t, r.Error, "%s", r.Result)
	assert.Equal(t, -32603, r.Error.Code)
	assert.Equal(t, 502, r.status(), "%s", r.Error.Data)

	e.model.Script("tc-u3", faults.Fault{Kind: faults.Cut, After: 1})
	r = e.c.prompt(s, "tc-u3")
	require.NotNil(t, r.Error, "a stream cut midway: %s", r.Result)
	assert.Equal(t, 502, r.status())

	e.model.Script("tc-u4", faults.Fault{Kind: faults.Status, Status: 400})
	r = e.c.prompt(s, "tc-u4")
	require.Nil(t, r.Error, "%+v", r.Error)
	assert.Equal(t, "refusal", r.stopReason())

	assert.Equal(t, toks("u1", "a1", "u5"), e.ok(s, "tc-u5"), "nothing of the failed, cut or refused turns")
}

// TestACPMalformedLines: a line that is no JSON-RPC 2.0 message is
// answered with a JSON-RPC error (its id where it had a valid one, else
// null) and skipped, an oversized one unread; the server goes on.
func TestACPMalformedLines(t *testing.T) {
	e := startACP(t, sut.Config{MaxBodyBytes: 4096})
	s := e.c.newSession()
	for _, tc := range []struct {
		line string
		code int
		id   string
	}{
		{"this is not JSON", -32700, "null"},
		{`{"jsonrpc":"2.0","id":7,"method":"session/prompt"`, -32700, "null"},
		{"[1,2,3]", -32600, "null"},
		{`"a string"`, -32600, "null"},
		{`{"jsonrpc":"2.0","params":{}}`, -32600, "null"},
		{`{"jsonrpc":"2.0","id":8,"method":"session/prompt","params":"` + strings.Repeat("x", 8000) + `"}`, -32600, "null"},
		// JSON-RPC 2.0 as written: an id a string, a number or null; the
		// version said; a method named.
		{`{"jsonrpc":"2.0","id":true,"method":"initialize","params":{"protocolVersion":1}}`, -32600, "null"},
		{`{"jsonrpc":"2.0","id":{},"method":"initialize","params":{"protocolVersion":1}}`, -32600, "null"},
		{`{"jsonrpc":"1.0","id":9,"method":"initialize","params":{"protocolVersion":1}}`, -32600, "9"},
		{`{"id":"x","method":"initialize","params":{"protocolVersion":1}}`, -32600, `"x"`},
		{`{"jsonrpc":"2.0","id":10,"method":"","params":{}}`, -32601, "10"},
		{`{"jsonrpc":"2.0","id":11,"method":"session/rerun","params":{}}`, -32601, "11"},
		// Read as strictly as any API's body: a key twice, invalid UTF-8.
		{`{"jsonrpc":"2.0","id":12,"method":"session/cancel","method":"initialize","params":{"protocolVersion":1}}`, -32700, "null"},
		{"{\"jsonrpc\":\"2.0\",\"id\":13,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1,\"x\":\"\xff\"}}", -32700, "null"},
	} {
		mark := e.c.mark()
		e.c.raw(tc.line)
		m := e.c.awaitMsg(mark, func(m rpcMsg) bool { return m.Error != nil })
		assert.Equal(t, tc.id, string(m.ID), "%.40s", tc.line)
		assert.Equal(t, tc.code, m.Error.Code, "%.40s", tc.line)
	}
	e.c.raw("")
	e.c.raw("   ")
	assert.Equal(t, toks("u1"), e.ok(s, "tc-u1"), "the server goes on")
}

// TestACPCancel: session/cancel stops the prompt at once (no model call
// after it), answered cancelled; what stays is the interruption policy's:
// nothing under rollback, the prompt and its completed tool rounds under
// keep-consistent.
func TestACPCancel(t *testing.T) {
	for _, tc := range []struct {
		policy sut.Interruption
		rounds []faults.Round
		held   faults.Point
		kept   []model.Token
		pairs  int
	}{
		{sut.Rollback, nil, faults.Point{}, nil, 0},
		{sut.Rollback, []faults.Round{{faults.ToolEcho, faults.ToolLookup}}, faults.Point{Round: 1}, nil, 0},
		{sut.KeepConsistent, nil, faults.Point{}, nil, 0},
		{sut.KeepConsistent, []faults.Round{{faults.ToolEcho, faults.ToolLookup}, {faults.ToolEcho}}, faults.Point{Round: 1}, toks("u2"), 2},
	} {
		t.Run(fmt.Sprintf("%s/rounds=%d", tc.policy, len(tc.rounds)), func(t *testing.T) {
			e := startACP(t, sut.Config{Interruption: tc.policy})
			s := e.c.newSession()
			require.Equal(t, toks("u1"), e.ok(s, "tc-u1"))
			e.model.ScriptReply("tc-u2", faults.Reply{Rounds: tc.rounds})
			g := e.model.HoldAt("tc-u2", tc.held)
			answer := e.c.start("session/prompt", promptParams(s, promptText("tc-u2")))
			<-g.Arrived()
			calls := e.model.CallCount()
			e.c.notify("session/cancel", map[string]any{"sessionId": s})
			r := e.c.wait(answer)
			require.Nil(t, r.Error, "%+v", r.Error)
			assert.Equal(t, "cancelled", r.stopReason())
			g.Release()
			assert.Equal(t, calls, e.model.CallCount(), "no model call after the cancel")

			n := e.model.CallCount()
			r = e.c.prompt(s, "tc-u3")
			require.Equal(t, "end_turn", r.stopReason(), "%+v", r.Error)
			call := turnCall(t, e.model, n, "tc-u3")
			want := append(append(toks("u1", "a1"), tc.kept...), toks("u3")...)
			assert.Equal(t, want, call.History)
			called := 0
			for _, ev := range call.Tools {
				if ev.Kind == model.ToolCalled {
					called++
				}
			}
			assert.Equal(t, tc.pairs, called, "the completed tool round's calls")
		})
	}
}

// TestACPConcurrency: a second prompt on a busy session waits its turn
// under serialize, and is refused at once under reject (409 in its
// error's data), reaching no model; either way one line of history.
func TestACPConcurrency(t *testing.T) {
	for _, policy := range []sut.Concurrency{sut.Serialize, sut.Reject} {
		t.Run(string(policy), func(t *testing.T) {
			e := startACP(t, sut.Config{Concurrency: policy})
			s := e.c.newSession()
			g := e.model.Gate("tc-u1")
			first := e.c.start("session/prompt", promptParams(s, promptText("tc-u1")))
			<-g.Arrived()
			second := e.c.start("session/prompt", promptParams(s, promptText("tc-u2")))
			if policy == sut.Reject {
				r := e.c.wait(second)
				require.NotNil(t, r.Error, "%s", r.Result)
				assert.Equal(t, 409, r.status(), "%s", r.Error.Data)
			}
			g.Release()
			assert.Equal(t, "end_turn", e.c.wait(first).stopReason())
			if policy == sut.Serialize {
				assert.Equal(t, "end_turn", e.c.wait(second).stopReason())
				assert.Equal(t, toks("u1", "a1", "u2", "a2", "u3"), e.ok(s, "tc-u3"))
				return
			}
			assert.Equal(t, toks("u1", "a1", "u3"), e.ok(s, "tc-u3"))
		})
	}
}

// TestACPLoadReplaysAfterRestart: after a restart, session/load replays
// the committed history (user_message_chunk, tool_call and
// tool_call_update for each tool pair, agent_message_chunk) before it
// answers, and the session goes on where it was; a session not loaded on
// the new connection takes no prompt.
func TestACPLoadReplaysAfterRestart(t *testing.T) {
	e := startACP(t, sut.Config{})
	s := e.c.newSession()
	require.Equal(t, toks("u1"), e.ok(s, "tc-u1"))
	e.model.ScriptReply("tc-u2", faults.Reply{Rounds: []faults.Round{{faults.ToolEcho, faults.ToolLookup}}})
	mark := e.c.mark()
	r := e.c.prompt(s, "tc-u2")
	require.Equal(t, "end_turn", r.stopReason(), "%+v", r.Error)
	var live []string
	for _, u := range e.c.updates(mark, s) {
		live = append(live, describe(u))
	}
	e.model.Script("tc-u3", faults.Fault{Kind: faults.Status, Status: 503})
	require.NotNil(t, e.c.prompt(s, "tc-u3").Error)

	e.restart()
	r = e.c.prompt(s, "tc-u4")
	require.NotNil(t, r.Error, "a session not loaded on this connection")
	assert.Equal(t, -32002, r.Error.Code)

	mark = e.c.mark()
	r = e.c.load(s)
	require.Nil(t, r.Error, "%+v", r.Error)
	assert.JSONEq(t, `{}`, string(r.Result))
	var got []string
	for _, m := range e.c.since(mark) {
		if m.Method == "" {
			break // the answer: every update came before it
		}
		var u update
		require.NoError(t, json.Unmarshal(m.Params, &u))
		require.Equal(t, s, u.SessionID)
		got = append(got, describe(u))
	}
	k1, k2 := model.ToolCallID("tc-u2", 1, 1), model.ToolCallID("tc-u2", 1, 2)
	turn2 := []string{
		"tool_call " + k1 + " echo in_progress", "tool_call " + k2 + " lookup in_progress",
		"tool_call_update " + k1 + " completed", "tool_call_update " + k2 + " completed",
		"agent_message_chunk tc-a2",
	}
	assert.Equal(t, append([]string{"user_message_chunk tc-u1", "agent_message_chunk tc-a1", "user_message_chunk tc-u2"}, turn2...), got)
	assert.Equal(t, turn2, mergeChunks(live), "the tool turn, live, as it is replayed")

	n := e.model.CallCount()
	r = e.c.prompt(s, "tc-u4")
	require.Equal(t, "end_turn", r.stopReason(), "%+v", r.Error)
	call := turnCall(t, e.model, n, "tc-u4")
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u4"), call.History)
	assert.Len(t, call.Tools, 7, "the tool round, between the user messages, survives the restart")
}

// turnCall is the one model call of turn tok among those after the
// first n (a call held at a gate when n was read may come after).
func turnCall(t testing.TB, m *faults.Model, n int, tok model.Token) model.Call {
	t.Helper()
	var of []model.Call
	for _, c := range callsSince(m, n) {
		if c.Turn == tok {
			of = append(of, c)
		}
	}
	require.Len(t, of, 1, "want exactly one model call of %s", tok)
	return of[0]
}

// describe is an update in a line: its kind, and the tokens of a
// message chunk, or a tool call's id, title and status.
func describe(u update) string {
	line := u.Update.SessionUpdate
	switch line {
	case "user_message_chunk", "agent_message_chunk":
		line += " " + strings.Join(tokStrings(model.Tokens(u.text())), ",")
	case "tool_call":
		line += " " + u.Update.ToolCallID + " " + u.Update.Title + " " + u.Update.Status
	case "tool_call_update":
		line += " " + u.Update.ToolCallID + " " + u.Update.Status
	}
	return strings.TrimSpace(line)
}

// mergeChunks drops the lines of message chunks that carry no token: a
// reply streams in several chunks, one of them with its token.
func mergeChunks(lines []string) []string {
	var out []string
	for _, l := range lines {
		if l != "agent_message_chunk" && l != "user_message_chunk" {
			out = append(out, l)
		}
	}
	return out
}

// tokStrings are toks as strings.
func tokStrings(toks []model.Token) []string {
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = string(t)
	}
	return out
}

// TestACPStdinClosingEndsAPromptInFlight: a client that closes its end
// while a prompt runs is a client gone: the server ends cleanly, and the
// turn is rolled back (rollback).
func TestACPStdinClosingEndsAPromptInFlight(t *testing.T) {
	e := startACP(t, sut.Config{})
	s := e.c.newSession()
	require.Equal(t, toks("u1"), e.ok(s, "tc-u1"))
	e.model.Script("tc-u2", faults.Fault{Kind: faults.Hold})
	g := e.model.Gate("tc-u2")
	e.c.start("session/prompt", promptParams(s, promptText("tc-u2")))
	<-g.Arrived()
	g.Release() // on to the hold, which only the server ends
	e.restart()
	require.Nil(t, e.c.load(s).Error)
	assert.Equal(t, toks("u1", "a1", "u3"), e.ok(s, "tc-u3"))
}

// TestACPStopDropsPromptsInFlight: a server stopped (its context ends)
// answers the prompts in flight with an error (503, as the HTTP server's
// stop) and keeps nothing of them.
func TestACPStopDropsPromptsInFlight(t *testing.T) {
	e := startACP(t, sut.Config{Interruption: sut.KeepConsistent})
	s := e.c.newSession()
	require.Equal(t, toks("u1"), e.ok(s, "tc-u1"))
	e.model.ScriptReply("tc-u2", faults.Reply{Rounds: []faults.Round{{faults.ToolEcho}}})
	g := e.model.HoldAt("tc-u2", faults.Point{Round: 1})
	answer := e.c.start("session/prompt", promptParams(s, promptText("tc-u2")))
	<-g.Arrived()
	e.stop()
	r := e.c.wait(answer)
	require.NotNil(t, r.Error, "%s", r.Result)
	assert.Equal(t, 503, r.status(), "%s", r.Error.Data)
	g.Release()
	e.restart()
	require.Nil(t, e.c.load(s).Error)
	assert.Equal(t, toks("u1", "a1", "u3"), e.ok(s, "tc-u3"), "a dropped turn keeps nothing, not even its settled round")
}

// TestACPStalledClientIsGone: a client that stops reading the server's
// output is taken for gone once a write waits past the write timeout: its
// prompt is rolled back and the server ends, whatever the client does.
func TestACPStalledClientIsGone(t *testing.T) {
	defer sut.SetACPWriteTimeout(50 * time.Millisecond)()
	m := startModel(t)
	dir := t.TempDir()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- sut.ServeACP(context.Background(), sut.Config{ModelURL: m.URL(), DataDir: dir}, inR, outW)
	}()
	defer func() { _ = inW.Close(); _ = outR.Close(); _ = outW.Close() }()
	// The client writes, and never reads.
	for _, line := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`,
		`{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}`,
	} {
		_, err := io.WriteString(inW, line+"\n")
		require.NoError(t, err)
	}
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(requestDeadline):
		require.FailNow(t, "the server did not give up on a client that does not read")
	}
}

// ---------------------------------------------------------------------------
// Mutants.

// acpMutantCases show each ACP mutant's bug at the server level: run
// reports whether it showed.
var acpMutantCases = []struct {
	mutant sut.Mutant
	run    func(t *testing.T, e *acpEnv) bool
}{
	{sut.ACPRefusalKeepsPrompt, func(t *testing.T, e *acpEnv) bool {
		s := e.c.newSession()
		require.Equal(t, toks("u1"), e.ok(s, "tc-u1"))
		e.model.Script("tc-u2", faults.Fault{Kind: faults.Status, Status: 400})
		require.Equal(t, "refusal", e.c.prompt(s, "tc-u2").stopReason())
		got := e.ok(s, "tc-u3")
		return assert.ObjectsAreEqual(toks("u1", "a1", "u2", "u3"), got)
	}},
	{sut.ACPCancelCommitsPrompt, func(t *testing.T, e *acpEnv) bool {
		s := e.c.newSession()
		require.Equal(t, toks("u1"), e.ok(s, "tc-u1"))
		g := e.model.Gate("tc-u2")
		answer := e.c.start("session/prompt", promptParams(s, promptText("tc-u2")))
		<-g.Arrived()
		e.c.notify("session/cancel", map[string]any{"sessionId": s})
		require.Equal(t, "cancelled", e.c.wait(answer).stopReason())
		g.Release()
		got := e.ok(s, "tc-u3")
		return assert.ObjectsAreEqual(toks("u1", "a1", "u2", "u3"), got)
	}},
	{sut.ACPCancelAnswersError, func(t *testing.T, e *acpEnv) bool {
		s := e.c.newSession()
		require.Equal(t, toks("u1"), e.ok(s, "tc-u1"))
		g := e.model.Gate("tc-u2")
		answer := e.c.start("session/prompt", promptParams(s, promptText("tc-u2")))
		<-g.Arrived()
		e.c.notify("session/cancel", map[string]any{"sessionId": s})
		r := e.c.wait(answer)
		g.Release()
		// The turn stops either way: nothing of it stays (rollback).
		require.Equal(t, toks("u1", "a1", "u3"), e.ok(s, "tc-u3"))
		return r.Error != nil && r.stopReason() == ""
	}},
	{sut.ACPConcurrentPrompts, func(t *testing.T, e *acpEnv) bool {
		s := e.c.newSession()
		require.Equal(t, toks("u1"), e.ok(s, "tc-u1"))
		g, g3 := e.model.Gate("tc-u2"), e.model.Gate("tc-u3")
		first := e.c.start("session/prompt", promptParams(s, promptText("tc-u2")))
		<-g.Arrived()
		n := e.model.CallCount()
		second := e.c.start("session/prompt", promptParams(s, promptText("tc-u3")))
		// The clean server holds the second prompt behind the first; the
		// mutant runs it at once. The first is let go only once the
		// second has come to rest either way, queued or at the model, so
		// that the mutant's second prompt starts on what the first found.
		for queued := false; !queued; {
			_, waiting, changed := e.cfg.Gauge.Read()
			if queued = waiting > 0; queued {
				break
			}
			select {
			case <-g3.Arrived():
				queued = true
			case <-changed:
			}
		}
		g.Release()
		g3.Release()
		require.Equal(t, "end_turn", e.c.wait(first).stopReason())
		require.Equal(t, "end_turn", e.c.wait(second).stopReason())
		var third []model.Token
		for _, c := range callsSince(e.model, n) {
			if c.Turn == "tc-u3" {
				third = c.History
			}
		}
		return assert.ObjectsAreEqual(toks("u1", "a1", "u3"), third)
	}},
	{sut.ACPLoadDiffers, func(t *testing.T, e *acpEnv) bool {
		s := e.c.newSession()
		require.Equal(t, toks("u1"), e.ok(s, "tc-u1"))
		require.Equal(t, toks("u1", "a1", "u2"), e.ok(s, "tc-u2"))
		e.restart()
		mark := e.c.mark()
		require.Nil(t, e.c.load(s).Error)
		var replayed []model.Token
		for _, u := range e.c.updates(mark, s) {
			replayed = append(replayed, model.Tokens(u.text())...)
		}
		require.Equal(t, toks("u1", "a1", "u2", "a2", "u3"), e.ok(s, "tc-u3"), "the model is sent the whole history")
		return !assert.ObjectsAreEqual(toks("u1", "a1", "u2", "a2"), replayed)
	}},
}

// TestACPMutantsBite: each ACP mutant's bug shows on the server with it,
// and not on the clean server.
func TestACPMutantsBite(t *testing.T) {
	for _, mc := range acpMutantCases {
		t.Run(string(mc.mutant), func(t *testing.T) {
			t.Run("mutant", func(t *testing.T) {
				assert.True(t, mc.run(t, startACP(t, sut.Config{Mutant: mc.mutant, Gauge: &sut.Gauge{}})), "the mutant's bug must show")
			})
			t.Run("clean", func(t *testing.T) {
				assert.False(t, mc.run(t, startACP(t, sut.Config{Gauge: &sut.Gauge{}})), "the clean server must not have the bug")
			})
		})
	}
}

// ---------------------------------------------------------------------------
// A real subprocess: this test binary, re-run as 'serve acp'.

// acpChildEnv, set, makes TestMain serve ACP on stdin and stdout with the
// sut.Config it holds as JSON, instead of running the tests.
const acpChildEnv = "TURNCHECK_SUT_ACP_CHILD"

// childSpec is what the child serves with.
type childSpec struct {
	ModelURL, DataDir, Mutant string
}

// serveACPChild is the child's whole life: it serves until stdin closes.
func serveACPChild(spec string) int {
	var cs childSpec
	if err := json.Unmarshal([]byte(spec), &cs); err != nil {
		fmt.Fprintln(os.Stderr, "bad child spec:", err)
		return 2
	}
	cfg := sut.Config{ModelURL: cs.ModelURL, DataDir: cs.DataDir, Mutant: sut.Mutant(cs.Mutant),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	if err := sut.ServeACP(context.Background(), cfg, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "serve acp:", err)
		return 1
	}
	return 0
}

// acpProcess is the server as a child process.
type acpProcess struct {
	cmd *exec.Cmd
	c   *acpConn
}

// startACPProcess starts the server as a child on cfg, and handshakes.
func startACPProcess(t *testing.T, cfg sut.Config) *acpProcess {
	t.Helper()
	spec, err := json.Marshal(childSpec{ModelURL: cfg.ModelURL, DataDir: cfg.DataDir, Mutant: string(cfg.Mutant)})
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), acpChildEnv+"="+string(spec))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &acpProcess{cmd: cmd, c: newACPConn(t, in, out)}
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.c.read
		_ = p.cmd.Wait()
	})
	p.c.handshake()
	return p
}

// TestACPSubprocess: the server as a real child process over its stdin and
// stdout: turns, a kill -9, a restart on the same data dir where
// session/load brings the session back, and a clean exit (status 0) when
// stdin closes.
func TestACPSubprocess(t *testing.T) {
	m := startModel(t)
	cfg := sut.Config{ModelURL: m.URL(), DataDir: t.TempDir()}
	p := startACPProcess(t, cfg)
	s := p.c.newSession()
	r := p.c.prompt(s, "tc-u1")
	require.Equal(t, "end_turn", r.stopReason(), "%+v", r.Error)
	require.Equal(t, "end_turn", p.c.prompt(s, "tc-u2").stopReason())

	require.NoError(t, p.cmd.Process.Kill()) // kill -9
	<-p.c.read
	_ = p.cmd.Wait()

	p = startACPProcess(t, cfg)
	mark := p.c.mark()
	require.Nil(t, p.c.load(s).Error)
	var replayed []model.Token
	for _, u := range p.c.updates(mark, s) {
		replayed = append(replayed, model.Tokens(u.text())...)
	}
	assert.Equal(t, toks("u1", "a1", "u2", "a2"), replayed)
	n := m.CallCount()
	require.Equal(t, "end_turn", p.c.prompt(s, "tc-u3").stopReason())
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u3"), oneCall(t, m, n, "tc-u3"))

	// A malformed line is answered and the process goes on.
	mark = p.c.mark()
	p.c.raw("{not json")
	assert.Equal(t, -32700, p.c.awaitMsg(mark, func(m rpcMsg) bool { return m.Error != nil }).Error.Code)

	require.NoError(t, p.c.in.Close())
	<-p.c.read
	require.NoError(t, p.cmd.Wait(), "stdin closing ends the server cleanly")
	assert.Equal(t, 0, p.cmd.ProcessState.ExitCode())
}

// TestACPSessionsBindToTheAgentSource: a new session runs with the first
// agent source loaded, and records it; after a relaunch that loads it
// under another query it resumes with it (T8), and where two loaded
// sources share its stable key its prompt is refused (409 in the error's
// data), reaching no model.
func TestACPSessionsBindToTheAgentSource(t *testing.T) {
	am := startAgentModel(t)
	e := &acpEnv{t: t, model: am.Model, cfg: sut.Config{ModelURL: am.URL(), DataDir: t.TempDir(),
		Agents: []string{am.ref("helper", "tag=v1"), am.ref("other", "")}}}
	e.start()
	t.Cleanup(func() { _ = e.close() })
	s := e.c.newSession()
	require.Equal(t, toks("u1"), e.ok(s, "tc-u1"))
	assert.Equal(t, instruction("helper", "tag=v1"), am.lastSystem(t))

	e.cfg.Agents = []string{am.ref("helper", "tag=v2")}
	e.restart()
	require.Nil(t, e.c.load(s).Error)
	require.Equal(t, toks("u1", "a1", "u2"), e.ok(s, "tc-u2"))
	assert.Equal(t, instruction("helper", "tag=v2"), am.lastSystem(t))

	e.cfg.Agents = []string{am.ref("helper", "tag=v3"), am.ref("helper", "tag=v4")}
	e.restart()
	require.Nil(t, e.c.load(s).Error)
	n := e.model.CallCount()
	r := e.c.prompt(s, "tc-u3")
	require.NotNil(t, r.Error, "%s", r.Result)
	assert.Equal(t, 409, r.status(), "%s", r.Error.Data)
	assert.Equal(t, n, e.model.CallCount())
}

// BenchmarkACPPrompt measures one prompt over ACP, in process: the
// JSON-RPC round trip on pipes, the model call, the streamed reply and the
// durable commit. A session takes 100 prompts, then a new one starts.
func BenchmarkACPPrompt(b *testing.B) {
	m, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(b, err)
	defer m.Close()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- sut.ServeACP(context.Background(), sut.Config{ModelURL: m.URL(), DataDir: b.TempDir()}, inR, outW)
		_ = outW.Close()
	}()
	c := newACPConn(b, inW, outR)
	c.handshake()
	session := ""
	b.ResetTimer()
	for i := range b.N {
		if i%100 == 0 {
			session = c.newSession()
		}
		r := c.call("session/prompt", promptParams(session, promptText(model.Token(fmt.Sprintf("tc-u%d", i+1)))))
		if r.stopReason() != "end_turn" {
			b.Fatalf("prompt %d: %+v", i, r.Error)
		}
	}
	b.StopTimer()
	_ = inW.Close()
	require.NoError(b, <-done)
	<-c.read
}

// TestACPClientWritesNoErrorLines: what a client sends never reaches the
// server's log raw, nor as an ERROR line: a notification of a method the
// agent does not serve, with a newline and a forged log line in its
// name, is logged at WARN, the name quoted.
func TestACPClientWritesNoErrorLines(t *testing.T) {
	var log syncbuf.Buffer
	e := startACP(t, sut.Config{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	s := e.c.newSession()
	e.c.raw(`{"jsonrpc":"2.0","method":"session/forged\nlevel=ERROR msg=forged","params":{}}`)
	assert.Equal(t, toks("u1"), e.ok(s, "tc-u1"), "the server goes on")
	// The notification is handled beside the prompt, and may be logged
	// after the prompt's answer.
	require.Eventually(t, func() bool { return strings.Contains(log.String(), `session/forged\nlevel=ERROR msg=forged`) },
		10*time.Second, 5*time.Millisecond, "the client's text, quoted:\n%s", &log)
	assert.NotContains(t, log.String(), "level=ERROR msg=\"failed", "no ERROR line of the client's doing")
	for _, line := range strings.Split(log.String(), "\n") {
		assert.False(t, strings.HasPrefix(line, "level=ERROR msg=forged"), "a forged line: %q", line)
	}
}
