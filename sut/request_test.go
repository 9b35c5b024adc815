package sut_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// What a chat request must be: its Content-Type, its conversation header,
// its JSON and its fields (request.go, internal/openai/strict.go).

// goTypes matches what encoding/json's errors say of Go types.
var goTypes = regexp.MustCompile(`Go (struct|value)|struct \{|openai\.|\[\]|json: |unmarshal`)

// requireRefusal checks a 400 that names no Go type, and that no model
// call was made since n.
func (e *env) requireRefusal(t *testing.T, r reply, status int, n int) {
	t.Helper()
	requireErrorBody(t, r, status, "")
	var eb struct{ Error struct{ Message string } }
	require.NoError(t, json.Unmarshal(r.body, &eb))
	assert.NotRegexp(t, goTypes, eb.Error.Message, "an error body must not speak of Go types")
	assert.Equal(t, n, e.model.CallCount(), "a refused request must not reach the model")
}

func TestContentTypeMustBeJSON(t *testing.T) {
	e := newEnv(t, sut.Config{})
	body := chatBody(t, false, user("tc-u9 from a web page"))
	for _, ct := range []string{"text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
		"multipart/form-data; boundary=x", "application/jsonp", "json", ";;"} {
		t.Run(ct, func(t *testing.T) {
			n := e.model.CallCount()
			r := e.post(t, body, map[string]string{"Content-Type": ct, sut.DefaultConversationHeader: "c1"})
			e.requireRefusal(t, r, http.StatusUnsupportedMediaType, n)
		})
	}
	t.Run("empty", func(t *testing.T) {
		n := e.model.CallCount()
		r := e.post(t, body, map[string]string{"Content-Type": "", sut.DefaultConversationHeader: "c1"})
		e.requireRefusal(t, r, http.StatusUnsupportedMediaType, n)
	})
	// JSON with parameters, in any case, is fine.
	for i, ct := range []string{"application/json; charset=utf-8", "Application/JSON"} {
		tok := fmt.Sprintf("tc-u%d", i+1)
		hdr := map[string]string{"Content-Type": ct, sut.DefaultConversationHeader: "c1"}
		r := e.post(t, chatBody(t, false, user(tok)), hdr)
		assert.Equal(t, http.StatusOK, r.status, "Content-Type %q: %s", ct, r.body)
	}
	// So is no Content-Type at all: a browser's POST always has an
	// Origin, which is checked, and some OpenAI clients send none.
	req, err := http.NewRequest(http.MethodPost, e.srv.URL()+"/v1/chat/completions", strings.NewReader(chatBody(t, false, user("tc-u3"))))
	require.NoError(t, err)
	req.Header.Set(sut.DefaultConversationHeader, "c1")
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "no Content-Type")
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u3", "a3", "u4"), e.ok(t, "", "c1", "tc-u4"), "no refused message landed")
}

// postRaw sends a chat request with exactly the given header lines.
func postRaw(t *testing.T, baseURL, body string, headerLines ...string) reply {
	t.Helper()
	c, err := net.Dial("tcp", addrOf(baseURL))
	require.NoError(t, err)
	defer c.Close()
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	for _, h := range headerLines {
		req += h + "\r\n"
	}
	req += fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body)
	_, err = io.WriteString(c, req)
	require.NoError(t, err)
	r, ok := readAnswer(t, c, requestDeadline)
	require.True(t, ok, "no answer")
	return r
}

func TestConversationHeaderIsStrict(t *testing.T) {
	e := newEnv(t, sut.Config{})
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	body := chatBody(t, false, user("tc-u9"))
	for name, lines := range map[string][]string{
		"two headers":         {"X-Conversation-Id: c1", "X-Conversation-Id: c2"},
		"two, same id":        {"X-Conversation-Id: c1", "x-conversation-id: c1"},
		"empty":               {"X-Conversation-Id: "},
		"blank":               {"X-Conversation-Id: \t "},
		"invalid UTF-8":       {"X-Conversation-Id: c\xff1"},
		"C1 control (U+0085)": {"X-Conversation-Id: c\u00851"},
		"too long":            {"X-Conversation-Id: " + strings.Repeat("c", sut.MaxConversationIDBytes+1)},
	} {
		t.Run(name, func(t *testing.T) {
			n := e.model.CallCount()
			e.requireRefusal(t, postRaw(t, e.srv.URL(), body, lines...), http.StatusBadRequest, n)
		})
	}
	assert.Equal(t, toks("u1", "a1", "u2"), e.ok(t, "", "c1", "tc-u2"))
	assert.Equal(t, toks("u3"), e.ok(t, "", "c\u00e9-\u4e2d", "tc-u3"), "ids in UTF-8 are fine")
}

func TestJSONIsStrict(t *testing.T) {
	e := newEnv(t, sut.Config{})
	require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
	u := `{"role":"user","content":"tc-u9"}`
	for name, body := range map[string]string{
		"MESSAGES":                   `{"model":"m","MESSAGES":[` + u + `]}`,
		"Messages beside messages":   `{"model":"m","messages":[` + u + `],"Messages":[]}`,
		"MODEL beside model":         `{"model":"m","MODEL":"other","messages":[` + u + `]}`,
		"Stream":                     `{"model":"m","messages":[` + u + `],"Stream":true}`,
		"long-s key (folds to s)":    `{"model":"m","messages":[{"role":"user","content":"tc-u9"}],"ſtream":true}`,
		"Role":                       `{"model":"m","messages":[{"Role":"user","content":"tc-u9"}]}`,
		"CONTENT":                    `{"model":"m","messages":[{"role":"user","CONTENT":"tc-u9"}]}`,
		"part TYPE":                  `{"model":"m","messages":[{"role":"user","content":[{"TYPE":"text","text":"tc-u9"}]}]}`,
		"part Text":                  `{"model":"m","messages":[{"role":"user","content":[{"type":"text","Text":"tc-u9"}]}]}`,
		"duplicate messages":         `{"model":"m","messages":[{"role":"user","content":"tc-u1"}],"messages":[` + u + `]}`,
		"duplicate, escaped":         `{"model":"m","messages":[` + u + `],"messag\u0065s":[` + u + `]}`,
		"duplicate content":          `{"model":"m","messages":[{"role":"user","content":"tc-u1","content":"tc-u9"}]}`,
		"duplicate in unknown field": `{"model":"m","messages":[` + u + `],"tools":[{"a":1,"a":2}]}`,
		"duplicate model":            `{"model":"a","model":"b","messages":[` + u + `]}`,
		"invalid UTF-8":              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"tc-u9 \xff\"}]}",
		"deep nesting":               `{"model":"m","messages":[` + u + `],"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`,
		"huge number":                `{"model":1e999,"messages":[` + u + `]}`,
		"stream a number":            `{"model":"m","messages":[` + u + `],"stream":1}`,
		"messages of numbers":        `{"model":"m","messages":[1,2]}`,
		"part a string":              `{"model":"m","messages":[{"role":"user","content":["tc-u9"]}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			n := e.model.CallCount()
			for _, conv := range []string{"c1", ""} {
				e.requireRefusal(t, e.post(t, body, headers("", conv)), http.StatusBadRequest, n)
			}
		})
	}
	// Unknown keys are still ignored, as OpenAI-compatible servers do.
	r := e.post(t, `{"model":"m","temperature":0.2,"messages":[{"role":"user","content":"tc-u2","name":"bob"}],"stream_options":null}`, headers("", "c1"))
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.Equal(t, toks("u1", "a1", "u2", "a2", "u3"), e.ok(t, "", "c1", "tc-u3"))
}

// TestErrorBodiesNameNoGoTypes: the bad bodies of
// TestBadInputIsRefusedBeforeAnyModelCall, and a few more, are refused in
// terms of the JSON.
func TestErrorBodiesNameNoGoTypes(t *testing.T) {
	e := newEnv(t, sut.Config{})
	for _, body := range []string{
		`[]`, `"x"`, `null`, `5`, `{"messages":"x"}`, `{"messages":{}}`, `{"messages":["x"]}`,
		`{"messages":[{"role":1}]}`, `{"messages":[{"role":"user","content":5}]}`, `{"messages":[{"role":"user","content":{}}]}`,
		`{"model":5,"messages":[]}`, `{"stream":"yes","messages":[]}`, `{"messages":[{"role":"user","content":[5]}]}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, `{"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`,
		`{"messages":[null]}`, `{`, `{"a"`, `{"a":}`, `}`, ``, `{} {}`,
	} {
		n := e.model.CallCount()
		e.requireRefusal(t, e.post(t, body, headers("", "c1")), http.StatusBadRequest, n)
	}
}

func TestFieldBounds(t *testing.T) {
	e := newEnv(t, sut.Config{MaxBodyBytes: 4 << 20})
	post := func(modelName string, msgs ...msg) reply {
		b, err := json.Marshal(map[string]any{"model": modelName, "messages": msgs, "stream": true})
		require.NoError(t, err)
		return e.post(t, string(b), headers("", "c1"))
	}
	n := e.model.CallCount()
	e.requireRefusal(t, post(strings.Repeat("m", sut.MaxModelBytes+1), user("tc-u9")), http.StatusBadRequest, n)
	e.requireRefusal(t, post("m", user("tc-u9 "+strings.Repeat("x", sut.MaxContentBytes))), http.StatusBadRequest, n)
	many := make([]msg, sut.MaxMessages+1)
	for i := range many {
		many[i] = user("tc-u9")
	}
	e.requireRefusal(t, post("m", many...), http.StatusBadRequest, n)

	// The 1 MB model name that once came back in every chunk of a 36 MB
	// stream is refused in a few hundred bytes.
	r := e.post(t, `{"model":"`+strings.Repeat("<", 1<<20)+`","stream":true,"messages":[{"role":"user","content":"tc-u9"}]}`, headers("", "c1"))
	e.requireRefusal(t, r, http.StatusBadRequest, n)
	assert.Less(t, len(r.body), 1024)

	// At the bounds, all is well; a stream chunk echoes the bounded model.
	r = post(strings.Repeat("m", sut.MaxModelBytes), user("tc-u1 "+strings.Repeat("x", sut.MaxContentBytes-6)))
	s := parseStream(t, r)
	require.True(t, s.done && s.stopped(), "%s", r.body)
	assert.Less(t, len(r.body), 16<<10)
}

func TestHistoryLimits(t *testing.T) {
	t.Run("messages", func(t *testing.T) {
		e := newEnv(t, sut.Config{MaxHistoryMessages: 5})
		require.Equal(t, toks("u1"), e.ok(t, "", "c1", "tc-u1"))
		require.Equal(t, toks("u1", "a1", "u2"), e.ok(t, "", "c1", "tc-u2"))
		// A third turn and its reply would make 6 messages.
		n := e.model.CallCount()
		r := e.turn(t, "", "c1", "tc-u3", false)
		e.requireRefusal(t, r, http.StatusBadRequest, n)
		assert.Contains(t, string(r.body), "limit of 5")
		assert.Contains(t, string(r.body), "start a new conversation")
		// Stateless, the array counts.
		e.requireRefusal(t, e.post(t, chatBody(t, false, user("tc-u1"), assistant("tc-a1"), user("tc-u2"), assistant("tc-a2"), user("tc-u3")), nil),
			http.StatusBadRequest, n)
		// The conversation is as it was, and others go on.
		assert.Equal(t, toks("u4"), e.ok(t, "", "c2", "tc-u4"))
	})
	t.Run("bytes", func(t *testing.T) {
		e := newEnv(t, sut.Config{MaxHistoryBytes: 200})
		long := func(tok string) string { return tok + " " + strings.Repeat("x", 80) }
		r := e.post(t, chatBody(t, false, user(long("tc-u1"))), headers("", "c1"))
		require.Equal(t, http.StatusOK, r.status, "%s", r.body)
		n := e.model.CallCount()
		r = e.post(t, chatBody(t, false, user(long("tc-u2"))), headers("", "c1"))
		e.requireRefusal(t, r, http.StatusBadRequest, n)
		assert.Contains(t, string(r.body), "limit of 200")
		// A shorter turn still fits, with exactly the committed history.
		assert.Equal(t, toks("u1", "a1", "u3"), e.ok(t, "", "c1", "tc-u3"))
	})
}

// TestStreamChunksCarryTheBoundedModel: every chunk echoes the request's
// model, which is bounded.
func TestStreamChunksCarryTheBoundedModel(t *testing.T) {
	e := newEnv(t, sut.Config{})
	r := e.post(t, `{"model":"named-model","stream":true,"messages":[{"role":"user","content":"tc-u1"}]}`, nil)
	require.Equal(t, http.StatusOK, r.status)
	for line := range strings.SplitSeq(string(r.body), "\n") {
		if data, ok := strings.CutPrefix(line, "data: {"); ok {
			assert.Contains(t, data, `"model":"named-model"`)
		}
	}
}

// TestDuplicateKeysRefusedByEveryAPI: a JSON body with a key twice in
// any object is refused with 400 by every API the server reads JSON
// through (chat, Responses, a session's creation, a session's turn),
// before any model call, saying so: encoding/json would keep the last
// one, where a proxy or a log in front of the server may read the first.
// What a well-formed body of each does is shown beside it.
func TestDuplicateKeysRefusedByEveryAPI(t *testing.T) {
	e := newEnv(t, sut.Config{})
	session := e.newSession(t, "")
	sessionURL := e.srv.URL() + "/api/sessions/" + session + "/agent/m"
	for _, api := range []struct {
		name, url, ok string
		dups          map[string]string
		status        int // of ok
	}{
		{"chat", e.srv.URL() + "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"tc-u1"}]}`, map[string]string{
			"top":    `{"model":"m","messages":[{"role":"user","content":"tc-u9"}],"model":"n"}`,
			"nested": `{"model":"m","messages":[{"role":"user","content":"tc-u9","content":"tc-u8"}]}`,
		}, http.StatusOK},
		{"responses", e.srv.URL() + "/v1/responses", `{"model":"m","input":"tc-u2"}`, map[string]string{
			"top":     `{"model":"m","input":"tc-u9","input":"tc-u8"}`,
			"escaped": `{"model":"m","input":"tc-u9","st\u006fre":false,"store":true}`,
			"nested":  `{"model":"m","input":[{"role":"user","content":"tc-u9","role":"system"}]}`,
			"unread":  `{"model":"m","input":"tc-u9","metadata":{"a":1,"a":2}}`,
		}, http.StatusOK},
		{"session creation", e.srv.URL() + "/api/sessions", `{"title":"t"}`, map[string]string{
			"top": `{"title":"a","title":"b"}`,
		}, http.StatusCreated},
		{"session turn", sessionURL, `[{"role":"user","content":"tc-u3"}]`, map[string]string{
			"nested": `[{"role":"user","content":"tc-u9","content":"tc-u8"}]`,
		}, http.StatusOK},
	} {
		t.Run(api.name, func(t *testing.T) {
			for name, body := range api.dups {
				n := e.model.CallCount()
				r := postURL(t, e.client, api.url, body, headers("", "c-"+api.name))
				e.requireRefusal(t, r, http.StatusBadRequest, n)
				assert.Contains(t, string(r.body), "duplicate key", "%s: %s", name, r.body)
			}
			r := postURL(t, e.client, api.url, api.ok, headers("", "c-"+api.name))
			assert.Equal(t, api.status, r.status, "a well-formed body: %s", r.body)
		})
	}
}
