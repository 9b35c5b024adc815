package sut_test

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/sut"
)

// defaultSystem is the reference server's system message for a turn bound
// to no agent.
const defaultSystem = "You are the turncheck reference agent."

// ---------------------------------------------------------------------------
// Harness: a fake model whose front records system messages, and servers
// restarted on one data dir with the agents of each start.

// agentModel is a fake model behind a front that records the system message
// of every chat call: the fake model reads only tokens, and an instruction
// carries none. The front also serves the model's agent definitions.
type agentModel struct {
	*faults.Model
	front *httptest.Server

	mu      sync.Mutex
	systems []string
}

func startAgentModel(t testing.TB) *agentModel {
	t.Helper()
	am := &agentModel{Model: startModel(t)}
	am.front = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/chat/completions") {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				panic(http.ErrAbortHandler)
			}
			var req struct {
				Messages []struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"messages"`
			}
			_ = json.Unmarshal(body, &req)
			system := ""
			if len(req.Messages) > 0 && req.Messages[0].Role == "system" {
				system = req.Messages[0].Content
			}
			am.mu.Lock()
			am.systems = append(am.systems, system)
			am.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		am.Model.ServeHTTP(w, r)
	}))
	t.Cleanup(am.front.Close) // before the model's own Close, registered earlier
	return am
}

// URL is the model's base URL, through the front.
func (am *agentModel) URL() string { return am.front.URL + "/v1" }

// ref is the reference of agent name served by the fake model, with query.
func (am *agentModel) ref(name, query string) string {
	r := am.front.URL + "/agents/" + name + ".yaml"
	if query != "" {
		r += "?" + query
	}
	return r
}

// instruction is what the fake model's agent name, loaded with query,
// instructs.
func instruction(name, query string) string {
	from := "/agents/" + name + ".yaml"
	if query != "" {
		from += "?" + query
	}
	return "You are " + name + ", loaded from " + from + "."
}

// lastSystem is the system message of the latest chat call.
func (am *agentModel) lastSystem(t testing.TB) string {
	t.Helper()
	am.mu.Lock()
	defer am.mu.Unlock()
	require.NotEmpty(t, am.systems, "no chat call yet")
	return am.systems[len(am.systems)-1]
}

// agentEnv runs a server on one data dir, restarted (or crashed) with other
// agents or another mutant at will.
type agentEnv struct {
	t      *testing.T
	am     *agentModel
	dir    string
	client *http.Client
	cur    *server
}

func newAgentEnv(t *testing.T) *agentEnv {
	return &agentEnv{t: t, am: startAgentModel(t), dir: t.TempDir(), client: newClient(t)}
}

// start stops the running server, if any, gracefully and starts cfg on the
// same data dir, in front of the same model.
func (a *agentEnv) start(cfg sut.Config) *env {
	a.t.Helper()
	if a.cur != nil {
		require.NoError(a.t, a.cur.Close())
		a.client.CloseIdleConnections()
	}
	cfg.ModelURL, cfg.DataDir = a.am.URL(), a.dir
	a.cur = startServer(a.t, a.am.Model, cfg)
	return &env{model: a.am.Model, srv: a.cur, client: a.client}
}

// with starts a clean server loading agents.
func (a *agentEnv) with(agents ...string) *env {
	a.t.Helper()
	return a.start(sut.Config{Agents: agents})
}

// crash crashes the running server.
func (a *agentEnv) crash() {
	a.t.Helper()
	require.NoError(a.t, a.cur.Crash())
	a.client.CloseIdleConnections()
}

// turnAs sends the user message "<tok> ..." to conv, naming modelName.
func (e *env) turnAs(t testing.TB, modelName, conv string, tok model.Token) reply {
	t.Helper()
	b, err := json.Marshal(map[string]any{"model": modelName, "messages": []msg{user(string(tok) + " hello")}})
	require.NoError(t, err)
	return e.post(t, string(b), headers("", conv))
}

// okAs sends a turn naming modelName that must succeed, and returns the
// history the model was sent for it.
func (e *env) okAs(t testing.TB, modelName, conv string, tok model.Token) []model.Token {
	t.Helper()
	n := e.model.CallCount()
	r := e.turnAs(t, modelName, conv, tok)
	require.Equal(t, http.StatusOK, r.status, "turn %s: %s", tok, r.body)
	requireCompletion(t, r, tok)
	return oneCall(t, e.model, n, tok)
}

// refusedAs sends a turn naming modelName that must be refused with status
// and typ before any model call, and returns the error message.
func (e *env) refusedAs(t testing.TB, modelName, conv string, tok model.Token, status int, typ string) string {
	t.Helper()
	n := e.model.CallCount()
	r := e.turnAs(t, modelName, conv, tok)
	requireErrorBody(t, r, status, typ)
	assert.Equal(t, n, e.model.CallCount(), "a refused turn reaches no model")
	var eb struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(r.body, &eb))
	return eb.Error.Message
}

// writeAgent writes a definition file and returns its path.
func writeAgent(t testing.TB, dir, file, text string) string {
	t.Helper()
	path := filepath.Join(dir, file)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	return path
}

// ---------------------------------------------------------------------------
// Loading.

// TestNewRefusesBadAgents: a reference that does not load or parse fails
// New with an error naming it, before the data dir is touched.
func TestNewRefusesBadAgents(t *testing.T) {
	t.Parallel()
	restore := sut.SetAgentFetchTimeout(300 * time.Millisecond)
	defer restore()
	am := startAgentModel(t)
	files := t.TempDir()
	big := writeAgent(t, files, "big.yaml", "name: big\ninstruction: "+strings.Repeat("x", 64<<10)+"\n")
	hang := make(chan struct{})
	defer close(hang)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	huge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "name: huge\ninstruction: "+strings.Repeat("y", 64<<10)+"\n")
	}))
	defer huge.Close()

	for name, tc := range map[string]struct{ ref, why string }{
		"404":               {am.front.URL + "/agents/no.such.yaml", "404"},
		"unreachable":       {"http://127.0.0.1:1/agents/a.yaml", "fetch"},
		"hangs":             {slow.URL + "/agents/a.yaml", "fetch"},
		"over 64 KiB (URL)": {huge.URL + "/agents/a.yaml", "over 65536 bytes"},
		"over 64 KiB":       {big, "over 65536 bytes"},
		"other scheme":      {"ftp://127.0.0.1/agents/a.yaml", "scheme"},
		"no host":           {"http:///agents/a.yaml", "host"},
		"missing file":      {filepath.Join(files, "none.yaml"), "no such file"},
		"not YAML":          {writeAgent(t, files, "bad.yaml", "name: [unclosed\n"), "parse"},
		"not a mapping":     {writeAgent(t, files, "list.yaml", "- name: a\n"), "parse"},
		"unknown field":     {writeAgent(t, files, "extra.yaml", "name: a\ninstruction: b\ntools: []\n"), "tools"},
		"no name":           {writeAgent(t, files, "noname.yaml", "instruction: b\n"), `"name" is required`},
		"no instruction":    {writeAgent(t, files, "noinst.yaml", "name: a\ninstruction: '  '\n"), `"instruction" is required`},
		"empty":             {writeAgent(t, files, "empty.yaml", ""), "empty"},
		"two documents":     {writeAgent(t, files, "two.yaml", "name: a\ninstruction: b\n---\nname: c\n"), "one YAML document"},
		"blank reference":   {" ", "empty reference"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			s, err := sut.New(sut.Config{ModelURL: am.URL(), DataDir: dir, Agents: []string{am.ref("ok", ""), tc.ref}})
			if s != nil {
				_ = s.Close()
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), fmt.Sprintf("agent %q", tc.ref), "the error names the reference")
			assert.Contains(t, err.Error(), tc.why)
			assert.NoDirExists(t, dir, "a server whose agents do not load leaves its data dir alone")
		})
	}
	t.Run("given twice", func(t *testing.T) {
		ref := am.ref("a", "tag=v1")
		_, err := sut.New(sut.Config{ModelURL: am.URL(), DataDir: t.TempDir(), Agents: []string{ref, ref}})
		require.Error(t, err)
		assert.Contains(t, err.Error(), fmt.Sprintf("agent %q: given twice", ref))
	})
}

// ---------------------------------------------------------------------------
// Binding a new conversation.

// TestAgentInstructionIsTheSystemMessage: every model call of a bound
// conversation opens with its agent's instruction, whatever model later
// requests name; stateless requests, and servers without agents, keep the
// default.
func TestAgentInstructionIsTheSystemMessage(t *testing.T) {
	a := newAgentEnv(t)
	e := a.with(a.am.ref("helper", "tag=v1"))
	require.Equal(t, toks("u1"), e.okAs(t, "helper", "c1", "tc-u1"))
	assert.Equal(t, instruction("helper", "tag=v1"), a.am.lastSystem(t))
	require.Equal(t, toks("u1", "a1", "u2"), e.okAs(t, "no-such-agent", "c1", "tc-u2"), "a resume ignores the model")
	assert.Equal(t, instruction("helper", "tag=v1"), a.am.lastSystem(t))

	r := e.post(t, `{"model":"anything","messages":[{"role":"user","content":"tc-u3 hi"}]}`, nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, defaultSystem, a.am.lastSystem(t), "a stateless request is bound to no agent")

	e = a.with()
	require.Equal(t, toks("u4"), e.okAs(t, "anything", "c2", "tc-u4"), "with no agents, nothing binds")
	assert.Equal(t, defaultSystem, a.am.lastSystem(t))
}

// TestNewConversationBindsByModel: a source key exactly, else the one
// source with that stable key, else the one agent of that name; several is
// 409 naming them, none is 404; a refused turn reaches no model and starts
// nothing.
func TestNewConversationBindsByModel(t *testing.T) {
	a := newAgentEnv(t)
	file := writeAgent(t, t.TempDir(), "filer.yaml", "name: filer\ninstruction: You file things.\n")
	v1, v2, other := a.am.ref("helper", "tag=v1"), a.am.ref("helper", "tag=v2"), a.am.ref("other", "tag=v1")
	e := a.with(v1, v2, other, file)
	stableHelper := a.am.ref("helper", "")

	for i, tc := range []struct{ model, system string }{
		{v1, instruction("helper", "tag=v1")},
		{v2, instruction("helper", "tag=v2")},
		{a.am.ref("other", ""), instruction("other", "tag=v1")},
		{a.am.ref("other", "tag=v9#x"), instruction("other", "tag=v1")},
		{"other", instruction("other", "tag=v1")},
		{"filer", "You file things."},
		{file, "You file things."},
	} {
		conv := fmt.Sprintf("bind-%d", i)
		tok := model.UserToken(i + 1)
		require.Equal(t, []model.Token{tok}, e.okAs(t, tc.model, conv, tok), tc.model)
		assert.Equal(t, tc.system, a.am.lastSystem(t), tc.model)
	}

	for _, ambiguous := range []string{"helper", stableHelper, stableHelper + "?tag=v3"} {
		msg := e.refusedAs(t, ambiguous, "c-ambiguous", "tc-u20", http.StatusConflict, "conflict")
		assert.Contains(t, msg, fmt.Sprintf("%q", v1), ambiguous)
		assert.Contains(t, msg, fmt.Sprintf("%q", v2), ambiguous)
	}
	msg := e.refusedAs(t, "nobody", "c-ambiguous", "tc-u21", http.StatusNotFound, "not_found")
	assert.Contains(t, msg, `"nobody"`)
	assert.Contains(t, msg, fmt.Sprintf("%q", other), "the error lists what is loaded")
	// Nothing was started: the conversation's first ok turn binds anew.
	require.Equal(t, toks("u22"), e.okAs(t, "other", "c-ambiguous", "tc-u22"))
	assert.Equal(t, instruction("other", "tag=v1"), a.am.lastSystem(t))
}

// TestFailedFirstTurnBindsNothing: the source is recorded with the first
// commit: a first turn that failed leaves the conversation free to bind to
// another agent, and that one sticks across a restart.
func TestFailedFirstTurnBindsNothing(t *testing.T) {
	a := newAgentEnv(t)
	helper, other := a.am.ref("helper", "tag=v1"), a.am.ref("other", "tag=v1")
	e := a.with(helper, other)
	a.am.Script("tc-u1", faults.Fault{Kind: faults.Status, Status: 500})
	requireErrorBody(t, e.turnAs(t, "helper", "c1", "tc-u1"), http.StatusBadGateway, "upstream_error")
	require.Equal(t, toks("u2"), e.okAs(t, "other", "c1", "tc-u2"))

	e = a.with(a.am.ref("other", "tag=v2"), helper)
	require.Equal(t, toks("u2", "a2", "u3"), e.okAs(t, "helper", "c1", "tc-u3"))
	assert.Equal(t, instruction("other", "tag=v2"), a.am.lastSystem(t))
}

// ---------------------------------------------------------------------------
// Resuming (T8).

// TestResumeAfterQueryChange: docker-agent #3410. A conversation started
// under ?tag=v1 resumes, history whole, after relaunches under other
// queries, with the instruction now loaded.
func TestResumeAfterQueryChange(t *testing.T) {
	a := newAgentEnv(t)
	e := a.with(a.am.ref("helper", "tag=v1"))
	require.Equal(t, toks("u1"), e.okAs(t, "helper", "c1", "tc-u1"))
	require.Equal(t, toks("u1", "a1", "u2"), e.okAs(t, "helper", "c1", "tc-u2"))

	e = a.with(a.am.ref("helper", "tag=v2"))
	require.Equal(t, toks("u1", "a1", "u2", "a2", "u3"), e.okAs(t, "whatever", "c1", "tc-u3"))
	assert.Equal(t, instruction("helper", "tag=v2"), a.am.lastSystem(t))

	e = a.with(a.am.ref("helper", "tag=v3&cache=1"))
	require.Equal(t, toks("u1", "a1", "u2", "a2", "u3", "a3", "u4"), e.okAs(t, "helper", "c1", "tc-u4"))
	assert.Equal(t, instruction("helper", "tag=v3&cache=1"), a.am.lastSystem(t))
}

// TestResumeAmbiguousIs409AndChangesNothing: with several loaded sources
// sharing the recorded key's stable key, and the recorded one not loaded,
// the resume is refused with 409 naming them, before any model call; the
// exact recorded key, when loaded, wins over them.
func TestResumeAmbiguousIs409AndChangesNothing(t *testing.T) {
	a := newAgentEnv(t)
	v1, v2, v3 := a.am.ref("helper", "tag=v1"), a.am.ref("helper", "tag=v2"), a.am.ref("helper", "tag=v3")
	e := a.with(v1)
	require.Equal(t, toks("u1"), e.okAs(t, "helper", "c1", "tc-u1"))

	e = a.with(v2, v3)
	msg := e.refusedAs(t, "helper", "c1", "tc-u2", http.StatusConflict, "conflict")
	for _, ref := range []string{v1, v2, v3} {
		assert.Contains(t, msg, fmt.Sprintf("%q", ref))
	}
	assert.Contains(t, msg, "nothing was changed")

	e = a.with(v2, v1)
	require.Equal(t, toks("u1", "a1", "u3"), e.okAs(t, v2, "c1", "tc-u3"), "the exact key wins; the refused turn left nothing")
	assert.Equal(t, instruction("helper", "tag=v1"), a.am.lastSystem(t))
}

// TestResumeWithoutItsSourceIs404: a conversation whose source is not
// loaded, under any query, is refused with 404 naming its source key; it is
// kept for when the source is back.
func TestResumeWithoutItsSourceIs404(t *testing.T) {
	a := newAgentEnv(t)
	v1 := a.am.ref("helper", "tag=v1")
	e := a.with(v1)
	require.Equal(t, toks("u1"), e.okAs(t, "helper", "c1", "tc-u1"))

	for _, agents := range [][]string{{a.am.ref("other", "tag=v1")}, nil} {
		e = a.with(agents...)
		msg := e.refusedAs(t, "other", "c1", "tc-u2", http.StatusNotFound, "not_found")
		assert.Contains(t, msg, fmt.Sprintf("%q", v1))
	}
	e = a.with(a.am.ref("helper", "tag=v9"))
	require.Equal(t, toks("u1", "a1", "u3"), e.okAs(t, "helper", "c1", "tc-u3"))
}

// TestFileAgentResumesUnderAnotherSpelling: a file's stable key is its
// cleaned absolute path, so a relaunch that names the same file another way
// resumes its conversations.
func TestFileAgentResumesUnderAnotherSpelling(t *testing.T) {
	a := newAgentEnv(t)
	t.Chdir(t.TempDir())
	writeAgent(t, ".", "agents/a.yaml", "name: a\ninstruction: You are the file agent.\n")
	e := a.with("agents/a.yaml")
	require.Equal(t, toks("u1"), e.okAs(t, "a", "c1", "tc-u1"))

	e = a.with("./agents/../agents/a.yaml")
	require.Equal(t, toks("u1", "a1", "u2"), e.okAs(t, "a", "c1", "tc-u2"))
	assert.Equal(t, "You are the file agent.", a.am.lastSystem(t))
}

// TestDataDirFromBeforeSourcesOpens: a store written before conversations
// recorded their source opens; its conversations resume unbound, and new
// ones bind.
func TestDataDirFromBeforeSourcesOpens(t *testing.T) {
	a := newAgentEnv(t)
	require.NoError(t, os.MkdirAll(a.dir, 0o755))
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", OmitHost: true, Path: filepath.Join(a.dir, "conversations.db")}).String())
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE messages (scope TEXT NOT NULL, conversation TEXT NOT NULL, seq INTEGER NOT NULL,
		role TEXT NOT NULL, content TEXT NOT NULL, PRIMARY KEY (scope, conversation, seq)) WITHOUT ROWID;
		INSERT INTO messages VALUES ('', 'old', 0, 'user', 'tc-u1 hi'), ('', 'old', 1, 'assistant', 'tc-a1 hello');`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	e := a.with(a.am.ref("helper", "tag=v1"))
	require.Equal(t, toks("u1", "a1", "u2"), e.okAs(t, "helper", "old", "tc-u2"))
	assert.Equal(t, defaultSystem, a.am.lastSystem(t), "a conversation that recorded no source stays unbound")
	require.Equal(t, toks("u3"), e.okAs(t, "helper", "new", "tc-u3"))
	assert.Equal(t, instruction("helper", "tag=v1"), a.am.lastSystem(t))
}
