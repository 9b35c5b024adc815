package sut_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Harness: the sessions API.

// newSession creates a session under key and returns its id.
func (e *env) newSession(t testing.TB, key string) string {
	t.Helper()
	r := postURL(t, e.client, e.srv.URL()+"/api/sessions", "{}", headers(key, ""))
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	var created struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(r.body, &created), "%s", r.body)
	require.NotEmpty(t, created.ID)
	return created.ID
}

// sessionTurn sends the user message "<tok> ..." to session with agent.
func (e *env) sessionTurn(t testing.TB, key, session, agent string, tok model.Token) reply {
	t.Helper()
	body, err := json.Marshal([]msg{assistant("tc-a90 an old reply, never sent"), user(string(tok) + " hello from the test")})
	require.NoError(t, err)
	return postURL(t, e.client, e.srv.URL()+"/api/sessions/"+url.PathEscape(session)+"/agent/"+url.PathEscape(agent), string(body), headers(key, ""))
}

// sessionEvent is one event of a session turn's stream.
type sessionEvent struct {
	Type    string `json:"type"`
	Content string `json:"content"`
	Error   string `json:"error"`
}

// sessionStream reads a session turn's answer: a 200 stream of data
// lines; it returns the reply's text and the last event.
func sessionStream(t testing.TB, r reply) (string, sessionEvent) {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Contains(t, r.header.Get("Content-Type"), "text/event-stream")
	var text strings.Builder
	var events []sessionEvent
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	for sc.Scan() {
		if sc.Text() == "" {
			continue
		}
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		require.True(t, ok, "unexpected stream line %q", sc.Text())
		var ev sessionEvent
		require.NoError(t, json.Unmarshal([]byte(data), &ev), "event %q", data)
		if ev.Type == "agent_choice" {
			text.WriteString(ev.Content)
		}
		events = append(events, ev)
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, events)
	return text.String(), events[len(events)-1]
}

// okSession sends a session turn that must succeed and returns the history
// its one model call carried.
func (e *env) okSession(t testing.TB, key, session, agent string, tok model.Token) []model.Token {
	t.Helper()
	n := e.model.CallCount()
	text, last := sessionStream(t, e.sessionTurn(t, key, session, agent, tok))
	require.Equal(t, "stream_stopped", last.Type, "%+v", last)
	assert.Equal(t, strings.Join(faults.ReplyChunks(tok), ""), model.WithoutCallMarks(text))
	return oneCall(t, e.model, n, tok)
}

// ---------------------------------------------------------------------------
// Sessions.

// TestSessionTurnsSeeTheirHistory: a session keeps its turns, scoped by
// key, apart from chat conversations and from other sessions; only the
// last message of a turn's array is new.
func TestSessionTurnsSeeTheirHistory(t *testing.T) {
	e := newEnv(t, sut.Config{Keys: []string{"key-a", "key-b"}})
	s1 := e.newSession(t, "key-a")
	require.Equal(t, toks("u1"), e.okSession(t, "key-a", s1, "root", "tc-u1"))
	require.Equal(t, toks("u1", "a1", "u2"), e.okSession(t, "key-a", s1, "root", "tc-u2"))

	s2 := e.newSession(t, "key-a")
	assert.NotEqual(t, s1, s2)
	assert.Equal(t, toks("u3"), e.okSession(t, "key-a", s2, "root", "tc-u3"))
	assert.Equal(t, toks("u4"), e.ok(t, "key-a", s1, "tc-u4"), "a chat conversation named as the session is another")

	// Another key's session, or none, is 404 before any model call.
	n := e.model.CallCount()
	for name, session := range map[string]string{"another key's": s1, "unknown": "no-such-session", "bad id": "a\x01b"} {
		r := e.sessionTurn(t, "key-b", session, "root", "tc-u5")
		requireErrorBody(t, r, http.StatusNotFound, "not_found")
		assert.NotContains(t, string(r.body), "tc-", name)
	}
	requireErrorBody(t, e.sessionTurn(t, "", s1, "root", "tc-u5"), http.StatusUnauthorized, "unauthorized")
	assert.Equal(t, n, e.model.CallCount())
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u6"), e.okSession(t, "key-a", s1, "root", "tc-u6"))
}

// TestSessionRefusals: a turn without a usable new user message, or
// malformed, is a plain 400 before any model call; creating a session
// takes {} or nothing.
func TestSessionRefusals(t *testing.T) {
	e := newEnv(t, sut.Config{})
	s := e.newSession(t, "")
	require.Equal(t, toks("u1"), e.okSession(t, "", s, "root", "tc-u1"))
	base := e.srv.URL() + "/api/sessions/" + s + "/agent/root"
	for name, body := range map[string]string{
		"empty array":      `[]`,
		"last assistant":   `[{"role":"user","content":"tc-u5"},{"role":"assistant","content":"tc-a5"}]`,
		"blank last user":  `[{"role":"user","content":"tc-u5"},{"role":"user","content":"  "}]`,
		"an object":        `{"role":"user","content":"tc-u5"}`,
		"not JSON":         `tc-u5`,
		"content a number": `[{"role":"user","content":5}]`,
	} {
		r := postURL(t, e.client, base, body, nil)
		requireErrorBody(t, r, http.StatusBadRequest, "invalid_request_error")
		assert.NotContains(t, r.header.Get("Content-Type"), "event-stream", name)
	}
	requireErrorBody(t, postURL(t, e.client, e.srv.URL()+"/api/sessions", `[1]`, nil), http.StatusBadRequest, "invalid_request_error")
	r := postURL(t, e.client, e.srv.URL()+"/api/sessions", ``, nil)
	assert.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	requireErrorBody(t, postURL(t, e.client, e.srv.URL()+"/api/sessions/"+s+"/agents/root", `[]`, nil), http.StatusNotFound, "not_found")
	assert.Equal(t, 1, e.model.CallCount())
	assert.Equal(t, toks("u1", "a1", "u2"), e.okSession(t, "", s, "root", "tc-u2"))
}

// TestSessionFailedTurnIsAnErrorEvent: a turn whose model fails ends its
// stream with an error event, and nothing of it is committed.
func TestSessionFailedTurnIsAnErrorEvent(t *testing.T) {
	e := newEnv(t, sut.Config{})
	s := e.newSession(t, "")
	require.Equal(t, toks("u1"), e.okSession(t, "", s, "root", "tc-u1"))
	for _, f := range []faults.Fault{{Kind: faults.Status, Status: 500}, {Kind: faults.Cut, After: 1}} {
		e.model.Script("tc-u2", f)
		_, last := sessionStream(t, e.sessionTurn(t, "", s, "root", "tc-u2"))
		assert.Equal(t, "error", last.Type, f.String())
		assert.NotEmpty(t, last.Error)
	}
	assert.Equal(t, toks("u1", "a1", "u3"), e.okSession(t, "", s, "root", "tc-u3"))
}

// TestSessionsSerializeTheirTurns: a session's turns take its lock as
// chat's do: a second turn waits for the first.
func TestSessionsSerializeTheirTurns(t *testing.T) {
	gauge := &sut.Gauge{}
	e := newEnv(t, sut.Config{Gauge: gauge})
	s := e.newSession(t, "")
	g := e.model.Gate("tc-u1")
	body := func(tok string) string { return `[{"role":"user","content":"` + tok + ` hi"}]` }
	turnURL := e.srv.URL() + "/api/sessions/" + s + "/agent/root"
	f1 := sendTo(t, e.client, turnURL, body("tc-u1"), nil)
	await(t, g.Arrived(), "the model call of tc-u1")
	f2 := sendTo(t, e.client, turnURL, body("tc-u2"), nil)
	awaitWaiting(t, gauge, 1)
	g.Release()
	for _, f := range []*inFlight{f1, f2} {
		_, last := sessionStream(t, f.wait(t))
		assert.Equal(t, "stream_stopped", last.Type)
	}
	calls := callsSince(e.model, 0)
	require.Len(t, calls, 2)
	assert.Equal(t, toks("u1"), calls[0].History)
	assert.Equal(t, toks("u1", "a1", "u2"), calls[1].History)
}

// sessionResumesAfterQueryChange starts a session with agent helper loaded
// under ?tag=v1, restarts under ?tag=v2, and resumes it; it reports
// whether the resume failed with 500 "agent not found" (only under
// session-exact-source-key). A chat conversation resumes either way.
func sessionResumesAfterQueryChange(t *testing.T, m sut.Mutant) bool {
	a := newAgentEnv(t)
	e := a.start(sut.Config{Mutant: m, Agents: []string{a.am.ref("helper", "tag=v1")}})
	s := e.newSession(t, "")
	require.Equal(t, toks("u1"), e.okSession(t, "", s, "helper", "tc-u1"))
	require.Equal(t, toks("u2"), e.okAs(t, "helper", "c1", "tc-u2"))
	e = a.start(sut.Config{Mutant: m, Agents: []string{a.am.ref("helper", "tag=v2")}})
	require.Equal(t, toks("u2", "a2", "u3"), e.okAs(t, "helper", "c1", "tc-u3"), "chat turns resume")

	n := a.am.CallCount()
	r := e.sessionTurn(t, "", s, "anyone", "tc-u4")
	if r.status == http.StatusOK {
		_, last := sessionStream(t, r)
		require.Equal(t, "stream_stopped", last.Type)
		assert.Equal(t, toks("u1", "a1", "u4"), oneCall(t, a.am.Model, n, "tc-u4"))
		assert.Equal(t, instruction("helper", "tag=v2"), a.am.lastSystem(t))
		return false
	}
	requireErrorBody(t, r, http.StatusInternalServerError, "server_error")
	assert.Contains(t, string(r.body), "agent not found")
	assert.Equal(t, n, a.am.CallCount())
	return true
}

// TestSessionAgents: a session's first turn binds its agent by the path's
// name (404 for none, 409 for several), later turns resume with the
// recorded source, and an ambiguous resume after a restart is 409.
func TestSessionAgents(t *testing.T) {
	assert.False(t, sessionResumesAfterQueryChange(t, sut.Clean))

	a := newAgentEnv(t)
	v1, v2 := a.am.ref("helper", "tag=v1"), a.am.ref("helper", "tag=v2")
	e := a.with(v1, v2, a.am.ref("other", "tag=v1"))
	s := e.newSession(t, "")
	requireErrorBody(t, e.sessionTurn(t, "", s, "nobody", "tc-u1"), http.StatusNotFound, "not_found")
	requireErrorBody(t, e.sessionTurn(t, "", s, "helper", "tc-u1"), http.StatusConflict, "conflict")
	require.Equal(t, toks("u1"), e.okSession(t, "", s, v1, "tc-u1"), "an agent named by its source key")
	assert.Equal(t, instruction("helper", "tag=v1"), a.am.lastSystem(t))
	require.Equal(t, toks("u1", "a1", "u2"), e.okSession(t, "", s, "other", "tc-u2"), "a resume ignores the path's agent")
	assert.Equal(t, instruction("helper", "tag=v1"), a.am.lastSystem(t))

	a.crash()
	e = a.with(v2, a.am.ref("helper", "tag=v3"))
	requireErrorBody(t, e.sessionTurn(t, "", s, "helper", "tc-u3"), http.StatusConflict, "conflict")
	e = a.with(v2)
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u4"), e.okSession(t, "", s, "helper", "tc-u4"))
}

// TestSessionResumeNamedBySourceKey: a session turn may name its agent by
// the source key, as docker-agent's client does with the key its session
// was created under. After a relaunch under another query the clean server
// resumes a session whichever key its turn names; session-exact-source-key
// looks the named key up exactly, as docker-agent did before #3410: the old
// key is 500 "agent not found" and changes nothing, while the key loaded
// now resumes, so only a client that keeps naming the old key sees the bug.
func TestSessionResumeNamedBySourceKey(t *testing.T) {
	for _, m := range []sut.Mutant{sut.Clean, sut.SessionExactSourceKey} {
		t.Run(string(m), func(t *testing.T) {
			a := newAgentEnv(t)
			v1, v2 := a.am.ref("helper", "tag=v1"), a.am.ref("helper", "tag=v2")
			e := a.start(sut.Config{Mutant: m, Agents: []string{v1}})
			old, current := e.newSession(t, ""), e.newSession(t, "")
			require.Equal(t, toks("u1"), e.okSession(t, "", old, v1, "tc-u1"))
			require.Equal(t, toks("u2"), e.okSession(t, "", current, v1, "tc-u2"))
			e = a.start(sut.Config{Mutant: m, Agents: []string{v2}})

			assert.Equal(t, toks("u2", "a2", "u3"), e.okSession(t, "", current, v2, "tc-u3"), "named by the key loaded now")
			assert.Equal(t, instruction("helper", "tag=v2"), a.am.lastSystem(t))
			n := a.am.CallCount()
			r := e.sessionTurn(t, "", old, v1, "tc-u4")
			if m == sut.Clean {
				_, last := sessionStream(t, r)
				require.Equal(t, "stream_stopped", last.Type)
				assert.Equal(t, toks("u1", "a1", "u4"), oneCall(t, a.am.Model, n, "tc-u4"), "named by the key it was created under")
				assert.Equal(t, instruction("helper", "tag=v2"), a.am.lastSystem(t))
				return
			}
			requireErrorBody(t, r, http.StatusInternalServerError, "server_error")
			assert.Contains(t, string(r.body), "agent not found")
			assert.Equal(t, n, a.am.CallCount(), "refused before any model call")
		})
	}
}
