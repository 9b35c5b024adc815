package sut_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Harness: the Agent2Agent protocol.

// a2aAnswer is one JSON-RPC answer: a result, or an error.
type a2aAnswer struct {
	Result struct {
		Kind      string `json:"kind"`
		ID        string `json:"id"`
		TaskID    string `json:"taskId"`
		ContextID string `json:"contextId"`
		Status    struct {
			State string `json:"state"`
		} `json:"status"`
		Final    bool `json:"final"`
		Artifact struct {
			Parts []struct {
				Text string `json:"text"`
			} `json:"parts"`
		} `json:"artifact"`
		History []struct {
			Role      string `json:"role"`
			MessageID string `json:"messageId"`
			Parts     []struct {
				Text string `json:"text"`
			} `json:"parts"`
		} `json:"history"`
	} `json:"result"`
	Error *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Data    struct {
			Status int `json:"status"`
		} `json:"data"`
	} `json:"error"`
}

// rpc sends one JSON-RPC call to the A2A endpoint under key and reads its
// answers: one, or each event of a stream.
func (e *env) rpc(t testing.TB, key, method string, params any) []a2aAnswer {
	t.Helper()
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
	require.NoError(t, err)
	r := postURL(t, e.client, e.srv.URL()+"/a2a", string(body), headers(key, ""))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	var out []a2aAnswer
	if !strings.Contains(r.header.Get("Content-Type"), "text/event-stream") {
		var a a2aAnswer
		require.NoError(t, json.Unmarshal(r.body, &a), "%s", r.body)
		return append(out, a)
	}
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var a a2aAnswer
			require.NoError(t, json.Unmarshal([]byte(data), &a), "%s", data)
			out = append(out, a)
		}
	}
	return out
}

// a2aMessage is message/send's (or message/stream's) params: the user
// message text in context ("" for a new one).
func a2aMessage(context, text string) map[string]any {
	m := map[string]any{"kind": "message", "role": "user", "messageId": "m-" + text, "parts": []map[string]string{{"kind": "text", "text": text}}}
	if context != "" {
		m["contextId"] = context
	}
	return map[string]any{"message": m, "configuration": map[string]any{"blocking": true}}
}

// send sends tok in context with message/send and returns the task as it
// ended.
func (e *env) send(t testing.TB, context string, tok model.Token) a2aAnswer {
	t.Helper()
	answers := e.rpc(t, "", "message/send", a2aMessage(context, string(tok)+" hello"))
	require.Len(t, answers, 1)
	return answers[0]
}

// okTask sends tok in context; it must complete, and its one model call's
// history is returned, with the context.
func (e *env) okTask(t testing.TB, context string, tok model.Token) ([]model.Token, string) {
	t.Helper()
	n := e.model.CallCount()
	a := e.send(t, context, tok)
	require.Nil(t, a.Error)
	require.Equal(t, "completed", a.Result.Status.State)
	return oneCall(t, e.model, n, tok), a.Result.ContextID
}

// ---------------------------------------------------------------------------
// The protocol as served.

func TestA2AServesContextsAndTasks(t *testing.T) {
	e := newEnv(t, sut.Config{})
	card, err := e.client.Get(e.srv.URL() + "/.well-known/agent-card.json")
	require.NoError(t, err)
	var c struct {
		URL          string          `json:"url"`
		Capabilities map[string]bool `json:"capabilities"`
	}
	require.NoError(t, json.NewDecoder(card.Body).Decode(&c))
	_ = card.Body.Close()
	assert.Equal(t, e.srv.URL()+"/a2a", c.URL)
	assert.True(t, c.Capabilities["streaming"])

	hist, ctx := e.okTask(t, "", "tc-u1")
	assert.Equal(t, toks("u1"), hist)
	require.NotEmpty(t, ctx, "the server names the context")
	hist, _ = e.okTask(t, ctx, "tc-u2")
	assert.Equal(t, toks("u1", "a1", "u2"), hist)

	// A stream: the task first, then its reply, then its end.
	events := e.rpc(t, "", "message/stream", a2aMessage(ctx, "tc-u3 hello"))
	require.GreaterOrEqual(t, len(events), 3)
	first, last := events[0].Result, events[len(events)-1].Result
	assert.Equal(t, "task", first.Kind)
	assert.Equal(t, ctx, first.ContextID)
	assert.Equal(t, "status-update", last.Kind)
	assert.Equal(t, "completed", last.Status.State)
	assert.True(t, last.Final)
	var reply strings.Builder
	for _, ev := range events {
		for _, p := range ev.Result.Artifact.Parts {
			reply.WriteString(p.Text)
		}
	}
	assert.Contains(t, reply.String(), "tc-a3")

	// tasks/get: the task's own messages.
	got := e.rpc(t, "", "tasks/get", map[string]string{"id": first.ID})[0].Result
	require.Len(t, got.History, 2)
	assert.Contains(t, got.History[0].Parts[0].Text, "tc-u3")
	assert.Equal(t, "agent", got.History[1].Role)
	assert.Contains(t, got.History[1].Parts[0].Text, "tc-a3")
	cancel := e.rpc(t, "", "tasks/cancel", map[string]string{"id": first.ID})[0]
	require.NotNil(t, cancel.Error, "an ended task is not cancelable")
	assert.Equal(t, -32002, cancel.Error.Code)

	n := e.model.CallCount()
	for name, tc := range map[string]struct {
		method string
		params any
		code   int
		status int
	}{
		"a blank message": {"message/send", a2aMessage(ctx, "  \n"), -32602, http.StatusBadRequest},
		"a message with no parts": {"message/send", map[string]any{"message": map[string]any{"role": "user", "parts": []any{},
			"contextId": ctx}}, -32602, http.StatusBadRequest},
		"an unknown context":  {"message/send", a2aMessage("ctx-nowhere", "tc-u4 hello"), -32602, http.StatusNotFound},
		"an unknown method":   {"tasks/resubscribe", map[string]string{"id": first.ID}, -32601, http.StatusNotFound},
		"an unknown task":     {"tasks/get", map[string]string{"id": "task-x"}, -32001, http.StatusNotFound},
		"a message to a task": {"message/send", map[string]any{"message": map[string]any{"role": "user", "taskId": first.ID, "parts": []map[string]string{{"kind": "text", "text": "tc-u5"}}}}, -32602, http.StatusBadRequest},
	} {
		a := e.rpc(t, "", tc.method, tc.params)[0]
		require.NotNil(t, a.Error, name)
		assert.Equal(t, tc.code, a.Error.Code, name)
		assert.Equal(t, tc.status, a.Error.Data.Status, name)
	}
	assert.Empty(t, callsSince(e.model, n), "no refused message reaches the model")
}

// TestA2AContextsAreScopedPerKey: another key's context is not found.
func TestA2AContextsAreScopedPerKey(t *testing.T) {
	e := newEnv(t, sut.Config{Keys: []string{"key-a", "key-b"}})
	a := e.rpc(t, "key-a", "message/send", a2aMessage("", "tc-u1 hello"))[0]
	require.Nil(t, a.Error)
	b := e.rpc(t, "key-b", "message/send", a2aMessage(a.Result.ContextID, "tc-u2 hello"))[0]
	require.NotNil(t, b.Error)
	assert.Equal(t, http.StatusNotFound, b.Error.Data.Status)
	got := e.rpc(t, "key-b", "tasks/get", map[string]string{"id": a.Result.ID})[0]
	require.NotNil(t, got.Error, "nor its tasks")
}

// streamUntilHeld starts tok as message/stream in context, held by the
// model at its first call, and returns the task's id (its first event)
// and the rest of the stream's answers once they come.
func (e *env) streamUntilHeld(t *testing.T, context string, tok model.Token) (string, *faults.Gate, <-chan []a2aAnswer) {
	t.Helper()
	g := e.model.Gate(tok)
	t.Cleanup(g.Release)
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "message/stream", "params": a2aMessage(context, string(tok)+" hello")})
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.srv.URL()+"/a2a", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	events := bufio.NewScanner(resp.Body)
	var id string
	for id == "" && events.Scan() {
		if data, ok := strings.CutPrefix(events.Text(), "data: "); ok {
			var a a2aAnswer
			require.NoError(t, json.Unmarshal([]byte(data), &a))
			id = a.Result.ID
		}
	}
	require.NotEmpty(t, id, "the task comes first")
	<-g.Arrived()
	rest := make(chan []a2aAnswer, 1)
	go func() {
		defer resp.Body.Close()
		var out []a2aAnswer
		for events.Scan() {
			if data, ok := strings.CutPrefix(events.Text(), "data: "); ok {
				var a a2aAnswer
				_ = json.Unmarshal([]byte(data), &a)
				out = append(out, a)
			}
		}
		rest <- out
	}()
	return id, g, rest
}

// TestA2ACancel: tasks/cancel ends a running task canceled, and under
// rollback nothing of it stays.
func TestA2ACancel(t *testing.T) {
	e := newEnv(t, sut.Config{})
	_, ctx := e.okTask(t, "", "tc-u1")
	id, _, rest := e.streamUntilHeld(t, ctx, "tc-u2")
	cancelled := e.rpc(t, "", "tasks/cancel", map[string]string{"id": id})[0]
	require.Nil(t, cancelled.Error)
	assert.Equal(t, "canceled", cancelled.Result.Status.State)
	events := <-rest
	require.NotEmpty(t, events)
	assert.Equal(t, "canceled", events[len(events)-1].Result.Status.State)
	hist, _ := e.okTask(t, ctx, "tc-u3")
	assert.Equal(t, toks("u1", "a1", "u3"), hist)
}

// a2aMutantCases show each A2A mutant's bug at the server level: run
// reports whether it showed.
var a2aMutantCases = []struct {
	mutant sut.Mutant
	run    func(t *testing.T, e *env, gauge *sut.Gauge) bool
}{
	{sut.A2AContextRace, func(t *testing.T, e *env, gauge *sut.Gauge) bool {
		_, ctx := e.okTask(t, "", "tc-u1")
		_, first, rest := e.streamUntilHeld(t, ctx, "tc-u2")
		// The second task of the context: under the lock it waits for the
		// first (the gauge says so); without, it runs at once on the same
		// history (the model holds it).
		n := e.model.CallCount()
		second := e.model.Gate("tc-u3")
		done := make(chan a2aAnswer, 1)
		go func() { done <- e.send(t, ctx, "tc-u3") }()
		for {
			_, waiting, changed := gauge.Read()
			if waiting > 0 {
				first.Release()
				second.Release()
				<-rest
				<-done
				return false
			}
			select {
			case <-second.Arrived():
				second.Release()
				<-done
				first.Release()
				<-rest
				calls := callsSince(e.model, n)
				require.NotEmpty(t, calls)
				return assert.ObjectsAreEqual(toks("u1", "a1", "u3"), calls[0].History)
			case <-changed:
			}
		}
	}},
	{sut.A2AFailedTaskStays, func(t *testing.T, e *env, _ *sut.Gauge) bool {
		_, ctx := e.okTask(t, "", "tc-u1")
		e.model.Script("tc-u2", faults.Fault{Kind: faults.Status, Status: 500})
		failed := e.send(t, ctx, "tc-u2")
		require.Nil(t, failed.Error)
		require.Equal(t, "failed", failed.Result.Status.State)
		hist, _ := e.okTask(t, ctx, "tc-u3")
		return assert.ObjectsAreEqual(toks("u1", "a1", "u2", "u3"), hist)
	}},
	{sut.A2ACancelCommits, func(t *testing.T, e *env, _ *sut.Gauge) bool {
		_, ctx := e.okTask(t, "", "tc-u1")
		id, _, rest := e.streamUntilHeld(t, ctx, "tc-u2")
		require.Equal(t, "canceled", e.rpc(t, "", "tasks/cancel", map[string]string{"id": id})[0].Result.Status.State)
		<-rest
		hist, _ := e.okTask(t, ctx, "tc-u3")
		return assert.ObjectsAreEqual(toks("u1", "a1", "u2", "u3"), hist)
	}},
	{sut.A2ACancelIgnored, func(t *testing.T, e *env, _ *sut.Gauge) bool {
		_, ctx := e.okTask(t, "", "tc-u1")
		id, held, rest := e.streamUntilHeld(t, ctx, "tc-u2")
		require.Equal(t, "canceled", e.rpc(t, "", "tasks/cancel", map[string]string{"id": id})[0].Result.Status.State)
		// The model answers once the agent said canceled: an agent that
		// stopped the task has given its call up by then.
		held.Release()
		answers := <-rest
		for _, a := range answers {
			if a.Result.Status.State != "" {
				require.Equal(t, "canceled", a.Result.Status.State, "the stream says what tasks/cancel said")
			}
		}
		hist, _ := e.okTask(t, ctx, "tc-u3")
		return assert.ObjectsAreEqual(toks("u1", "a1", "u2", "a2", "u3"), hist)
	}},
	{sut.A2ATaskRerun, func(t *testing.T, e *env, _ *sut.Gauge) bool {
		_, ctx := e.okTask(t, "", "tc-u1")
		first := e.send(t, ctx, "tc-u2")
		require.Equal(t, "completed", first.Result.Status.State)
		n := e.model.CallCount()
		m := a2aMessage(ctx, "tc-u2 hello")
		m["message"].(map[string]any)["taskId"] = first.Result.ID
		again := e.rpc(t, "", "message/send", m)[0]
		return again.Error == nil && e.model.CallCount() > n
	}},
	{sut.A2ATaskHistoryContext, func(t *testing.T, e *env, _ *sut.Gauge) bool {
		_, ctx := e.okTask(t, "", "tc-u1")
		second := e.send(t, ctx, "tc-u2")
		got := e.rpc(t, "", "tasks/get", map[string]string{"id": second.Result.ID})[0].Result
		var texts []string
		for _, m := range got.History {
			texts = append(texts, fmt.Sprint(m.Parts))
		}
		return strings.Contains(strings.Join(texts, " "), "tc-u1")
	}},
}

func TestA2AMutantsBite(t *testing.T) {
	for _, mc := range a2aMutantCases {
		t.Run(string(mc.mutant), func(t *testing.T) {
			t.Run("mutant", func(t *testing.T) {
				g := &sut.Gauge{}
				assert.True(t, mc.run(t, newEnv(t, sut.Config{Mutant: mc.mutant, Gauge: g}), g), "the mutant's bug must show")
			})
			t.Run("clean", func(t *testing.T) {
				g := &sut.Gauge{}
				assert.False(t, mc.run(t, newEnv(t, sut.Config{Gauge: g}), g), "the clean server must not have the bug")
			})
		})
	}
}

// TestA2ABodiesAsStrictAsAnyAPI: an A2A call is read as every other API's
// body is: one JSON value, in valid UTF-8, with no key twice (a method
// given twice never runs the last one), and a message's text at most
// MaxContentBytes; each refused with a JSON-RPC error, no model call.
func TestA2ABodiesAsStrictAsAnyAPI(t *testing.T) {
	e := newEnv(t, sut.Config{})
	msg := func(text string) string {
		return `{"kind":"message","role":"user","messageId":"m1","parts":[{"kind":"text","text":"` + text + `"}]}`
	}
	for name, body := range map[string]string{
		"a method twice":  `{"jsonrpc":"2.0","id":1,"method":"tasks/get","method":"message/send","params":{"message":` + msg("tc-u1 hello") + `}}`,
		"invalid UTF-8":   `{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":` + msg("tc-u1 \xff") + `}}`,
		"over the cap":    `{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":` + msg("tc-u1 "+strings.Repeat("x", 300<<10)) + `}}`,
		"trailing things": `{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":` + msg("tc-u1 hello") + `}} {}`,
	} {
		n := e.model.CallCount()
		r := postURL(t, e.client, e.srv.URL()+"/a2a", body, headers("", ""))
		var a a2aAnswer
		require.NoError(t, json.Unmarshal(r.body, &a), "%s: %s", name, r.body)
		assert.NotNil(t, a.Error, "%s: refused with a JSON-RPC error: %s", name, r.body)
		assert.Equal(t, n, e.model.CallCount(), "%s: no model call", name)
	}
}

// TestA2AJSONRPCByTheBook: the endpoint keeps JSON-RPC 2.0's rules as
// written, whatever a lenient client would get away with: an id is a
// string, a number or null; a call without one is a notification, which
// gets no answer and runs nothing; "jsonrpc" is "2.0"; and the agent's
// own messages carry a messageId. (An unknown method, context or task:
// TestA2AServesContextsAndTasks.)
func TestA2AJSONRPCByTheBook(t *testing.T) {
	e := newEnv(t, sut.Config{})
	msg := `{"message":{"kind":"message","role":"user","messageId":"m1","parts":[{"kind":"text","text":"tc-u1 hello"}]}}`
	for name, c := range map[string]struct {
		body string
		code int
	}{
		"id true":      {`{"jsonrpc":"2.0","id":true,"method":"message/send","params":` + msg + `}`, -32600},
		"id an object": {`{"jsonrpc":"2.0","id":{},"method":"message/send","params":` + msg + `}`, -32600},
		"id an array":  {`{"jsonrpc":"2.0","id":[],"method":"message/send","params":` + msg + `}`, -32600},
		"jsonrpc 1.0":  {`{"jsonrpc":"1.0","id":1,"method":"message/send","params":` + msg + `}`, -32600},
	} {
		n := e.model.CallCount()
		r := postURL(t, e.client, e.srv.URL()+"/a2a", c.body, headers("", ""))
		var a a2aAnswer
		require.NoError(t, json.Unmarshal(r.body, &a), "%s: %s", name, r.body)
		require.NotNil(t, a.Error, "%s: %s", name, r.body)
		assert.Equal(t, c.code, a.Error.Code, "%s: %s", name, r.body)
		assert.Equal(t, n, e.model.CallCount(), "%s: no model call", name)
	}

	n := e.model.CallCount()
	r := postURL(t, e.client, e.srv.URL()+"/a2a", `{"jsonrpc":"2.0","method":"message/send","params":`+msg+`}`, headers("", ""))
	assert.Equal(t, http.StatusNoContent, r.status, "a notification: %s", r.body)
	assert.Empty(t, r.body)
	assert.Equal(t, n, e.model.CallCount(), "a notification runs nothing")

	a := e.send(t, "", "tc-u3")
	require.Nil(t, a.Error)
	got := e.rpc(t, "", "tasks/get", map[string]string{"id": a.Result.ID})
	require.Len(t, got, 1)
	var agent int
	for _, m := range got[0].Result.History {
		if m.Role == "agent" {
			agent++
			assert.NotEmpty(t, m.MessageID, "the agent's message carries a messageId")
		}
	}
	assert.Equal(t, 1, agent)
}

// TestA2ATasksKeptWithinTheMemoryBudget: the tasks an A2A agent keeps for
// tasks/get are counted in the memory budget, as the conversation cache
// is: with replies of 1 MiB, finished tasks are let go of (oldest first)
// so that what is kept stays inside the budget, and the newest is still
// there. Bytes are counted, not measured: the same on any machine.
func TestA2ATasksKeptWithinTheMemoryBudget(t *testing.T) {
	t.Parallel()
	const replySize = 1 << 20
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for left := replySize; left > 0; left -= 32 << 10 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", strings.Repeat("x", min(left, 32<<10)))
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer model.Close()
	// The least budget a turn at these limits takes is about 13 MiB (its
	// reply may be as long as its history): 32 tasks of 1 MiB are more.
	const budget = 16 << 20
	srv, err := sut.Start(sut.Config{ModelURL: model.URL + "/v1", DataDir: t.TempDir(), MaxMemory: budget,
		MaxBodyBytes: 64 << 10, MaxHistoryBytes: 256 << 10}, "127.0.0.1:0")
	require.NoError(t, err)
	defer srv.Close()
	client := &http.Client{Timeout: requestDeadline}
	defer client.CloseIdleConnections()
	call := func(method string, params any) a2aAnswer {
		body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
		require.NoError(t, err)
		r := postURL(t, client, srv.URL()+"/a2a", string(body), nil)
		var a a2aAnswer
		require.NoError(t, json.Unmarshal(r.body, &a), "%.200s", r.body)
		return a
	}
	var ids []string
	for i := range 32 {
		a := call("message/send", a2aMessage("", fmt.Sprintf("tc-u%d hello", i+1)))
		require.Nil(t, a.Error)
		require.Equal(t, "completed", a.Result.Status.State)
		ids = append(ids, a.Result.ID)
	}
	kept := 0
	for _, id := range ids {
		if a := call("tasks/get", map[string]string{"id": id}); a.Error == nil {
			kept++
		} else {
			assert.Equal(t, -32001, a.Error.Code)
		}
	}
	assert.LessOrEqual(t, kept*replySize, budget, "%d tasks of 1 MiB kept", kept)
	assert.Nil(t, call("tasks/get", map[string]string{"id": ids[len(ids)-1]}).Error, "the newest task is kept")
	assert.NotNil(t, call("tasks/get", map[string]string{"id": ids[0]}).Error, "the oldest is let go of")
}
