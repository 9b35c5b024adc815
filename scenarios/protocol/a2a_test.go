package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// a2aAgent is a scripted A2A agent: answer writes what it answers each
// message with; tasks/get and tasks/cancel are answered from get and
// cancel. It records the methods it was called with.
type a2aAgent struct {
	mu      sync.Mutex
	methods []string
	bodies  []json.RawMessage
	answer  func(w http.ResponseWriter, r *http.Request)
	get     func(id string) string
	cancel  func(id string) string
}

func (a *a2aAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == a2aCard {
		fmt.Fprint(w, `{"name":"scripted","url":"http://`+r.Host+`/rpc"}`)
		return
	}
	var call struct {
		ID     int             `json:"id"`
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	raw, _ := io.ReadAll(r.Body)
	if r.URL.Path != "/rpc" || json.Unmarshal(raw, &call) != nil {
		http.NotFound(w, r)
		return
	}
	a.mu.Lock()
	a.methods = append(a.methods, call.Method)
	a.bodies = append(a.bodies, raw)
	a.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(raw)) // for answer to read again
	var p struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(call.Params, &p)
	switch call.Method {
	case a2aStream, a2aSend:
		a.answer(w, r)
	case a2aGet:
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%d,"result":%s}`, call.ID, a.get(p.ID))
	case a2aCancel:
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%d,"result":%s}`, call.ID, a.cancel(p.ID))
	}
}

func (a *a2aAgent) called() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.methods...)
}

// events writes a stream of JSON-RPC answers, one result each.
func events(w http.ResponseWriter, results ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, r := range results {
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":%s}\n\n", r)
		w.(http.Flusher).Flush()
	}
}

func task(id, ctx, state string, history ...string) string {
	return fmt.Sprintf(`{"kind":"task","id":%q,"contextId":%q,"status":{"state":%q},"history":[%s]}`, id, ctx, state, strings.Join(history, ","))
}

func artifact(task, ctx, text string) string {
	return fmt.Sprintf(`{"kind":"artifact-update","taskId":%q,"contextId":%q,"artifact":{"artifactId":"a1","parts":[{"kind":"text","text":%q}]}}`, task, ctx, text)
}

func status(task, ctx, state string) string {
	return fmt.Sprintf(`{"kind":"status-update","taskId":%q,"contextId":%q,"status":{"state":%q},"final":true}`, task, ctx, state)
}

func msg(role, text string) string {
	return fmt.Sprintf(`{"role":%q,"parts":[{"kind":"text","text":%q}]}`, role, text)
}

func a2aClient(t *testing.T, agent *a2aAgent, api targets.A2AAPI) *Client {
	t.Helper()
	srv := httptest.NewServer(agent)
	t.Cleanup(srv.Close)
	c := NewClient([]string{srv.URL}, targets.Profile{Protocol: targets.A2A, A2AAPI: &api, Model: "m", ClientTimeout: 5 * time.Second}, "")
	t.Cleanup(c.Close)
	return c
}

var convA2A = model.ConversationRef{ID: "conv-1"}

func turn(tok model.Token, stream bool) plan.Send {
	return plan.Send{Conv: convA2A, Token: tok, Messages: userMessage("Please remember " + string(tok) + "."), Stream: stream}
}

// TestA2AContextFromTheAnswer: under context_ids: server, a conversation's
// first message names no context, the answer's names it, and later
// turns name that one; the reply is the artifact's text, and the
// endpoint is the card's.
func TestA2AContextFromTheAnswer(t *testing.T) {
	agent := &a2aAgent{
		answer: func(w http.ResponseWriter, r *http.Request) {
			events(w, task("t1", "ctx-9", "working"), artifact("t1", "ctx-9", "tc-a1 noted"), status("t1", "ctx-9", stateCompleted))
		},
		get: func(string) string {
			return task("t1", "ctx-9", stateCompleted, msg("user", "tc-u1"), msg("agent", "tc-a1 noted"))
		},
	}
	c := a2aClient(t, agent, targets.A2AAPI{})
	first := c.NewRequest(context.Background(), turn("tc-u1", true))
	assert.Equal(t, "/rpc", first.Path, "the card's url")
	assert.Empty(t, first.Session)
	out := c.Send(context.Background(), first)
	assert.Equal(t, model.OK, out.Outcome, out.Detail)
	assert.Equal(t, "tc-a1 noted", out.Reply)
	assert.Empty(t, out.Breaches)
	next := c.NewRequest(context.Background(), turn("tc-u2", false))
	assert.Equal(t, "ctx-9", next.Session)
	assert.Contains(t, string(next.Body), `"contextId":"ctx-9"`)
	assert.Contains(t, string(next.Body), `"method":"message/send"`)
	assert.Equal(t, []string{a2aStream, a2aGet}, agent.called(), "the finished task is read back")
}

// TestA2AFirstTurnAlone: while a conversation's first turn is in flight,
// a turn beside it has no context to name: it is held back (Waits), and
// goes once the first turn's answer named the context: a stream's first
// event, or a message/send's answer at the task's end. Only where the
// first turn ended without naming one is it not sent, and it says so.
func TestA2AFirstTurnAlone(t *testing.T) {
	release := make(chan struct{})
	var asked sync.Map // the contextId each message came with, by its text
	agent := &a2aAgent{
		answer: func(w http.ResponseWriter, r *http.Request) {
			var call struct {
				Method string `json:"method"`
				Params struct {
					Message struct {
						ContextID string            `json:"contextId"`
						Parts     []json.RawMessage `json:"parts"`
					} `json:"message"`
				} `json:"params"`
			}
			body, _ := io.ReadAll(r.Body)
			require.NoError(t, json.Unmarshal(body, &call))
			asked.Store(string(call.Params.Message.Parts[0]), call.Params.Message.ContextID)
			if call.Params.Message.ContextID == "" {
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}
			if call.Method == a2aSend {
				fmt.Fprintf(w, `{"jsonrpc":"2.0","id":1,"result":%s}`, task("t1", "ctx-7", stateCompleted))
				return
			}
			events(w, task("t1", "ctx-7", "working"), status("t1", "ctx-7", stateCompleted))
		},
		get: func(string) string { return task("t1", "ctx-7", stateCompleted) },
	}
	for _, firstStreams := range []bool{false, true} {
		release = make(chan struct{})
		c := a2aClient(t, agent, targets.A2AAPI{})
		first := c.NewRequest(context.Background(), turn("tc-u1", firstStreams))
		assert.Nil(t, first.Waits)
		done := make(chan Response)
		go func() { done <- c.Send(context.Background(), first) }()
		second := c.NewRequest(context.Background(), turn("tc-u2", true))
		assert.Empty(t, second.Unsent, "beside a first turn in flight, it waits")
		require.NotNil(t, second.Waits)
		sent := make(chan Response)
		go func() { sent <- c.Send(context.Background(), second) }()
		select {
		case <-second.Waits:
			if !firstStreams {
				t.Fatal("beside a message/send, it went before the first turn's answer")
			}
		case <-time.After(100 * time.Millisecond):
		}
		close(release)
		assert.Equal(t, model.OK, (<-done).Outcome)
		out := <-sent
		assert.Equal(t, model.OK, out.Outcome, out.Detail)
		require.NotNil(t, out.Sent, "the request as it went")
		assert.Equal(t, "ctx-7", out.Sent.Session, "in the context the first turn's answer named")
		assert.Contains(t, string(out.Sent.Body), `"contextId":"ctx-7"`)
	}

	// The first turn is refused before its task began: no context, and
	// the one beside it is not sent, saying why.
	refusing := &a2aAgent{answer: func(w http.ResponseWriter, r *http.Request) {
		<-release
		fmt.Fprint(w, `{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"no"}}`)
	}}
	release = make(chan struct{})
	c := a2aClient(t, refusing, targets.A2AAPI{})
	first := c.NewRequest(context.Background(), turn("tc-u1", false))
	done := make(chan Response)
	go func() { done <- c.Send(context.Background(), first) }()
	second := c.NewRequest(context.Background(), turn("tc-u2", false))
	sent := make(chan Response)
	go func() { sent <- c.Send(context.Background(), second) }()
	close(release)
	assert.Equal(t, model.Fail, (<-done).Outcome)
	out := <-sent
	assert.Equal(t, CauseUnsent, out.Cause)
	assert.Contains(t, out.Detail, "ended without naming a context")

	named := a2aClient(t, &a2aAgent{}, targets.A2AAPI{ContextIDs: targets.ContextsClient})
	a, b := named.NewRequest(context.Background(), turn("tc-u1", true)), named.NewRequest(context.Background(), turn("tc-u2", true))
	assert.Equal(t, "conv-1", a.Session, "the client names the context")
	assert.Equal(t, a.Session, b.Session)
	assert.Empty(t, b.Unsent)
	assert.Nil(t, b.Waits)
}

// TestA2AHostileAgent: what an agent answers that A2A does not allow, or
// that says nothing of the task, gets a clear outcome, never a hang.
func TestA2AHostileAgent(t *testing.T) {
	for name, tc := range map[string]struct {
		answer  func(w http.ResponseWriter)
		get     string
		outcome model.Outcome
		status  int
		detail  string
		breach  string
	}{
		"an unknown method": {
			answer: func(w http.ResponseWriter) {
				fmt.Fprint(w, `{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found"}}`)
			},
			outcome: model.Fail, status: http.StatusNotImplemented, detail: "Method not found (code -32601)",
		},
		"a stream dropped mid-task, the task read back": {
			answer: func(w http.ResponseWriter) { events(w, task("t1", "conv-1", "working")) },
			get:    task("t1", "conv-1", stateCompleted),
			// The task's end is read with tasks/get.
			outcome: model.OK,
		},
		"a stream dropped before any task": {
			answer: func(w http.ResponseWriter) {
				w.Header().Set("Content-Type", "text/event-stream")
			},
			outcome: model.Unknown, detail: "stream ended before the task's end",
		},
		"a task of another context": {
			answer:  func(w http.ResponseWriter) { events(w, task("t1", "ctx-other", "working")) },
			outcome: model.Unknown, detail: `context "ctx-other", for a message sent in context "conv-1"`,
			breach: `a task of context "ctx-other"`,
		},
		"a failed task": {
			answer: func(w http.ResponseWriter) {
				events(w, task("t1", "conv-1", "working"), status("t1", "conv-1", stateFailed))
			},
			get:     task("t1", "conv-1", stateFailed),
			outcome: model.Fail, status: http.StatusBadGateway, detail: "task failed",
		},
		"a canceled task the client did not ask for": {
			answer:  func(w http.ResponseWriter) { events(w, status("t1", "conv-1", stateCanceled)) },
			get:     task("t1", "conv-1", stateCanceled),
			outcome: model.Fail, status: http.StatusInternalServerError, detail: "did not ask for",
		},
		"a task history with another turn's message": {
			answer:  func(w http.ResponseWriter) { events(w, status("t1", "conv-1", stateCompleted)) },
			get:     task("t1", "conv-1", stateCompleted, msg("user", "tc-u1"), msg("user", "tc-u0")),
			outcome: model.OK, breach: "shows tc-u0 in its history",
		},
		"a task history without the task's message": {
			answer:  func(w http.ResponseWriter) { events(w, status("t1", "conv-1", stateCompleted)) },
			get:     task("t1", "conv-1", stateCompleted, msg("agent", "tc-a1")),
			outcome: model.OK, breach: "without the task's own message, tc-u1",
		},
		"a message in place of a task": {
			answer: func(w http.ResponseWriter) {
				fmt.Fprint(w, `{"jsonrpc":"2.0","id":1,"result":{"kind":"message","role":"agent","contextId":"conv-1","parts":[{"kind":"text","text":"tc-a1"}]}}`)
			},
			outcome: model.OK,
		},
		"no JSON-RPC at all": {
			answer:  func(w http.ResponseWriter) { fmt.Fprint(w, "<html>hello</html>") },
			outcome: model.Unknown, detail: "malformed JSON-RPC answer",
		},
	} {
		t.Run(name, func(t *testing.T) {
			agent := &a2aAgent{
				answer: func(w http.ResponseWriter, _ *http.Request) { tc.answer(w) },
				get: func(string) string {
					if tc.get == "" {
						return task("t1", "conv-1", "working")
					}
					return tc.get
				},
			}
			c := a2aClient(t, agent, targets.A2AAPI{Path: "/rpc", ContextIDs: targets.ContextsClient})
			c.profile.ClientTimeout = time.Second
			out := c.Send(context.Background(), c.NewRequest(context.Background(), turn("tc-u1", true)))
			assert.Equal(t, tc.outcome, out.Outcome, out.Detail)
			if tc.status == 0 {
				tc.status = http.StatusOK // the answer's, where the task's end says no other
			}
			assert.Equal(t, tc.status, out.Status)
			assert.Contains(t, out.Detail, tc.detail)
			if tc.breach == "" {
				assert.Empty(t, out.Breaches)
			} else {
				require.NotEmpty(t, out.Breaches)
				assert.Contains(t, strings.Join(out.Breaches, "; "), tc.breach)
			}
		})
	}
}

// TestA2AHistoryOfAnEarlierCheck: a task read back whose history holds a
// message of another check's conversation (on an agent shared by a
// run's checks, each message names its check) is a breach that names
// that check, so that its steps can be run again before this one's.
func TestA2AHistoryOfAnEarlierCheck(t *testing.T) {
	const ns, ctx = "tc0a1b2c-2-", "tc0a1b2c-2-conv-1"
	agent := &a2aAgent{
		answer: func(w http.ResponseWriter, _ *http.Request) { events(w, status("t1", ctx, stateCompleted)) },
		get: func(string) string {
			return task("t1", ctx, stateCompleted, msg("user", "Please remember tc-u6. (tc0a1b2c-1)"), msg("agent", "tc-a6"),
				msg("user", "Please remember tc-u1. (tc0a1b2c-2)"))
		},
	}
	srv := httptest.NewServer(agent)
	t.Cleanup(srv.Close)
	api := targets.A2AAPI{Path: "/rpc", ContextIDs: targets.ContextsClient}
	c := NewClient([]string{srv.URL}, targets.Profile{Protocol: targets.A2A, A2AAPI: &api, Model: "m", ClientTimeout: 5 * time.Second}, ns)
	t.Cleanup(c.Close)
	out := c.Send(context.Background(), c.NewRequest(context.Background(), turn("tc-u1", true)))
	assert.Equal(t, model.OK, out.Outcome, out.Detail)
	require.NotEmpty(t, out.Breaches)
	assert.Contains(t, strings.Join(out.Breaches, "; "), "shows tc-u6 tc-a6 in its history")
	assert.Equal(t, []string{"(tc0a1b2c-1)"}, out.ForeignFrom)
}

// TestA2AAbort: the client's abort is tasks/cancel, sent once the task is
// known; a task that then ends canceled is an interrupted turn
// (Cancelled), one that completed first is ok. A dropped connection is
// the other abort: nothing is sent for it.
func TestA2AAbort(t *testing.T) {
	for _, tc := range []struct {
		name, how, end string
		outcome        model.Outcome
		cancelled      bool
		calls          []string
	}{
		{"cancelled", plan.AbortCancel, stateCanceled, model.Unknown, true, []string{a2aStream, a2aCancel, a2aGet}},
		{"completed first", plan.AbortCancel, stateCompleted, model.OK, false, []string{a2aStream, a2aCancel, a2aGet}},
		{"dropped", plan.AbortDrop, "", model.Unknown, false, []string{a2aStream}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cancelled := make(chan struct{})
			var once sync.Once
			agent := &a2aAgent{
				answer: func(w http.ResponseWriter, r *http.Request) {
					events(w, task("t1", "conv-1", "working"))
					select {
					case <-cancelled:
						events(w, status("t1", "conv-1", tc.end))
					case <-r.Context().Done():
					}
				},
				cancel: func(string) string {
					once.Do(func() { close(cancelled) })
					return task("t1", "conv-1", stateCanceled)
				},
				get: func(string) string { return task("t1", "conv-1", tc.end) },
			}
			c := a2aClient(t, agent, targets.A2AAPI{Path: "/rpc", ContextIDs: targets.ContextsClient})
			s := turn("tc-u1", true)
			s.Abort, s.TaskAbort = true, tc.how
			ctx, abort := context.WithCancel(context.Background())
			req := c.NewRequest(ctx, s)
			go func() {
				for len(agent.called()) == 0 {
					time.Sleep(time.Millisecond)
				}
				abort()
			}()
			out := c.Send(ctx, req)
			assert.Equal(t, tc.outcome, out.Outcome, out.Detail)
			assert.Equal(t, tc.cancelled, out.Cancelled)
			assert.False(t, out.RanOn)
			assert.Equal(t, tc.calls, agent.called())
		})
	}
}

// TestA2AMessageSentAgainIsTheTasksOwn: a message that carries an earlier
// turn's text again (an invalid continuation naming a finished task, with
// that task's message) is the task's own message: tasks/get showing it,
// and the reply to it, is no breach; another turn's message still is.
func TestA2AMessageSentAgainIsTheTasksOwn(t *testing.T) {
	for name, c := range map[string]struct {
		get    string
		breach bool
	}{
		"its own message, sent again": {task("t1", "conv-1", stateCompleted, msg("user", "Please remember tc-u5."), msg("agent", "tc-a5")), false},
		"another turn's message":      {task("t1", "conv-1", stateCompleted, msg("user", "Please remember tc-u5."), msg("user", "tc-u4")), true},
	} {
		t.Run(name, func(t *testing.T) {
			agent := &a2aAgent{
				answer: func(w http.ResponseWriter, _ *http.Request) { events(w, status("t1", "conv-1", stateCompleted)) },
				get:    func(string) string { return c.get },
			}
			cl := a2aClient(t, agent, targets.A2AAPI{Path: "/rpc", ContextIDs: targets.ContextsClient})
			again := plan.Send{Conv: convA2A, Messages: userMessage("Please remember tc-u5."), Stream: true}
			out := cl.Send(context.Background(), cl.NewRequest(context.Background(), again))
			if c.breach {
				require.NotEmpty(t, out.Breaches)
				assert.Contains(t, strings.Join(out.Breaches, "; "), "shows tc-u4 in its history: messages the task did not send the model (it sent tc-u5)")
			} else {
				assert.Empty(t, out.Breaches)
			}
		})
	}
}
