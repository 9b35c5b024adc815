package sut_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Harness: a fake model that holds chosen turns where they arrive until the
// test lets them go on, so that concurrent turns interleave as the test
// says, and a gauge to tell when concurrent requests have come to rest.

// gateModel is a fake model provider. It records every call as the tokens
// it carried, holds the first call of a gated turn until the test releases
// it, then answers it normally, or by the turn's fault.
type gateModel struct {
	srv *httptest.Server

	mu     sync.Mutex
	calls  []gateCall
	gates  map[string]*held // the holds of first calls yet to arrive
	all    []*held          // every one, to open at cleanup
	faults map[string]modelFault
}

// modelFault is how the gate model fails a turn.
type modelFault int

const (
	answer500   modelFault = iota + 1 // a 500 before any reply
	breakStream                       // a reply chunk, then a malformed one
)

// gateCall is one model call: the turn's user token, and every token of
// the request in order (the history the server holds, plus the turn).
type gateCall struct {
	turn    string
	history []string
}

var tokenRE = regexp.MustCompile(`tc-[ua][0-9]+`)

// replyOf is the reply token of the user token tok: tc-u7 -> tc-a7.
func replyOf(tok string) string { return strings.Replace(tok, "tc-u", "tc-a", 1) }

func startGateModel(t testing.TB) *gateModel {
	t.Helper()
	m := &gateModel{gates: map[string]*held{}, faults: map[string]modelFault{}}
	m.srv = httptest.NewServer(m)
	t.Cleanup(m.srv.Close)
	// Cleanups run last first: every held call goes on before the model
	// closes, which waits for them.
	t.Cleanup(func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, g := range m.all {
			g.open()
		}
	})
	return m
}

func (m *gateModel) URL() string { return m.srv.URL + "/v1" }

// hold holds the next call of tok.
func (m *gateModel) hold(tok string) *held {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := newHeld()
	m.gates[tok] = g
	m.all = append(m.all, g)
	return g
}

// fail makes every call of tok fail by f.
func (m *gateModel) fail(tok string, f modelFault) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults[tok] = f
}

// callsOf returns the calls of turn tok, in arrival order.
func (m *gateModel) callsOf(tok string) []gateCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []gateCall
	for _, c := range m.calls {
		if c.turn == tok {
			out = append(out, c)
		}
	}
	return out
}

// turns returns the turn of every call, in arrival order.
func (m *gateModel) turns() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, len(m.calls))
	for i, c := range m.calls {
		out[i] = c.turn
	}
	return out
}

func (m *gateModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req openai.ChatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		openai.WriteError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	call := gateCall{history: []string{}}
	for _, msg := range req.Messages {
		toks := tokenRE.FindAllString(string(msg.Content), -1)
		call.history = append(call.history, toks...)
		if msg.Role == openai.RoleUser && len(toks) > 0 {
			call.turn = toks[0]
		}
	}
	m.mu.Lock()
	m.calls = append(m.calls, call)
	g := m.gates[call.turn]
	if g != nil {
		delete(m.gates, call.turn)
	}
	fault := m.faults[call.turn]
	m.mu.Unlock()
	if g != nil && !g.wait(r) {
		return // the server gave up on the call
	}
	if fault == answer500 {
		openai.WriteError(w, http.StatusInternalServerError, "server_error", "injected model error")
		return
	}
	// The server always streams from its model.
	out := sse.NewWriter(w)
	w.WriteHeader(http.StatusOK)
	if fault == breakStream {
		_ = out.Data(openai.Encode(openai.Completion{Object: openai.ObjectChunk,
			Choices: []openai.Choice{{Delta: &openai.Delta{Content: replyOf(call.turn)}}}}))
		_ = out.Data(`{"object":"chat.completion.chunk","choices":[{"delta":`)
		return
	}
	for _, c := range []openai.Completion{
		{Object: openai.ObjectChunk, Choices: []openai.Choice{{Delta: &openai.Delta{Role: openai.RoleAssistant}}}},
		{Object: openai.ObjectChunk, Choices: []openai.Choice{{Delta: &openai.Delta{Content: replyOf(call.turn) + " noted"}}}},
		{Object: openai.ObjectChunk, Choices: []openai.Choice{{Delta: &openai.Delta{}, FinishReason: openai.Ptr(openai.FinishStop)}}},
	} {
		_ = out.Data(openai.Encode(c))
	}
	_ = out.Data(openai.DoneSentinel)
}

// raceEnv is a reference server in front of a gate model, with a gauge.
type raceEnv struct {
	model  *gateModel
	srv    *server
	gauge  *sut.Gauge
	client *http.Client
}

func newRaceEnv(t testing.TB, cfg sut.Config) *raceEnv {
	t.Helper()
	m := startGateModel(t)
	if cfg.Gauge == nil {
		cfg.Gauge = &sut.Gauge{}
	}
	cfg.ModelURL = m.URL()
	return &raceEnv{model: m, srv: startServer(t, nil, cfg), gauge: cfg.Gauge, client: newClient(t)}
}

// inFlight is a request sent in the background.
type inFlight struct {
	done   chan reply // receives the response, or status 0 if none came
	err    error      // why none came; read only after done
	cancel context.CancelFunc
}

// send sends the turn tok on conv in the background.
func (e *raceEnv) send(t testing.TB, conv, tok string, stream bool) *inFlight {
	t.Helper()
	return sendChat(t, e.client, e.srv.URL(), conv, chatBody(t, stream, user(tok+" hello from the test")))
}

// sendChat sends body as a turn on conv to the server at base, in the
// background.
func sendChat(t testing.TB, client *http.Client, base, conv, body string) *inFlight {
	t.Helper()
	return sendTo(t, client, base+"/v1/chat/completions", body, headers("", conv))
}

// sendTo sends body to url with the given headers, in the background.
func sendTo(t testing.TB, client *http.Client, url, body string, hdr map[string]string) *inFlight {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestDeadline)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	f := &inFlight{done: make(chan reply, 1), cancel: cancel}
	go func() {
		defer cancel()
		resp, err := client.Do(req)
		if err != nil {
			f.err = err
			f.done <- reply{}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		f.err = err
		f.done <- reply{status: resp.StatusCode, header: resp.Header, body: b}
	}()
	t.Cleanup(cancel)
	return f
}

// wait returns the response, failing the test if none came.
func (f *inFlight) wait(t testing.TB) reply {
	t.Helper()
	r := <-f.done
	require.NoError(t, f.err)
	return r
}

// ok sends the turn tok on conv, requires it to succeed and returns the
// history its model call carried.
func (e *raceEnv) ok(t testing.TB, conv, tok string, stream bool) []string {
	t.Helper()
	n := len(e.model.callsOf(tok))
	r := e.send(t, conv, tok, stream).wait(t)
	requireOK(t, r, stream)
	calls := e.model.callsOf(tok)
	require.Len(t, calls, n+1, "want one model call for %s", tok)
	return calls[n].history
}

// requireOK checks a turn ended ok: a 200 and, streamed, a clean end.
func requireOK(t testing.TB, r reply, stream bool) {
	t.Helper()
	if !stream {
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		return
	}
	s := parseStream(t, r)
	require.True(t, s.done && s.stopped() && s.errors() == 0, "the stream must end ok: %s", r.body)
}

// awaitGauge waits until the gauge satisfies cond. The deadline is only a
// failsafe: the gauge signals every change, so nothing is guessed.
func awaitGauge(t testing.TB, g *sut.Gauge, what string, cond func(working, waiting int) bool) {
	t.Helper()
	failsafe := time.NewTimer(requestDeadline)
	defer failsafe.Stop()
	for {
		working, waiting, changed := g.Read()
		if cond(working, waiting) {
			return
		}
		select {
		case <-changed:
		case <-failsafe.C:
			require.FailNow(t, "the server never came to rest", "want %s; working=%d waiting=%d", what, working, waiting)
		}
	}
}

// awaitWaiting waits until exactly n requests wait for their turn.
func awaitWaiting(t testing.TB, g *sut.Gauge, n int) {
	t.Helper()
	awaitGauge(t, g, fmt.Sprintf("%d waiting", n), func(_, waiting int) bool { return waiting == n })
}

// awaitIdle waits until the server works on nothing.
func awaitIdle(t testing.TB, g *sut.Gauge) {
	t.Helper()
	awaitGauge(t, g, "idle", func(working, waiting int) bool { return working == 0 && waiting == 0 })
}

// arrive waits for a held call to arrive.
func arrive(t testing.TB, g *held, tok string) {
	t.Helper()
	await(t, g.arrived, "the model call of turn "+tok)
}

// hist builds a token history: hist("u1", "a1") is [tc-u1 tc-a1].
func hist(short ...string) []string {
	out := make([]string, len(short))
	for i, s := range short {
		out[i] = "tc-" + s
	}
	return out
}

// ---------------------------------------------------------------------------
// Policies.

func TestParseConcurrency(t *testing.T) {
	for in, want := range map[string]sut.Concurrency{"": sut.Serialize, "serialize": sut.Serialize, "reject": sut.Reject} {
		got, err := sut.ParseConcurrency(in)
		require.NoError(t, err, "%q", in)
		assert.Equal(t, want, got, "%q", in)
	}
	for _, in := range []string{"Reject", "queue", " serialize", "none"} {
		_, err := sut.ParseConcurrency(in)
		require.Error(t, err, "%q", in)
		assert.Contains(t, err.Error(), "serialize", "the error names the valid values")
		assert.Contains(t, err.Error(), "reject", "the error names the valid values")
	}
}

// TestWaitersGetTheConversationInOrder: under Serialize, requests queued
// on a busy conversation get it in the order they started waiting.
func TestWaitersGetTheConversationInOrder(t *testing.T) {
	e := newRaceEnv(t, sut.Config{})
	first := e.model.hold("tc-u1")
	r1 := e.send(t, "c1", "tc-u1", false)
	arrive(t, first, "tc-u1")
	awaitGauge(t, e.gauge, "the first turn running, not waiting", func(working, waiting int) bool {
		return working == 1 && waiting == 0
	})
	var waiters []*inFlight
	for i, tok := range []string{"tc-u2", "tc-u3", "tc-u4"} {
		// Each joins the queue only once the one before is in it.
		waiters = append(waiters, e.send(t, "c1", tok, i%2 == 1))
		awaitWaiting(t, e.gauge, i+1)
	}
	working, _, _ := e.gauge.Read()
	assert.Equal(t, 4, working)

	first.open()
	requireOK(t, r1.wait(t), false)
	for i, w := range waiters {
		requireOK(t, w.wait(t), i%2 == 1)
	}
	assert.Equal(t, hist("u1", "u2", "u3", "u4"), e.model.turns(), "the conversation goes to its waiters first come, first served")
	assert.Equal(t, hist("u1", "a1", "u2", "a2", "u3", "a3", "u4"), e.model.callsOf("tc-u4")[0].history)
	awaitIdle(t, e.gauge)
}

// TestWaitForTheTurnIsBounded: under Serialize a request waits for the
// conversation at most RequestTimeout, by the clock even when the model
// call's deadlines are held, then gets 503 with Retry-After and changes
// nothing.
func TestWaitForTheTurnIsBounded(t *testing.T) {
	const wait = 50 * time.Millisecond
	e := newRaceEnv(t, sut.Config{RequestTimeout: wait, Deadlines: &sut.ManualDeadlines{}})
	first := e.model.hold("tc-u1")
	r1 := e.send(t, "c1", "tc-u1", false)
	arrive(t, first, "tc-u1")

	for i, stream := range []bool{false, true} {
		tok := fmt.Sprintf("tc-u%d", 2+i)
		start := time.Now()
		r := e.send(t, "c1", tok, stream).wait(t)
		requireErrorBody(t, r, http.StatusServiceUnavailable, "conversation_busy")
		assert.Equal(t, "1", r.header.Get("Retry-After"))
		assert.GreaterOrEqual(t, time.Since(start), wait, "the request must have waited its turn first")
		assert.Empty(t, e.model.callsOf(tok), "a request that gave up must not reach the model")
		awaitGauge(t, e.gauge, "only the first turn", func(working, waiting int) bool { return working == 1 && waiting == 0 })
	}
	first.open()
	requireOK(t, r1.wait(t), false)
	assert.Equal(t, hist("u1", "a1", "u4"), e.ok(t, "c1", "tc-u4", false))
	awaitIdle(t, e.gauge)
}

// TestRejectAnswers409AndChangesNothing: under Reject a request for a
// conversation whose turn is running gets 409 conflict at once, reaches no
// model and changes nothing; the running turn is not disturbed.
func TestRejectAnswers409AndChangesNothing(t *testing.T) {
	e := newRaceEnv(t, sut.Config{Concurrency: sut.Reject})
	for i, conv := range []string{"c-existing", "c-new"} {
		t.Run(conv, func(t *testing.T) {
			tok := func(n int) string { return fmt.Sprintf("tc-u%d", 10*i+n) }
			var base []string
			if conv == "c-existing" {
				base = append(e.ok(t, conv, tok(1), false), replyOf(tok(1)))
			}
			running := e.model.hold(tok(2))
			r2 := e.send(t, conv, tok(2), true)
			arrive(t, running, tok(2))
			for j, stream := range []bool{false, true} {
				// Answered while the running turn is still held: at once.
				r := e.send(t, conv, tok(3+j), stream).wait(t)
				requireErrorBody(t, r, http.StatusConflict, "conflict")
				assert.Empty(t, e.model.callsOf(tok(3+j)), "a rejected request must not reach the model")
				_, waiting, _ := e.gauge.Read()
				assert.Zero(t, waiting, "under reject nothing waits")
			}
			running.open()
			requireOK(t, r2.wait(t), true)
			want := append(append([]string(nil), base...), tok(2), replyOf(tok(2)), tok(5))
			assert.Equal(t, want, e.ok(t, conv, tok(5), false), "the rejected turns changed nothing")
			awaitIdle(t, e.gauge)
		})
	}
}

// TestNoSpurious409UnderReject: a client that sends its next turn the
// moment it has read the end of the last one (the [DONE] of a stream, the
// body otherwise) never finds the conversation busy.
func TestNoSpurious409UnderReject(t *testing.T) {
	t.Parallel()
	e := newRaceEnv(t, sut.Config{Concurrency: sut.Reject})
	const turns = 200
	for i := 1; i <= turns; i++ {
		stream := i%3 != 0
		tok := fmt.Sprintf("tc-u%d", i)
		status, end := e.turnUntilEnd(t, "c1", tok, stream)
		require.Equal(t, http.StatusOK, status, "turn %d: %s", i, end)
	}
	calls := e.model.callsOf(fmt.Sprintf("tc-u%d", turns))
	require.Len(t, calls, 1)
	assert.Len(t, calls[0].history, 2*turns-1, "every turn committed, in one line")
}

// turnUntilEnd sends a turn and reads its response only up to the end a
// client acts on: [DONE] for a stream, the body otherwise. It returns the
// status and what was read.
func (e *raceEnv) turnUntilEnd(t testing.TB, conv, tok string, stream bool) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestDeadline)
	defer cancel()
	body := chatBody(t, stream, user(tok+" hello"))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL()+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set(sut.DefaultConversationHeader, conv)
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if !stream || resp.StatusCode != http.StatusOK {
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	var read strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		read.WriteString(sc.Text() + "\n")
		if sc.Text() == "data: [DONE]" {
			return resp.StatusCode, read.String()
		}
	}
	require.FailNow(t, "the stream ended without [DONE]", "%s", read.String())
	return 0, ""
}

// endProbe is a client that, the moment the server writes the end of a
// turn (a body, a finish or error chunk, or [DONE]), sends the next turn
// on the same conversation, in-process and before that write returns. The
// next turn finds the conversation free only if the server released it
// before it wrote the end.
type endProbe struct {
	h      http.Header
	status int
	next   func() int // sends the next turn, returns its status
	// nextStatus is the next turn's status; 0 until the end was written.
	nextStatus int
}

func (p *endProbe) Header() http.Header { return p.h }
func (p *endProbe) WriteHeader(status int) {
	if p.status == 0 {
		p.status = status
	}
}
func (p *endProbe) Flush() {}
func (p *endProbe) Write(b []byte) (int, error) {
	p.WriteHeader(http.StatusOK)
	s := string(b)
	isEnd := !strings.Contains(p.h.Get("Content-Type"), "text/event-stream") ||
		strings.Contains(s, `"finish_reason":"stop"`) || strings.Contains(s, `"error"`) || strings.Contains(s, "[DONE]")
	if isEnd && p.nextStatus == 0 {
		p.nextStatus = p.next()
	}
	return len(b), nil
}

// TestLockIsReleasedBeforeTheTurnsEnd: whether the turn ended ok or failed,
// streamed or not, the conversation is free, and an ok turn is committed,
// by the time the client can read the turn's end.
func TestLockIsReleasedBeforeTheTurnsEnd(t *testing.T) {
	m := startGateModel(t)
	m.fail("tc-u1", answer500)
	m.fail("tc-u4", breakStream)
	gauge := &sut.Gauge{}
	s, err := sut.New(sut.Config{ModelURL: m.URL(), DataDir: t.TempDir(), Concurrency: sut.Reject, Gauge: gauge})
	require.NoError(t, err)
	defer func() { assert.NoError(t, s.Close()) }()
	serve := func(w http.ResponseWriter, tok string, stream bool) {
		req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "http://127.0.0.1/v1/chat/completions",
			strings.NewReader(chatBody(t, stream, user(tok+" hi"))))
		req.Header.Set(sut.DefaultConversationHeader, "c1")
		s.ServeHTTP(w, req)
	}
	next := 10
	committed := []string{}
	for _, tc := range []struct {
		tok    string
		stream bool
		status int
		ok     bool
	}{
		{"tc-u1", false, http.StatusBadGateway, false}, // failed: an error body
		{"tc-u1", true, http.StatusBadGateway, false},  // failed before the stream began: an error body
		{"tc-u4", true, http.StatusOK, false},          // failed midway: an error chunk and [DONE]
		{"tc-u2", false, http.StatusOK, true},          // ok: the completion body
		{"tc-u3", true, http.StatusOK, true},           // ok: the finish chunk and [DONE]
	} {
		t.Run(fmt.Sprintf("%s stream=%t", tc.tok, tc.stream), func(t *testing.T) {
			nextTok := fmt.Sprintf("tc-u%d", next)
			next++
			p := &endProbe{h: http.Header{}, next: func() int {
				rec := httptest.NewRecorder()
				serve(rec, nextTok, false)
				return rec.Code
			}}
			serve(p, tc.tok, tc.stream)
			require.Equal(t, tc.status, p.status)
			require.Equal(t, http.StatusOK, p.nextStatus, "the next turn, sent as the end was written, found the conversation busy")
			want := append([]string(nil), committed...)
			if tc.ok {
				want = append(want, tc.tok, replyOf(tc.tok))
			}
			want = append(want, nextTok)
			calls := m.callsOf(nextTok)
			require.Len(t, calls, 1)
			assert.Equal(t, want, calls[0].history, "the turn must be committed before its end is written")
			committed = append(want, replyOf(nextTok))
		})
	}
	working, waiting, _ := gauge.Read()
	assert.Equal(t, [2]int{0, 0}, [2]int{working, waiting})
}

// ---------------------------------------------------------------------------
// The gauge.

func TestGaugeZeroValue(t *testing.T) {
	var g sut.Gauge
	working, waiting, changed := g.Read()
	assert.Zero(t, working)
	assert.Zero(t, waiting)
	select {
	case <-changed:
		t.Fatal("nothing changed")
	default:
	}
	_, _, again := g.Read()
	assert.Equal(t, changed, again, "readers between two changes share one channel")
}

// TestGaugeCountsWorkingAndWaiting: the gauge counts requests the server
// works on and those of them queued on a conversation, and comes back to
// rest at 0/0.
func TestGaugeCountsWorkingAndWaiting(t *testing.T) {
	e := newRaceEnv(t, sut.Config{})
	working, waiting, _ := e.gauge.Read()
	require.Equal(t, [2]int{0, 0}, [2]int{working, waiting})

	held1 := e.model.hold("tc-u1")
	r1 := e.send(t, "c1", "tc-u1", true)
	arrive(t, held1, "tc-u1")
	working, waiting, changed := e.gauge.Read()
	assert.Equal(t, [2]int{1, 0}, [2]int{working, waiting}, "a request that got its conversation at once never waits")

	r2 := e.send(t, "c1", "tc-u2", false)
	select {
	case <-changed:
	case <-time.After(requestDeadline):
		t.Fatal("a new request must signal a change")
	}
	awaitGauge(t, e.gauge, "2 working, 1 waiting", func(working, waiting int) bool { return working == 2 && waiting == 1 })

	held3 := e.model.hold("tc-u3")
	r3 := e.send(t, "c2", "tc-u3", false)
	arrive(t, held3, "tc-u3")
	awaitGauge(t, e.gauge, "3 working, 1 waiting", func(working, waiting int) bool { return working == 3 && waiting == 1 })

	// The waiter's client goes away: it stops waiting, and its request ends.
	r2.cancel()
	<-r2.done
	require.Error(t, r2.err)
	awaitGauge(t, e.gauge, "2 working, none waiting", func(working, waiting int) bool { return working == 2 && waiting == 0 })

	held1.open()
	held3.open()
	requireOK(t, r1.wait(t), true)
	requireOK(t, r3.wait(t), false)
	awaitIdle(t, e.gauge)
	// The waiter that gave up changed nothing.
	assert.Equal(t, hist("u1", "a1", "u4"), e.ok(t, "c1", "tc-u4", false))
	assert.Empty(t, e.model.callsOf("tc-u2"))
	awaitIdle(t, e.gauge)
}

// gaugeProbe records, at every write, how many requests the gauge says the
// server is working on.
type gaugeProbe struct {
	rec     *httptest.ResponseRecorder
	gauge   *sut.Gauge
	working []int
}

func (p *gaugeProbe) Header() http.Header { return p.rec.Header() }
func (p *gaugeProbe) WriteHeader(status int) {
	p.record()
	p.rec.WriteHeader(status)
}
func (p *gaugeProbe) Write(b []byte) (int, error) {
	p.record()
	return p.rec.Write(b)
}
func (p *gaugeProbe) record() {
	working, _, _ := p.gauge.Read()
	p.working = append(p.working, working)
}

// TestGaugeCountsEveryRequest: every request counts as working while the
// server answers it, whatever the answer, and stops counting when answered.
func TestGaugeCountsEveryRequest(t *testing.T) {
	m := startGateModel(t)
	gauge := &sut.Gauge{}
	s, err := sut.New(sut.Config{ModelURL: m.URL(), DataDir: t.TempDir(), Keys: []string{"k"}, Gauge: gauge})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() }) // a second Close only reports the first's error
	good := chatBody(t, false, user("tc-u1 hi"))
	cases := []struct {
		name, method, path, key, body string
		status                        int
	}{
		{"healthz", http.MethodGet, "/healthz", "", "", http.StatusOK},
		{"unknown path", http.MethodPost, "/nope", "k", good, http.StatusNotFound},
		{"GET", http.MethodGet, "/v1/chat/completions", "k", "", http.StatusMethodNotAllowed},
		{"no key", http.MethodPost, "/v1/chat/completions", "", good, http.StatusUnauthorized},
		{"bad body", http.MethodPost, "/v1/chat/completions", "k", "{", http.StatusBadRequest},
		{"ok", http.MethodPost, "/v1/chat/completions", "k", good, http.StatusOK},
		{"stopped", http.MethodPost, "/v1/chat/completions", "k", good, http.StatusServiceUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "stopped" {
				require.NoError(t, s.Close())
			}
			req := httptest.NewRequestWithContext(context.Background(), tc.method, "http://127.0.0.1"+tc.path, strings.NewReader(tc.body))
			req.Header.Set(sut.DefaultConversationHeader, "c1")
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+tc.key)
			}
			p := &gaugeProbe{rec: httptest.NewRecorder(), gauge: gauge}
			s.ServeHTTP(p, req)
			require.Equal(t, tc.status, p.rec.Code)
			require.NotEmpty(t, p.working)
			for _, w := range p.working {
				assert.Equal(t, 1, w, "the request must count as working while it is answered")
			}
			working, waiting, _ := gauge.Read()
			assert.Equal(t, [2]int{0, 0}, [2]int{working, waiting}, "an answered request no longer counts")
		})
	}
}

// ---------------------------------------------------------------------------
// Two turns on one conversation at once: the clean server serializes them
// or rejects the second, by its policy; the concurrency mutants fork.

// race is how the second of two concurrent turns came to rest.
type race int

const (
	forked   race = iota // it reached the model beside the first, on the same base
	queued               // it waited for the first
	rejected             // it got 409
	refused              // it got 500 "session is busy"
)

func (r race) String() string { return [...]string{"forked", "queued", "rejected", "refused"}[r] }

// raceTwoTurns sends turn a on conv and holds it at the model, then sends
// turn b on conv and waits until b comes to rest. It asserts what each
// outcome implies, lets a and then b finish, and returns how b came to
// rest. base is conv's committed history before.
func raceTwoTurns(t *testing.T, e *raceEnv, conv string, base []string, a, b, next string) race {
	t.Helper()
	with := func(toks ...string) []string { return append(append([]string{}, base...), toks...) }
	gateA, gateB := e.model.hold(a), e.model.hold(b)
	ra := e.send(t, conv, a, true)
	arrive(t, gateA, a)
	rb := e.send(t, conv, b, false)

	var outcome race
	var rbReply reply
	failsafe := time.After(requestDeadline)
rest:
	for {
		_, waiting, changed := e.gauge.Read()
		if waiting == 1 {
			outcome = queued
			break
		}
		select {
		case <-gateB.arrived:
			outcome = forked
			break rest
		case rbReply = <-rb.done:
			require.NoError(t, rb.err)
			outcome = rejected
			if rbReply.status == http.StatusInternalServerError {
				outcome = refused
			}
			break rest
		case <-changed:
		case <-failsafe:
			require.FailNow(t, "the second turn never came to rest")
		}
	}

	switch outcome {
	case forked:
		assert.Equal(t, with(a), e.model.callsOf(a)[0].history)
		assert.Equal(t, with(b), e.model.callsOf(b)[0].history, "both turns ran on the same base")
		gateA.open()
		requireOK(t, ra.wait(t), true)
		gateB.open()
		requireOK(t, rb.wait(t), false)
		// The later commit overwrote the earlier.
		assert.Equal(t, with(b, replyOf(b), next), e.ok(t, conv, next, false), "only the later turn stays")
	case queued:
		assert.Empty(t, e.model.callsOf(b), "a waiting turn has not reached the model")
		gateA.open()
		requireOK(t, ra.wait(t), true)
		arrive(t, gateB, b)
		assert.Equal(t, with(a, replyOf(a), b), e.model.callsOf(b)[0].history, "the waiting turn sees the first")
		gateB.open()
		requireOK(t, rb.wait(t), false)
		assert.Equal(t, with(a, replyOf(a), b, replyOf(b), next), e.ok(t, conv, next, false))
	case rejected:
		requireErrorBody(t, rbReply, http.StatusConflict, "conflict")
		assert.Empty(t, e.model.callsOf(b), "a rejected turn must not reach the model")
		gateA.open()
		requireOK(t, ra.wait(t), true)
		assert.Equal(t, with(a, replyOf(a), next), e.ok(t, conv, next, false), "the rejected turn changed nothing")
	case refused:
		requireErrorBody(t, rbReply, http.StatusInternalServerError, "server_error")
		assert.Contains(t, string(rbReply.body), "session is busy")
		assert.Empty(t, e.model.callsOf(b), "a refused turn must not reach the model")
		gateA.open()
		requireOK(t, ra.wait(t), true)
		assert.Equal(t, with(a, replyOf(a), next), e.ok(t, conv, next, false), "the refused turn changed nothing")
	}
	awaitIdle(t, e.gauge)
	return outcome
}

// raceMutants are the mutants the race tests below show; TestMutantsBite
// counts them covered.
var raceMutants = []sut.Mutant{sut.ForkNewSession, sut.NoConversationLock, sut.RefuseConcurrentNew}

// TestConcurrentFirstTurnsOnANewConversation: two first turns on a new id
// at once. The clean server serializes them or rejects the second (T4);
// fork-new-session and no-conversation-lock start two histories, and the
// later commit wins. A mutant without the lock never answers 409.
// refuse-concurrent-new answers the second 500 at once, under either
// policy, where it should wait (or get 409).
func TestConcurrentFirstTurnsOnANewConversation(t *testing.T) {
	for _, tc := range []struct {
		mutant sut.Mutant
		policy sut.Concurrency
		want   race
	}{
		{sut.Clean, sut.Serialize, queued},
		{sut.Clean, sut.Reject, rejected},
		{sut.ForkNewSession, sut.Serialize, forked},
		{sut.ForkNewSession, sut.Reject, forked},
		{sut.NoConversationLock, sut.Serialize, forked},
		{sut.NoConversationLock, sut.Reject, forked},
		{sut.RefuseConcurrentNew, sut.Serialize, refused},
		{sut.RefuseConcurrentNew, sut.Reject, refused},
	} {
		t.Run(fmt.Sprintf("%s/%s", cmp.Or(string(tc.mutant), "clean"), tc.policy), func(t *testing.T) {
			e := newRaceEnv(t, sut.Config{Mutant: tc.mutant, Concurrency: tc.policy})
			assert.Equal(t, tc.want, raceTwoTurns(t, e, "c-new", nil, "tc-u1", "tc-u2", "tc-u3"))
		})
	}
}

// TestConcurrentContinuations: two continuations of one conversation at
// once. Only no-conversation-lock forks them; fork-new-session takes the
// lock for a conversation that exists, as the clean server does, and
// refuse-concurrent-new lets a continuation wait (or get 409) as it does.
func TestConcurrentContinuations(t *testing.T) {
	for _, tc := range []struct {
		mutant sut.Mutant
		policy sut.Concurrency
		want   race
	}{
		{sut.Clean, sut.Serialize, queued},
		{sut.Clean, sut.Reject, rejected},
		{sut.ForkNewSession, sut.Serialize, queued},
		{sut.ForkNewSession, sut.Reject, rejected},
		{sut.NoConversationLock, sut.Serialize, forked},
		{sut.NoConversationLock, sut.Reject, forked},
		{sut.RefuseConcurrentNew, sut.Serialize, queued},
		{sut.RefuseConcurrentNew, sut.Reject, rejected},
	} {
		t.Run(fmt.Sprintf("%s/%s", cmp.Or(string(tc.mutant), "clean"), tc.policy), func(t *testing.T) {
			e := newRaceEnv(t, sut.Config{Mutant: tc.mutant, Concurrency: tc.policy})
			require.Equal(t, hist("u1"), e.ok(t, "c1", "tc-u1", false))
			assert.Equal(t, tc.want, raceTwoTurns(t, e, "c1", hist("u1", "a1"), "tc-u2", "tc-u3", "tc-u4"))
		})
	}
}
