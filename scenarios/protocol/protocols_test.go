package protocol

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

func userMessage(text string) []openai.Message {
	return []openai.Message{{Role: openai.RoleUser, Content: openai.Content(text)}}
}

// chainedFrom is the previous_response_id of a Responses API request.
func chainedFrom(t *testing.T, req Request) string {
	t.Helper()
	var body responsesRequest
	require.NoError(t, json.Unmarshal(req.Body, &body))
	return body.PreviousResponseID
}

// TestResponsesChain: a conversation's turns chain from the last response
// that ended ok, or whose outcome the client never learned; a response
// the server said failed is chained from once (it must not be a base,
// T1); an unknown response the server does not have (404) gives the chain
// back its base; another key's conversation of the same id chains from
// the first key's head (it must not be found, T5); after a restart, every
// chain goes on from its last completed response; a branch starts where
// its base stands.
func TestResponsesChain(t *testing.T) {
	c := NewClient([]string{"http://127.0.0.1:1"}, targets.Profile{Protocol: targets.Responses, Model: "m"}, "")
	w := c.wire.(*responses)
	a := model.ConversationRef{Key: "key-a", ID: "conv-1"}
	b := model.ConversationRef{Key: "key-b", ID: "conv-1"}
	next := func(conv model.ConversationRef) Request {
		return c.NewRequest(context.Background(), plan.Send{Conv: conv, Token: "tc-u1", Messages: userMessage("tc-u1"), Stream: true})
	}
	// probe is a request on conv without a new user message.
	probe := func(conv model.ConversationRef) Request {
		return c.NewRequest(context.Background(), plan.Send{Conv: conv, Messages: []openai.Message{{Role: openai.RoleUser, Content: " "}}})
	}

	first := next(a)
	assert.Empty(t, chainedFrom(t, first), "a new conversation starts a chain")
	assert.Equal(t, "/v1/responses", first.Path)
	assert.Empty(t, chainedFrom(t, next(b)), "no chain of either key yet")
	w.learn(first, Response{Outcome: model.OK, ID: "resp_1"})
	assert.Equal(t, "resp_1", chainedFrom(t, next(a)))
	assert.Equal(t, "resp_1", chainedFrom(t, next(b)), "the other key probes the first key's response")

	failed := next(a)
	w.learn(failed, Response{Outcome: model.Fail, Status: 502})
	assert.Equal(t, "resp_1", chainedFrom(t, next(a)), "a failure without an id changes nothing")
	w.learn(failed, Response{Outcome: model.Fail, ID: "resp_2"})
	assert.Equal(t, "resp_1", chainedFrom(t, probe(a)), "a request without a new user message chains from the head")
	onFailed := next(a)
	assert.Equal(t, "resp_2", chainedFrom(t, onFailed), "the failed response is chained from once")
	w.learn(onFailed, Response{Outcome: model.Fail, Status: 404})
	assert.Equal(t, "resp_1", chainedFrom(t, next(a)), "then the chain goes on from its head")
	for _, out := range []Response{{Outcome: model.OK, ID: "resp_p"}, {Outcome: model.Unknown, ID: "resp_p"}, {Outcome: model.Fail, ID: "resp_p"}} {
		w.learn(probe(a), out)
		assert.Equal(t, "resp_1", chainedFrom(t, next(a)), "a request without a new user message moves no chain (%s)", out.Outcome)
	}

	lost := next(a)
	w.learn(lost, Response{Outcome: model.Unknown, ID: "resp_3"})
	resume := next(a)
	assert.Equal(t, "resp_3", chainedFrom(t, resume), "an unknown response is chained from: whole or absent (T6)")
	w.learn(resume, Response{Outcome: model.Fail, Status: 502})
	assert.Equal(t, "resp_3", chainedFrom(t, next(a)), "a failure that is not a 404 says nothing of it")
	w.learn(probe(a), Response{Outcome: model.Fail, Status: 400})
	assert.Equal(t, "resp_3", chainedFrom(t, next(a)), "a request without a new user message refused with 400 says nothing of the chain")
	w.learn(resume, Response{Outcome: model.Fail, Status: 400, Code: CodeNotFound})
	assert.Equal(t, "resp_1", chainedFrom(t, next(a)), "the server does not have it (OpenAI's 400): back to the last completed response")
	w.learn(next(a), Response{Outcome: model.Unknown, ID: "resp_3"})
	w.learn(next(a), Response{Outcome: model.Fail, Status: 400})
	assert.Equal(t, "resp_1", chainedFrom(t, next(a)),
		"a turn refused with a plain 400 (a refusal of the chain): back to the last completed response, not refused forever")
	w.learn(next(a), Response{Outcome: model.Unknown, ID: "resp_3"})
	w.learn(next(a), Response{Outcome: model.Fail, Status: 404})
	assert.Equal(t, "resp_1", chainedFrom(t, next(a)), "the server does not have it (404): back to the last completed response")

	w.learn(next(a), Response{Outcome: model.Unknown, ID: "resp_4"})
	w.learn(next(a), Response{Outcome: model.Fail, ID: "resp_5"})
	c.Rebase([]string{"http://127.0.0.1:2"})
	assert.Equal(t, "resp_1", chainedFrom(t, next(a)), "after a restart, a chain goes on from its last completed response (T7)")

	branch := model.ConversationRef{Key: "key-a", ID: "conv-2"}
	branchFirst := c.NewRequest(context.Background(), plan.Send{Conv: branch, From: &a, Messages: userMessage("x")})
	assert.Equal(t, "resp_1", chainedFrom(t, branchFirst), "a branch starts where its base stands")
	w.learn(branchFirst, Response{Outcome: model.Fail, Status: 502})
	assert.Equal(t, "resp_1", chainedFrom(t, next(branch)), "and stays there until a turn of its own completes")

	inFlight := next(a)
	c.Rebase([]string{"http://127.0.0.1:3"})
	w.learn(inFlight, Response{Outcome: model.Unknown, ID: "resp_6"})
	assert.Equal(t, "resp_1", chainedFrom(t, next(a)),
		"a turn in flight through a crash whose end is read after the restart moves no chain: its response may rightly be gone")
	w.learn(next(a), Response{Outcome: model.Unknown, ID: "resp_7"})
	assert.Equal(t, "resp_7", chainedFrom(t, next(a)), "one sent to the server as it runs now does (T6)")
}

// TestResponsesOutcomes: a stream succeeds only on response.completed,
// fails on response.failed, response.incomplete and error, and is unknown
// if it ends before; the response id comes with response.created.
func TestResponsesOutcomes(t *testing.T) {
	created := `data: {"type":"response.created","response":{"id":"resp_9","status":"in_progress"}}` + "\n\n"
	delta := `data: {"type":"response.output_text.delta","delta":"tc-a1"}` + "\n\n"
	for name, tc := range map[string]struct {
		body    string
		outcome model.Outcome
	}{
		"completed":  {created + delta + `data: {"type":"response.completed","response":{"id":"resp_9","status":"completed"}}` + "\n\n", model.OK},
		"failed":     {created + `data: {"type":"response.failed","response":{"id":"resp_9","status":"failed","error":{"message":"boom"}}}` + "\n\n", model.Fail},
		"incomplete": {created + `data: {"type":"response.incomplete","response":{"id":"resp_9","status":"incomplete"}}` + "\n\n", model.Fail},
		"error":      {created + `data: {"type":"error","message":"boom"}` + "\n\n", model.Fail},
		"cut":        {created + delta, model.Unknown},
		"malformed":  {created + "data: {\n\n", model.Unknown},
	} {
		out := readResponseEvents(context.Background(), strings.NewReader(tc.body), nil, Response{Status: 200})
		assert.Equal(t, tc.outcome, out.Outcome, name)
		assert.Equal(t, "resp_9", out.ID, name)
	}
	out := readResponseEvents(context.Background(), strings.NewReader(created+delta+`data: {"type":"response.completed","response":{"id":"resp_9","status":"completed"}}`+"\n\n"), nil, Response{})
	assert.Equal(t, "tc-a1", out.Reply)

	whole := func(status string) Response {
		r := responseObject{ID: "resp_7", Status: status}
		return r.outcome(Response{Status: 200})
	}
	assert.Equal(t, model.OK, whole("completed").Outcome)
	assert.Equal(t, model.Fail, whole("failed").Outcome)
	assert.Equal(t, model.Unknown, whole("in_progress").Outcome)
	assert.Equal(t, "resp_7", whole("failed").ID)
}

// sessionServer is a session API that counts the sessions it creates and
// answers each turn with the events in answer.
type sessionServer struct {
	mu       sync.Mutex
	created  int
	turns    []string // path and body of each turn
	auth     []string
	creates  []string
	answer   string
	refusing bool
}

func (s *sessionServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	body, _ := io.ReadAll(r.Body)
	s.auth = append(s.auth, r.Header.Get("Authorization"))
	if r.URL.Path == "/api/sessions" {
		if s.refusing {
			http.Error(w, `{"error":{"message":"no"}}`, http.StatusForbidden)
			return
		}
		s.created++
		s.creates = append(s.creates, string(body))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"s%d"}`, s.created)
		return
	}
	s.turns = append(s.turns, r.Method+" "+r.URL.EscapedPath()+" "+string(body))
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, s.answer)
}

// sessionsProfile is a profile of a session API shaped as the reference
// server's.
func sessionsProfile() targets.Profile {
	return targets.Profile{Protocol: targets.Sessions, Model: "help er", SessionsAPI: &targets.SessionsAPI{
		Create: targets.Call{Method: "POST", Path: "/api/sessions", Body: "{}"},
		ID:     "id",
		Turn:   targets.Call{Method: "POST", Path: "/api/sessions/{session}/agent/{agent}", Body: `{"text":{message},"all":{messages}}`},
		Events: targets.EventRules{TypeField: "type", Text: "agent_choice", TextField: "content",
			Done: []string{"stream_stopped"}, Failure: []string{"error"}, ErrorField: "error"},
	}}
}

// TestSessionsAPI: a conversation's session is created once, before its
// first turn, even when its first turns are sent at once; a turn names it
// in its path and carries its messages in the body template; the events
// say how the turn ended; a session that cannot be created fails the turn
// before it is sent.
func TestSessionsAPI(t *testing.T) {
	srv := &sessionServer{answer: "data: {\"type\":\"agent_choice\",\"content\":\"tc-a1\"}\n\ndata: {\"type\":\"stream_stopped\"}\n\n"}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	c := NewClient([]string{hs.URL}, sessionsProfile(), "")
	defer c.Close()
	a := model.ConversationRef{Key: "key-a", ID: "conv-1"}
	var wg sync.WaitGroup
	outs := make([]Response, 3)
	for i := range outs {
		req := c.NewRequest(context.Background(), plan.Send{Conv: a, Messages: userMessage(fmt.Sprintf("msg %d", i))})
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = c.Send(context.Background(), req)
		}()
	}
	wg.Wait()
	for _, out := range outs {
		assert.Equal(t, model.OK, out.Outcome, out.Detail)
		assert.Equal(t, "tc-a1", out.Reply)
	}
	assert.Equal(t, 1, srv.created, "one session for the conversation")
	require.Len(t, srv.turns, 3)
	assert.Contains(t, srv.turns, `POST /api/sessions/s1/agent/help%20er {"text":"msg 0","all":[{"role":"user","content":"msg 0"}]}`)
	assert.Equal(t, "Bearer key-a", srv.auth[0], "the session is created under the conversation's key")

	other := c.NewRequest(context.Background(), plan.Send{Conv: model.ConversationRef{Key: "key-b", ID: "conv-1"}, Messages: userMessage("x")})
	assert.Equal(t, "/api/sessions/s1/agent/help%20er", other.Path, "another key probes the first key's session (T5)")
	assert.Equal(t, 1, srv.created)

	srv.answer = "data: {\"type\":\"error\",\"error\":\"model failed\"}\n\n"
	out := c.Send(context.Background(), c.NewRequest(context.Background(), plan.Send{Conv: a, Messages: userMessage("y")}))
	assert.Equal(t, model.Fail, out.Outcome)
	assert.Contains(t, out.Detail, "model failed")
	srv.answer = "data: {\"type\":\"agent_choice\",\"content\":\"tc\"}\n\n"
	assert.Equal(t, model.Unknown, c.Send(context.Background(), c.NewRequest(context.Background(), plan.Send{Conv: a, Messages: userMessage("z")})).Outcome,
		"a stream that ends before a done event")

	srv.refusing = true
	req := c.NewRequest(context.Background(), plan.Send{Conv: model.ConversationRef{ID: "conv-2"}, Messages: userMessage("w")})
	assert.Contains(t, req.Unsent, "status 403")
	out = c.Send(context.Background(), req)
	assert.Equal(t, model.Fail, out.Outcome, "a turn whose session was never made failed, and changed nothing")
	assert.Equal(t, CauseUnsent, out.Cause)
}

// TestSessionsNameTheirSource: {source} names, per session, the agent
// reference it was created under, escaped in a path as a query value is
// (docker-agent's key for a URL source) and a JSON string in a body: after
// the server loads another reference, a new session names the new one and
// an old session keeps naming its own, as a client that keeps its
// sessions does (docker-agent #3410 shows only to such a client).
func TestSessionsNameTheirSource(t *testing.T) {
	srv := &sessionServer{answer: "data: {\"type\":\"stream_stopped\"}\n\n"}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	p := sessionsProfile()
	p.SessionsAPI.Create.Body = `{"agent":{source}}`
	p.SessionsAPI.Turn.Path = "/api/sessions/{session}/agent/{source}"
	c := NewClient([]string{hs.URL}, p, "")
	defer c.Close()
	old, current := model.ConversationRef{ID: "old"}, model.ConversationRef{ID: "new"}
	turn := func(conv model.ConversationRef) Request {
		req := c.NewRequest(context.Background(), plan.Send{Conv: conv, Messages: userMessage("hi")})
		require.Empty(t, req.Unsent)
		return req
	}

	assert.Contains(t, c.NewRequest(context.Background(), plan.Send{Conv: old, Messages: userMessage("hi")}).Unsent,
		"the server loads none", "a session cannot name a source the server does not load")
	v1, v2 := "http://localhost:4321/agents/helper.yaml?tag=v1", "http://localhost:4321/agents/helper.yaml?tag=v2"
	c.Loaded([]string{v1})
	assert.Equal(t, "/api/sessions/s1/agent/http%3A%2F%2Flocalhost%3A4321%2Fagents%2Fhelper.yaml%3Ftag%3Dv1", turn(old).Path)
	c.Loaded([]string{v2, v1})
	assert.Equal(t, "/api/sessions/s1/agent/http%3A%2F%2Flocalhost%3A4321%2Fagents%2Fhelper.yaml%3Ftag%3Dv1", turn(old).Path,
		"an old session names the source it was created under")
	assert.Equal(t, "/api/sessions/s2/agent/http%3A%2F%2Flocalhost%3A4321%2Fagents%2Fhelper.yaml%3Ftag%3Dv2", turn(current).Path,
		"a new session names the first source loaded now")
	other := turn(model.ConversationRef{Key: "key-b", ID: "old"})
	assert.Equal(t, turn(old).Path, other.Path, "another key probes the first key's session under its source (T5)")
	assert.Equal(t, []string{`{"agent":"` + v1 + `"}`, `{"agent":"` + v2 + `"}`}, srv.creates, "in a body, the reference as a JSON string")
}

// TestEventFields: an event's type, text and error may be nested in it, as
// goose's server nests a message's text.
func TestEventFields(t *testing.T) {
	var ev any
	require.NoError(t, json.Unmarshal([]byte(`{"type":"Message","message":{"content":[{"type":"text","text":"tc-a1"}]}}`), &ev))
	assert.Equal(t, "Message", field(ev, "type"))
	assert.Equal(t, "tc-a1", field(ev, "message.content.0.text"))
	for _, missing := range []string{"message.content.1.text", "message.content.x", "type.more", "nothing", "message.content.-1"} {
		assert.Nil(t, field(ev, missing), missing)
	}
}

// TestResponsesInputItems: a client tool's call and output go as OpenAI's
// function_call and function_call_output items, any other message as a
// message item, blank text kept.
func TestResponsesInputItems(t *testing.T) {
	msgs := []openai.Message{
		{Role: openai.RoleAssistant, ToolCalls: []openai.ToolCall{{ID: "call_1", Type: openai.TypeFunction, Function: openai.FunctionCall{Name: "clock", Arguments: "{}"}}}},
		{Role: openai.RoleTool, ToolCallID: "call_1", Content: "noon"},
		{Role: openai.RoleUser, Content: ""},
	}
	raw, err := json.Marshal(inputItems(msgs))
	require.NoError(t, err)
	assert.JSONEq(t, `[{"type":"function_call","call_id":"call_1","name":"clock","arguments":"{}"},
		{"type":"function_call_output","call_id":"call_1","output":"noon"},
		{"type":"message","role":"user","content":""}]`, string(raw))
}

// TestErrorCode: an error body's code is read beside its message; a code
// that is null or not a string is none.
func TestErrorCode(t *testing.T) {
	for body, want := range map[string]string{
		`{"error":{"message":"Previous response with id 'resp_1' not found.","type":"invalid_request_error","code":"previous_response_not_found"}}`: CodeNotFound,
		`{"error":{"message":"m","type":"t","code":null}}`: "",
		`{"error":{"message":"m","type":"t","code":5}}`:    "",
		`{"error":{"message":"m","type":"t"}}`:             "",
		`not json`:                                         "",
	} {
		_, code := errorMessage(strings.NewReader(body))
		assert.Equal(t, want, code, body)
	}
	assert.True(t, Response{Outcome: model.Fail, Status: 400, Code: CodeNotFound}.NotFound())
	assert.True(t, Response{Outcome: model.Fail, Status: 404}.NotFound())
	assert.False(t, Response{Outcome: model.Fail, Status: 400}.NotFound())
}

// TestResponsesNamedBy: a conversation of the server's is named as the
// profile declares (the conversation parameter, the user field, or a
// header, which the request keeps as sent for a report's curl), never
// with previous_response_id; a profile that declares no way names none.
func TestResponsesNamedBy(t *testing.T) {
	conv := model.ConversationRef{Key: "key-a", ID: "conv-3"}
	send := plan.Send{Conv: conv, Token: "tc-u1", Messages: userMessage("tc-u1"), InConversation: true}
	for _, tc := range []struct {
		api        *targets.ResponsesAPI
		body, head string
	}{
		{&targets.ResponsesAPI{NamedBy: targets.NamedByConv}, `"conversation":"ns-conv-3"`, ""},
		{&targets.ResponsesAPI{NamedBy: targets.NamedByUser}, `"user":"ns-conv-3"`, ""},
		{&targets.ResponsesAPI{NamedBy: targets.NamedByHeader, Header: "x-openclaw-session-key"}, "", "x-openclaw-session-key"},
	} {
		c := NewClient([]string{"http://127.0.0.1:1"}, targets.Profile{Protocol: targets.Responses, Model: "m", ResponsesAPI: tc.api}, "ns-")
		req := c.NewRequest(context.Background(), send)
		assert.NotContains(t, string(req.Body), "previous_response_id", tc.api.NamedBy)
		if tc.body != "" {
			assert.Contains(t, string(req.Body), tc.body, tc.api.NamedBy)
			assert.Empty(t, req.Named)
		}
		if tc.head != "" {
			assert.Equal(t, map[string]string{tc.head: "ns-conv-3"}, req.Named)
			assert.Equal(t, req.Named, c.wire.headers(c, req), "what is sent is what is kept")
			assert.NotContains(t, string(req.Body), `"conversation"`)
		}
	}
}
