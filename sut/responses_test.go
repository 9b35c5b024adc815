package sut_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Harness: Responses API requests and answers.

// respReq is a Responses API request; zero fields are left out.
type respReq struct {
	key      string
	model    string
	input    any // a string or items; nil: "<tok> hello" from tok
	tok      model.Token
	previous string
	conv     string
	stream   bool
	noStore  bool
}

func (q respReq) body(t testing.TB) string {
	t.Helper()
	b := map[string]any{"model": "turncheck-test", "stream": q.stream}
	if q.model != "" {
		b["model"] = q.model
	}
	b["input"] = q.input
	if q.input == nil {
		b["input"] = []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "input_text", "text": string(q.tok) + " hello from the test"}}}}
	}
	if q.previous != "" {
		b["previous_response_id"] = q.previous
	}
	if q.conv != "" {
		b["conversation"] = q.conv
	}
	if q.noStore {
		b["store"] = false
	}
	raw, err := json.Marshal(b)
	require.NoError(t, err)
	return string(raw)
}

func (q respReq) headers() map[string]string { return headers(q.key, "") }

// respond sends q to POST /v1/responses.
func (e *env) respond(t testing.TB, q respReq) reply {
	t.Helper()
	return postURL(t, e.client, e.srv.URL()+"/v1/responses", q.body(t), q.headers())
}

// responseObj is a response object as a client reads it.
type responseObj struct {
	ID                 string  `json:"id"`
	Object             string  `json:"object"`
	CreatedAt          int64   `json:"created_at"`
	Status             string  `json:"status"`
	Model              string  `json:"model"`
	PreviousResponseID *string `json:"previous_response_id"`
	Store              bool    `json:"store"`
	Output             []struct {
		Type    string `json:"type"`
		ID      string `json:"id"`
		Role    string `json:"role"`
		Status  string `json:"status"`
		Content []struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			Annotations []any  `json:"annotations"`
		} `json:"content"`
	} `json:"output"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// text is the response's reply.
func (r responseObj) text() string {
	var b strings.Builder
	for _, o := range r.Output {
		for _, c := range o.Content {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// requireResponse checks a completed response carrying tok's reply, that
// chains from previous, and returns it.
func requireResponse(t testing.TB, r responseObj, tok model.Token, previous string) responseObj {
	t.Helper()
	assert.Regexp(t, `^resp_[0-9a-f]{32}$`, r.ID)
	assert.Equal(t, "response", r.Object)
	assert.Equal(t, "completed", r.Status)
	assert.NotZero(t, r.CreatedAt)
	if previous == "" {
		assert.Nil(t, r.PreviousResponseID)
	} else if assert.NotNil(t, r.PreviousResponseID) {
		assert.Equal(t, previous, *r.PreviousResponseID)
	}
	require.Len(t, r.Output, 1)
	out := r.Output[0]
	assert.Equal(t, "message", out.Type)
	assert.Regexp(t, `^msg_[0-9a-f]{32}$`, out.ID)
	assert.Equal(t, "assistant", out.Role)
	assert.Equal(t, "completed", out.Status)
	require.Len(t, out.Content, 1)
	assert.Equal(t, "output_text", out.Content[0].Type)
	assert.NotNil(t, out.Content[0].Annotations)
	assert.Equal(t, strings.Join(faults.ReplyChunks(tok), ""), model.WithoutCallMarks(r.text()))
	return r
}

// decodeResponse reads a non-stream 200 answer.
func decodeResponse(t testing.TB, r reply) responseObj {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Contains(t, r.header.Get("Content-Type"), "application/json")
	var obj responseObj
	require.NoError(t, json.Unmarshal(r.body, &obj), "%s", r.body)
	return obj
}

// respEvent is one event of a Responses stream.
type respEvent struct {
	name string // its event: line
	Type string `json:"type"`
	Seq  *int   `json:"sequence_number"`
	// Response is set on response.created, .completed and .failed.
	Response *responseObj `json:"response"`
	// ItemID, OutputIndex, ContentIndex and Delta are a delta's.
	ItemID       string `json:"item_id"`
	OutputIndex  *int   `json:"output_index"`
	ContentIndex *int   `json:"content_index"`
	Delta        string `json:"delta"`
}

// parseRespStream reads a Responses event stream: each event an event:
// line and a data: line of JSON whose type is the event's name, numbered
// in order; no [DONE].
func parseRespStream(t testing.TB, body []byte) []respEvent {
	t.Helper()
	var events []respEvent
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			continue
		case strings.HasPrefix(line, "event: "):
			require.Empty(t, name, "two event lines in a row")
			name = strings.TrimPrefix(line, "event: ")
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		require.True(t, ok, "unexpected stream line %q", line)
		require.NotEqual(t, "[DONE]", data, "a Responses stream has no [DONE]")
		ev := respEvent{name: name}
		require.NoError(t, json.Unmarshal([]byte(data), &ev), "event %q", data)
		require.Equal(t, name, ev.Type, "the event line names the data's type")
		require.NotNil(t, ev.Seq, "sequence_number")
		require.Equal(t, len(events), *ev.Seq, "sequence numbers count up from 0")
		events = append(events, ev)
		name = ""
	}
	require.NoError(t, sc.Err())
	return events
}

// streamed is a Responses stream as the client read it.
type streamed struct {
	events []respEvent
}

// created is the response the stream opened with.
func (s streamed) created(t testing.TB) responseObj {
	t.Helper()
	require.NotEmpty(t, s.events)
	require.Equal(t, "response.created", s.events[0].Type)
	require.NotNil(t, s.events[0].Response)
	assert.Equal(t, "in_progress", s.events[0].Response.Status)
	return *s.events[0].Response
}

// last is the event that closed the stream.
func (s streamed) last() respEvent { return s.events[len(s.events)-1] }

// text is the deltas' text, each checked to be of the one output item.
func (s streamed) text(t testing.TB) string {
	t.Helper()
	var b strings.Builder
	for _, ev := range s.events {
		if ev.Type == "response.output_text.delta" {
			require.NotNil(t, ev.OutputIndex)
			require.NotNil(t, ev.ContentIndex)
			assert.Zero(t, *ev.OutputIndex)
			assert.Zero(t, *ev.ContentIndex)
			assert.NotEmpty(t, ev.ItemID)
			b.WriteString(ev.Delta)
		}
	}
	return b.String()
}

// readStreamed requires a 200 event stream and reads it.
func readStreamed(t testing.TB, r reply) streamed {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Contains(t, r.header.Get("Content-Type"), "text/event-stream")
	return streamed{events: parseRespStream(t, r.body)}
}

// okResponse sends q, which must succeed, non-stream or streamed, and
// returns the response and the history its one model call carried.
func (e *env) okResponse(t testing.TB, q respReq) (responseObj, []model.Token) {
	t.Helper()
	n := e.model.CallCount()
	r := e.respond(t, q)
	var obj responseObj
	if q.stream {
		s := readStreamed(t, r)
		created := s.created(t)
		last := s.last()
		require.Equal(t, "response.completed", last.Type, "%s", r.body)
		require.NotNil(t, last.Response)
		obj = requireResponse(t, *last.Response, q.tok, q.previous)
		assert.Equal(t, created.ID, obj.ID, "one response from created to completed")
		assert.Equal(t, obj.text(), s.text(t), "the deltas are the reply")
		assert.Equal(t, obj.Output[0].ID, s.events[1].ItemID)
	} else {
		obj = requireResponse(t, decodeResponse(t, r), q.tok, q.previous)
	}
	return obj, oneCall(t, e.model, n, q.tok)
}

// refusedResponse sends q, which must be refused with status before any
// model call, and returns the answer.
func (e *env) refusedResponse(t testing.TB, q respReq, status int, typ string) reply {
	t.Helper()
	n := e.model.CallCount()
	r := e.respond(t, q)
	requireErrorBody(t, r, status, typ)
	assert.Equal(t, n, e.model.CallCount(), "a refused request reaches no model")
	return r
}

// requireNotChainable requires that chaining from id under key is 404
// previous_response_not_found, before any model call.
func (e *env) requireNotChainable(t testing.TB, key, id string, tok model.Token) {
	t.Helper()
	r := e.refusedResponse(t, respReq{key: key, tok: tok, previous: id}, http.StatusNotFound, "invalid_request_error")
	var eb struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(r.body, &eb))
	assert.Equal(t, "previous_response_not_found", eb.Error.Code)
}

// ---------------------------------------------------------------------------
// Chaining.

// TestResponsesChain: each response, non-stream or streamed, chains from
// the one it names: the model is sent that one's whole history, then the
// new input; the base never changes, so a chain is a tree.
func TestResponsesChain(t *testing.T) {
	e := newEnv(t, sut.Config{})
	r1, h := e.okResponse(t, respReq{tok: "tc-u1"})
	require.Equal(t, toks("u1"), h)
	r2, h := e.okResponse(t, respReq{tok: "tc-u2", previous: r1.ID, stream: true})
	require.Equal(t, toks("u1", "a1", "u2"), h)
	r3, h := e.okResponse(t, respReq{tok: "tc-u3", previous: r2.ID})
	require.Equal(t, toks("u1", "a1", "u2", "a2", "u3"), h)
	assert.True(t, r3.Store)

	// A branch from the first: r2 and r3 are nowhere in it.
	_, h = e.okResponse(t, respReq{tok: "tc-u4", previous: r1.ID, stream: true})
	assert.Equal(t, toks("u1", "a1", "u4"), h)
	_, h = e.okResponse(t, respReq{tok: "tc-u5", previous: r3.ID})
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u3", "a3", "u5"), h)

	// A string input is one user message; every item of an array is
	// appended, in order, as OpenAI's Responses API does.
	n := e.model.CallCount()
	obj := decodeResponse(t, e.respond(t, respReq{input: "tc-u6 as a string", tok: "tc-u6", previous: r1.ID}))
	requireResponse(t, obj, "tc-u6", r1.ID)
	assert.Equal(t, toks("u1", "a1", "u6"), oneCall(t, e.model, n, "tc-u6"))
	n = e.model.CallCount()
	items := []any{
		map[string]any{"role": "user", "content": "tc-u90 an old message, never sent"},
		map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "tc-a90"}}},
		map[string]any{"role": "user", "content": "tc-u7 the new one", "extra": true},
	}
	prev := obj.ID
	obj = decodeResponse(t, e.respond(t, respReq{input: items, tok: "tc-u7", previous: prev}))
	requireResponse(t, obj, "tc-u7", prev)
	assert.Equal(t, toks("u1", "a1", "u6", "a6", "u90", "a90", "u7"), oneCall(t, e.model, n, "tc-u7"))

	// Chat conversations are another namespace: a chat id that is a
	// response's id is a new conversation.
	assert.Equal(t, toks("u8"), e.ok(t, "", r1.ID, "tc-u8"))
}

// TestResponsesSiblingsRunAtOnce: requests chaining from one response run
// at once, without waiting for each other, and each sees that response's
// history and its own input, never a sibling's.
func TestResponsesSiblingsRunAtOnce(t *testing.T) {
	e := newEnv(t, sut.Config{})
	base, _ := e.okResponse(t, respReq{tok: "tc-u1"})

	siblings := []model.Token{"tc-u2", "tc-u3", "tc-u4"}
	gates := make([]*faults.Gate, len(siblings))
	flights := make([]*inFlight, len(siblings))
	for i, tok := range siblings {
		gates[i] = e.model.Gate(tok)
		q := respReq{tok: tok, previous: base.ID, stream: i%2 == 1}
		flights[i] = sendTo(t, e.client, e.srv.URL()+"/v1/responses", q.body(t), q.headers())
	}
	// Every sibling reached the model while the others were held there.
	for i, g := range gates {
		await(t, g.Arrived(), "the model call of "+string(siblings[i]))
	}
	for _, g := range gates {
		g.Release()
	}
	ids := map[model.Token]string{}
	for i, f := range flights {
		r := f.wait(t)
		if i%2 == 1 {
			ids[siblings[i]] = readStreamed(t, r).last().Response.ID
		} else {
			ids[siblings[i]] = decodeResponse(t, r).ID
		}
	}
	for _, c := range callsSince(e.model, 0) {
		if c.Turn != "tc-u1" {
			assert.Equal(t, []model.Token{"tc-u1", "tc-a1", c.Turn}, c.History, "sibling %s", c.Turn)
		}
	}
	// Each sibling's own chain carries it alone.
	for i, tok := range siblings {
		next := model.UserToken(10 + i)
		_, h := e.okResponse(t, respReq{tok: next, previous: ids[tok]})
		assert.Equal(t, []model.Token{"tc-u1", "tc-a1", tok, tok.Reply(), next}, h)
	}
}

// ---------------------------------------------------------------------------
// What is never a base.

// failedResponseChains fails a response chained from a committed one (the
// model answers 500; streamed, response.created told the client its id),
// then chains from the failed one. It reports whether that chain worked,
// as it does only under failed-response-chainable; on the clean server it
// is 404, and a retry from the base sees no trace of the failed turn.
func failedResponseChains(t *testing.T, e *env, stream bool) bool {
	base, _ := e.okResponse(t, respReq{tok: "tc-u1"})
	e.model.Script("tc-u2", faults.Fault{Kind: faults.Status, Status: 500})
	q := respReq{tok: "tc-u2", previous: base.ID, stream: stream}
	r := e.respond(t, q)
	var failedID string
	if stream {
		s := readStreamed(t, r)
		failedID = s.created(t).ID
		last := s.last()
		require.Equal(t, "response.failed", last.Type, "%s", r.body)
		assert.Equal(t, "failed", last.Response.Status)
		require.NotNil(t, last.Response.Error)
		assert.Equal(t, "upstream_error", last.Response.Error.Code)
		assert.NotEmpty(t, last.Response.Error.Message)
		assert.Empty(t, last.Response.Output)
	} else {
		requireErrorBody(t, r, http.StatusBadGateway, "upstream_error")
		// The failed response's id was never told: only a streaming
		// client learns it. Chain from a response the model failed in
		// the middle of its stream instead.
		e.model.Script("tc-u2", faults.Fault{Kind: faults.Cut, After: 1})
		sr := readStreamed(t, e.respond(t, respReq{tok: "tc-u2", previous: base.ID, stream: true}))
		require.Equal(t, "response.failed", sr.last().Type)
		failedID = sr.created(t).ID
	}
	n := e.model.CallCount()
	chained := e.respond(t, respReq{tok: "tc-u3", previous: failedID})
	if chained.status == http.StatusOK {
		// The failed input reached the model as if it were history.
		assert.Contains(t, oneCall(t, e.model, n, "tc-u3"), model.Token("tc-u2"), "the failed input reached the model")
		return true
	}
	e.requireNotChainable(t, "", failedID, "tc-u3")
	_, h := e.okResponse(t, respReq{tok: "tc-u4", previous: base.ID})
	assert.Equal(t, toks("u1", "a1", "u4"), h, "a retry from the base sees no trace of the failed turn")
	return false
}

func TestFailedResponseIsNeverABase(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			assert.False(t, failedResponseChains(t, newEnv(t, sut.Config{}), stream))
		})
	}
	t.Run("timeout", func(t *testing.T) {
		deadlines := &sut.ManualDeadlines{}
		e := newEnv(t, sut.Config{Deadlines: deadlines})
		base, _ := e.okResponse(t, respReq{tok: "tc-u1"})
		arrived := e.model.Script("tc-u2", faults.Fault{Kind: faults.Hold})
		go func() {
			<-arrived
			deadlines.Expire()
		}()
		s := readStreamed(t, e.respond(t, respReq{tok: "tc-u2", previous: base.ID, stream: true}))
		require.Equal(t, "response.failed", s.last().Type)
		assert.Equal(t, "upstream_timeout", s.last().Response.Error.Code)
		e.requireNotChainable(t, "", s.created(t).ID, "tc-u3")
	})
}

// TestUnstoredResponseIsNotChainable: store:false runs the turn and keeps
// nothing.
func TestUnstoredResponseIsNotChainable(t *testing.T) {
	e := newEnv(t, sut.Config{})
	base, _ := e.okResponse(t, respReq{tok: "tc-u1"})
	for i, stream := range []bool{false, true} {
		tok := model.UserToken(2 + i)
		r, h := e.okResponse(t, respReq{tok: tok, previous: base.ID, noStore: true, stream: stream})
		assert.Equal(t, []model.Token{"tc-u1", "tc-a1", tok}, h)
		assert.False(t, r.Store)
		e.requireNotChainable(t, "", r.ID, "tc-u9")
	}
	e.requireNotChainable(t, "", "resp_never_minted", "tc-u9")
}

// responseCrossKeyChains chains, as key B, from key A's response, and
// reports whether that worked (only under response-cross-key).
func responseCrossKeyChains(t *testing.T, e *env) bool {
	a, _ := e.okResponse(t, respReq{key: "key-a", tok: "tc-u1"})
	n := e.model.CallCount()
	r := e.respond(t, respReq{key: "key-b", tok: "tc-u2", previous: a.ID})
	if r.status == http.StatusOK {
		assert.Equal(t, toks("u1", "a1", "u2"), oneCall(t, e.model, n, "tc-u2"), "key B saw key A's history")
		return true
	}
	e.requireNotChainable(t, "key-b", a.ID, "tc-u2")
	// Key A still chains from it.
	_, h := e.okResponse(t, respReq{key: "key-a", tok: "tc-u3", previous: a.ID})
	assert.Equal(t, toks("u1", "a1", "u3"), h)
	return false
}

func TestResponsesAreScopedPerKey(t *testing.T) {
	e := newEnv(t, sut.Config{Keys: []string{"key-a", "key-b"}})
	assert.False(t, responseCrossKeyChains(t, e))
	r := e.respond(t, respReq{key: "key-c", tok: "tc-u9"})
	requireErrorBody(t, r, http.StatusUnauthorized, "unauthorized")
}

// TestInterruptedResponseIsNotChainable: under Rollback a response whose
// client dropped mid-turn is not stored; its id, known from
// response.created, is no base.
func TestInterruptedResponseIsNotChainable(t *testing.T) {
	gauge := &sut.Gauge{}
	e := newEnv(t, sut.Config{Gauge: gauge})
	base, _ := e.okResponse(t, respReq{tok: "tc-u1"})
	arrived := e.model.Script("tc-u2", faults.Fault{Kind: faults.Hold})
	id := streamUntilCreated(t, e, respReq{tok: "tc-u2", previous: base.ID, stream: true}, arrived)
	awaitIdle(t, gauge)
	e.requireNotChainable(t, "", id, "tc-u3")
	_, h := e.okResponse(t, respReq{tok: "tc-u4", previous: base.ID})
	assert.Equal(t, toks("u1", "a1", "u4"), h)
}

// streamUntilCreated sends q, streamed, reads its first event, which must
// be response.created and come while the model call is held, waits for
// the call to arrive, then drops the connection; it returns the id.
func streamUntilCreated(t *testing.T, e *env, q respReq, arrived <-chan struct{}) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL()+"/v1/responses", strings.NewReader(q.body(t)))
	require.NoError(t, err)
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	var first bytes.Buffer
	for !bytes.HasSuffix(first.Bytes(), []byte("\n\n")) {
		b, err := br.ReadByte()
		require.NoError(t, err)
		first.WriteByte(b)
	}
	created := streamed{events: parseRespStream(t, first.Bytes())}.created(t)
	await(t, arrived, "the model call of "+string(q.tok))
	return created.ID
}

// TestResponseCreatedComesFirst: response.created is written and flushed
// before the model is called: it reaches the client while the model holds
// the call, and a model that fails at once still opens the stream with it.
func TestResponseCreatedComesFirst(t *testing.T) {
	gauge := &sut.Gauge{}
	e := newEnv(t, sut.Config{Gauge: gauge})
	arrived := e.model.Script("tc-u1", faults.Fault{Kind: faults.Hold})
	streamUntilCreated(t, e, respReq{tok: "tc-u1", stream: true}, arrived)
	awaitIdle(t, gauge)

	e.model.Script("tc-u2", faults.Fault{Kind: faults.Status, Status: 503})
	s := readStreamed(t, e.respond(t, respReq{tok: "tc-u2", stream: true}))
	require.Len(t, s.events, 2, "created, then failed")
	s.created(t)
	assert.Equal(t, "response.failed", s.last().Type)
}

// ---------------------------------------------------------------------------
// Conversation mode, refusals, restarts.

// TestResponsesConversationMode: a request naming a conversation is a turn
// of it as a chat turn is, under its lock (a second request waits its turn,
// or gets 409 under Reject), in a namespace apart from chat's.
func TestResponsesConversationMode(t *testing.T) {
	gauge := &sut.Gauge{}
	e := newEnv(t, sut.Config{Gauge: gauge})
	g := e.model.Gate("tc-u1")
	first := respReq{tok: "tc-u1", conv: "c1"}
	f1 := sendTo(t, e.client, e.srv.URL()+"/v1/responses", first.body(t), nil)
	await(t, g.Arrived(), "the model call of tc-u1")
	second := respReq{tok: "tc-u2", conv: "c1", stream: true}
	f2 := sendTo(t, e.client, e.srv.URL()+"/v1/responses", second.body(t), nil)
	awaitWaiting(t, gauge, 1)
	g.Release()
	requireResponse(t, decodeResponse(t, f1.wait(t)), "tc-u1", "")
	s := readStreamed(t, f2.wait(t))
	require.Equal(t, "response.completed", s.last().Type)
	calls := callsSince(e.model, 0)
	require.Len(t, calls, 2)
	assert.Equal(t, toks("u1"), calls[0].History)
	assert.Equal(t, toks("u1", "a1", "u2"), calls[1].History)

	// The chat conversation c1 is another one.
	assert.Equal(t, toks("u3"), e.ok(t, "", "c1", "tc-u3"))
	_, h := e.okResponse(t, respReq{tok: "tc-u4", conv: "c1"})
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u4"), h)

	t.Run("reject", func(t *testing.T) {
		e := newEnv(t, sut.Config{Concurrency: sut.Reject})
		g := e.model.Gate("tc-u1")
		f := sendTo(t, e.client, e.srv.URL()+"/v1/responses", respReq{tok: "tc-u1", conv: "c1"}.body(t), nil)
		await(t, g.Arrived(), "the model call of tc-u1")
		e.refusedResponse(t, respReq{tok: "tc-u2", conv: "c1"}, http.StatusConflict, "conflict")
		g.Release()
		decodeResponse(t, f.wait(t))
		_, h := e.okResponse(t, respReq{tok: "tc-u3", conv: "c1"})
		assert.Equal(t, toks("u1", "a1", "u3"), h)
	})
}

// TestResponsesAppendsEveryItem: a continuation with no user message (a
// client tool's call and output, a blank message, a system message) is
// appended whole after the history it chains from, as OpenAI's Responses
// API does: the model sees the last user message of that history still
// answered, never again as new. Under replay-on-tool-output it sees that
// message again as the new one (T3).
func TestResponsesAppendsEveryItem(t *testing.T) {
	tool := []any{
		map[string]any{"type": "function_call", "call_id": "call_1", "name": "clock", "arguments": "{}"},
		map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "noon"},
	}
	for _, c := range []struct {
		name   string
		mutant sut.Mutant
		want   []model.Token
	}{
		{"clean", sut.Clean, toks("u1", "a1")},
		{"replay-on-tool-output", sut.ReplayOnToolOutput, toks("u1", "a1", "u1")},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, sut.Config{Mutant: c.mutant})
			base, _ := e.okResponse(t, respReq{tok: "tc-u1"})
			for name, input := range map[string][]any{
				"a tool's call and output": tool,
				"a blank user message":     {map[string]any{"role": "user", "content": " "}},
				"a system message":         {map[string]any{"role": "system", "content": "be brief"}},
			} {
				n := e.model.CallCount()
				obj := decodeResponse(t, e.respond(t, respReq{input: input, previous: base.ID}))
				assert.Equal(t, "completed", obj.Status, name)
				calls := callsSince(e.model, n)
				require.Len(t, calls, 1, name)
				assert.Equal(t, c.want, calls[0].History, name)
				if name == "a tool's call and output" {
					assert.Equal(t, []model.ToolEvent{{Kind: model.UserMessage}, {Kind: model.ToolCalled, ID: "call_1"}, {Kind: model.ToolAnswered, ID: "call_1"}},
						calls[0].Tools[:3], "the client's call and its output follow the history")
				}
			}
			// The base never changed: a turn chained from it sees it alone.
			_, h := e.okResponse(t, respReq{tok: "tc-u2", previous: base.ID})
			assert.Equal(t, toks("u1", "a1", "u2"), h)
		})
	}
}

// TestResponsesBadInput: a malformed request, an input with nothing in
// it, or client tool items that do not pair, is 400 before any model
// call, and changes nothing.
func TestResponsesBadInput(t *testing.T) {
	e := newEnv(t, sut.Config{})
	base, _ := e.okResponse(t, respReq{tok: "tc-u1"})
	call := map[string]any{"type": "function_call", "call_id": "call_1", "name": "clock", "arguments": "{}"}
	for name, body := range map[string]string{
		"blank string":           `{"model":"m","input":"  \n"}`,
		"empty string":           `{"model":"m","input":""}`,
		"empty array":            `{"model":"m","input":[]}`,
		"no input":               `{"model":"m"}`,
		"null input":             `{"model":"m","input":null}`,
		"input a number":         `{"model":"m","input":5}`,
		"a tool output alone":    respReq{input: []any{map[string]any{"type": "function_call_output", "call_id": "x", "output": "42"}}, previous: base.ID}.body(t),
		"a tool call alone":      respReq{input: []any{call}, previous: base.ID}.body(t),
		"a tool output twice":    respReq{input: []any{call, map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "1"}, map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "2"}}}.body(t),
		"a tool output first":    respReq{input: []any{map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "1"}, call}}.body(t),
		"a call without call_id": respReq{input: []any{map[string]any{"type": "function_call", "name": "clock", "arguments": "{}"}}}.body(t),
		"an output not a string": respReq{input: []any{call, map[string]any{"type": "function_call_output", "call_id": "call_1", "output": 5}}}.body(t),
		"image part":             respReq{input: []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_image", "image_url": "x"}}}}}.body(t),
		"both previous and conv": `{"model":"m","input":"tc-u5","previous_response_id":"` + base.ID + `","conversation":"c1"}`,
		"blank conversation":     `{"model":"m","input":"tc-u5","conversation":" "}`,
		"store a string":         `{"model":"m","input":"tc-u5","store":"no"}`,
		"not JSON":               `tc-u5`,
		"trailing data":          `{"model":"m","input":"tc-u5"} x`,
		"an array":               `["tc-u5"]`,
	} {
		t.Run(name, func(t *testing.T) {
			r := postURL(t, e.client, e.srv.URL()+"/v1/responses", body, nil)
			requireErrorBody(t, r, http.StatusBadRequest, "invalid_request_error")
		})
	}
	assert.Equal(t, 1, e.model.CallCount(), "no bad request reaches the model")
	_, h := e.okResponse(t, respReq{tok: "tc-u2", previous: base.ID})
	assert.Equal(t, toks("u1", "a1", "u2"), h)
	for _, path := range []string{"/responses", "/v1/responses"} {
		r := postURL(t, e.client, e.srv.URL()+path, respReq{tok: "tc-u3", previous: base.ID}.body(t), nil)
		requireResponse(t, decodeResponse(t, r), "tc-u3", base.ID)
	}
}

// TestResponsesChainSurvivesARestart: a chain resumes after a restart on
// the same data dir, under its agent loaded with another query (T8), and
// an ambiguous source is 409, as a chat resume.
func TestResponsesChainSurvivesARestart(t *testing.T) {
	a := newAgentEnv(t)
	e := a.with(a.am.ref("helper", "tag=v1"))
	r1, _ := e.okResponse(t, respReq{model: "helper", tok: "tc-u1"})
	assert.Equal(t, instruction("helper", "tag=v1"), a.am.lastSystem(t))

	e = a.with(a.am.ref("helper", "tag=v2"))
	r2, h := e.okResponse(t, respReq{model: "whatever", tok: "tc-u2", previous: r1.ID, stream: true})
	assert.Equal(t, toks("u1", "a1", "u2"), h)
	assert.Equal(t, instruction("helper", "tag=v2"), a.am.lastSystem(t))

	a.crash()
	e = a.with(a.am.ref("helper", "tag=v2"), a.am.ref("helper", "tag=v3"))
	e.refusedResponse(t, respReq{tok: "tc-u3", previous: r2.ID}, http.StatusConflict, "conflict")

	e = a.with(a.am.ref("helper", "tag=v4"))
	_, h = e.okResponse(t, respReq{tok: "tc-u4", previous: r2.ID})
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u4"), h)
	assert.Equal(t, instruction("helper", "tag=v4"), a.am.lastSystem(t))
}

// TestResponsesUnderCompleteCommitWithoutTheirClient: under Complete, a
// response whose client left runs to its end and is stored, chainable.
func TestResponsesUnderCompleteCommitWithoutTheirClient(t *testing.T) {
	gauge := &sut.Gauge{}
	e := newEnv(t, sut.Config{Gauge: gauge, Interruption: sut.Complete})
	g := e.model.Gate("tc-u1")
	id := streamUntilCreated(t, e, respReq{tok: "tc-u1", stream: true}, g.Arrived())
	g.Release()
	awaitIdle(t, gauge)
	_, h := e.okResponse(t, respReq{tok: "tc-u2", previous: id})
	assert.Equal(t, toks("u1", "a1", "u2"), h)
}

// ---------------------------------------------------------------------------
// Branches stay apart.

// branchesMeet chains two requests, a then b, from one response, and then
// a third, c; with atOnce, b is sent while a is held at the model, else
// once a has ended. It reports whether b saw a's turn, as it does only
// under branch-mutates-base, whose lock keyed by the base makes b wait
// for a and whose in-place append leaves a's turn in the base; c then sees
// both. Either way the responses a and b stay what they were committed
// as: a chain from either sees its history and nothing else. The tokens
// are first to first+5.
func branchesMeet(t *testing.T, e *env, first int, atOnce bool) bool {
	u := func(i int) model.Token { return model.UserToken(first + i) }
	// turns is the history of the turns of toks, each with its reply,
	// then the new input last.
	turns := func(last model.Token, toks ...model.Token) []model.Token {
		var h []model.Token
		for _, tok := range toks {
			h = append(h, tok, tok.Reply())
		}
		return append(h, last)
	}
	base, _ := e.okResponse(t, respReq{tok: u(0)})
	qa := respReq{tok: u(1), previous: base.ID}
	qb := respReq{tok: u(2), previous: base.ID, stream: true}
	var a, b responseObj
	if atOnce {
		g := e.model.Gate(u(1))
		fa := sendTo(t, e.client, e.srv.URL()+"/v1/responses", qa.body(t), qa.headers())
		await(t, g.Arrived(), "the model call of "+string(u(1)))
		fb := sendTo(t, e.client, e.srv.URL()+"/v1/responses", qb.body(t), qb.headers())
		g.Release()
		a = requireResponse(t, decodeResponse(t, fa.wait(t)), u(1), base.ID)
		s := readStreamed(t, fb.wait(t))
		require.Equal(t, "response.completed", s.last().Type, "%v", s.last())
		b = requireResponse(t, *s.last().Response, u(2), base.ID)
	} else {
		a, _ = e.okResponse(t, qa)
		b, _ = e.okResponse(t, qb)
	}
	history := map[model.Token][]model.Token{}
	for _, c := range callsSince(e.model, 0) {
		history[c.Turn] = c.History
	}
	assert.Equal(t, turns(u(1), u(0)), history[u(1)], "the first branch sees its base and its input")
	_, hc := e.okResponse(t, respReq{tok: u(3), previous: base.ID})
	// Each response is what it was committed as, whatever its siblings
	// did to the base since.
	_, ha := e.okResponse(t, respReq{tok: u(4), previous: a.ID})
	assert.Equal(t, turns(u(4), u(0), u(1)), ha, "a chain from the first branch")
	_, hb := e.okResponse(t, respReq{tok: u(5), previous: b.ID})
	if assert.ObjectsAreEqual(turns(u(2), u(0)), history[u(2)]) {
		assert.Equal(t, turns(u(3), u(0)), hc, "a third branch sees its base and its input alone")
		assert.Equal(t, turns(u(5), u(0), u(2)), hb, "a chain from the second branch")
		return false
	}
	// The second branch ran on the base with the first one's turn in it,
	// and the third on the base with both.
	assert.Equal(t, turns(u(2), u(0), u(1)), history[u(2)], "the second branch")
	assert.Equal(t, turns(u(3), u(0), u(1), u(2)), hc, "the third branch")
	assert.Equal(t, turns(u(5), u(0), u(1), u(2)), hb, "a chain from the second branch")
	return true
}

// branchesMeetEitherWay is branchesMeet one after the other, then at once,
// which must agree.
func branchesMeetEitherWay(t *testing.T, e *env) bool {
	apart := branchesMeet(t, e, 1, false)
	atOnce := branchesMeet(t, e, 11, true)
	assert.Equal(t, apart, atOnce, "branches sent one after the other and at once")
	return apart && atOnce
}

func TestResponsesBranchesStayApart(t *testing.T) {
	for _, atOnce := range []bool{false, true} {
		t.Run(fmt.Sprintf("atOnce=%t", atOnce), func(t *testing.T) {
			assert.False(t, branchesMeet(t, newEnv(t, sut.Config{}), 1, atOnce))
		})
	}
}

// TestBranchMutatesBaseLetsGoOfItsLock: the lock that branch-mutates-base
// takes, keyed by the response a request chains from, is given up on every
// way out of the turn: a model failure, a client that drops mid-turn, an
// unstored response, an unknown base, a full history. Each step chains
// from the same response, so a lock kept by one would hold the next past
// RequestTimeout (503). A turn that did not commit is taken back off the
// base as the lock goes: only a completed turn stays in it (the bug).
func TestBranchMutatesBaseLetsGoOfItsLock(t *testing.T) {
	gauge := &sut.Gauge{}
	e := newEnv(t, sut.Config{Mutant: sut.BranchMutatesBase, Gauge: gauge, MaxHistoryMessages: 5, RequestTimeout: 5 * time.Second})
	base, _ := e.okResponse(t, respReq{tok: "tc-u1"})

	e.model.Script("tc-u2", faults.Fault{Kind: faults.Status, Status: 500})
	requireErrorBody(t, e.respond(t, respReq{tok: "tc-u2", previous: base.ID}), http.StatusBadGateway, "upstream_error")

	arrived := e.model.Script("tc-u3", faults.Fault{Kind: faults.Hold})
	streamUntilCreated(t, e, respReq{tok: "tc-u3", previous: base.ID, stream: true}, arrived)
	awaitIdle(t, gauge)

	r, h := e.okResponse(t, respReq{tok: "tc-u4", previous: base.ID, noStore: true})
	assert.False(t, r.Store)
	assert.Equal(t, toks("u1", "a1", "u4"), h, "the failed and dropped turns were taken back")

	e.requireNotChainable(t, "", "resp_never_minted", "tc-u5")
	_, h = e.okResponse(t, respReq{tok: "tc-u6", previous: base.ID})
	assert.Equal(t, toks("u1", "a1", "u6"), h, "the unstored turn was taken back")
	// The base now holds tc-u6's turn too: four messages, and a fifth and
	// its reply are over the limit, twice (the second finds the lock free).
	for range 2 {
		e.refusedResponse(t, respReq{tok: "tc-u7", previous: base.ID}, http.StatusBadRequest, "invalid_request_error")
	}
	awaitIdle(t, gauge)
}
