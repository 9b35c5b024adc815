package sut_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turncheck/turncheck/sut"
)

// FuzzChatRequest feeds arbitrary bodies, with or without a conversation id,
// under arbitrary Content-Types, to the server's handler in-process.
// Whatever the request, the server must not panic, must answer one of the
// contract's statuses, must answer every failure with an OpenAI error body
// that names no Go type, and must not call the model for a request it
// refuses. The body limit is large enough to reach the field bounds (a
// model name, a thousand messages) and the history limits are small, so
// that the fuzzer meets them.
//
// Run with: go test ./sut/ -run XXX -fuzz FuzzChatRequest -fuzztime 20s
func FuzzChatRequest(f *testing.F) {
	const maxBody = 8192
	m := startModel(f)
	s, err := sut.New(sut.Config{
		ModelURL:           m.URL(),
		DataDir:            f.TempDir(),
		MaxBodyBytes:       maxBody,
		MaxHistoryMessages: 8,
		MaxHistoryBytes:    1024,
		// Bounds an iteration that reaches the model; the fake model
		// answers in well under a millisecond.
		RequestTimeout: 2 * time.Second,
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		if err := s.Close(); err != nil {
			f.Error(err)
		}
	})

	many := `{"messages":[` + strings.Repeat(`{},`, sut.MaxMessages) + `{"role":"user","content":"x"}]}`
	for _, seed := range []struct {
		body string
		conv string
	}{
		{`{"model":"m","messages":[{"role":"user","content":"tc-u1 hi"}]}`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":"tc-u2 hi"}]}`, ""},
		{`{"model":"m","messages":[{"role":"user","content":"tc-u3 hi"}],"stream":true}`, "c1"},
		{`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"tc-u4"},{"role":"assistant","content":"tc-a4"},{"role":"user","content":"tc-u5"}]}`, ""},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"tc-u6"}]}]}`, "c2"},
		{`{"model":"m","messages":[{"role":"user","content":null}]}`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":"tc-u1"},{"role":"assistant","content":"tc-a1"}]}`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":"tc-u1"},{"role":"user","content":" \t\n"}]}`, "c1"},
		{`{"model":"m","messages":[]}`, "c1"},
		{`{"model":"m","messages":[{"role":"tool","content":"1"}]}`, ""},
		{`{"model":"m","messages":[{"role":"wizard","content":"x"}]}`, "c1"},
		{`{"model":"m","messages":"tc-u1"}`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":5}]}`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}`, "c1"},
		{`{"model":"m"}`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]} trailing`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}}`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]`, "c1"},
		{`{"messages":[{"role":"user","content":"x","content":"y"}],"messages":[{"role":"user","content":"z"}]}`, ""},
		{"\ufeff" + `{"messages":[{"role":"user","content":"x"}]}`, ""},
		{`{"messages":[{"role":"user","content":"\u0000\ud800 x"}]}`, "c3"},
		{"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe x\"}]}", "c3"},
		{`{"messages":[{"role":"user","content":"x"}],"stream":true,"model":1e999}`, ""},
		{strings.Repeat("[", 10000), ""},
		{`{"messages":[{"role":"user","content":"` + strings.Repeat("x", maxBody) + `"}]}`, "c1"},
		{``, ""},
		{`null`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, strings.Repeat("c", 300)},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, "c\x01"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, "c\n1"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, "c\xff1"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, " "},
		{`{"model":"m","MESSAGES":[{"role":"user","content":"x"}]}`, ""},
		{`{"model":"m","messages":[{"Role":"user","content":"x"}]}`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"text","Text":"x"}]}]}`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"messag\u0065s":[]}`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"x":{"a":1,"a":2}}`, ""},
		{`{"model":"` + strings.Repeat("<", sut.MaxModelBytes+1) + `","messages":[{"role":"user","content":"x"}],"stream":true}`, "c1"},
		{`{"model":"` + strings.Repeat("m", sut.MaxModelBytes) + `","messages":[{"role":"user","content":"x"}],"stream":true}`, "c1"},
		{many, ""},
		{`{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"},{"role":"assistant","content":"d"},` +
			`{"role":"user","content":"e"},{"role":"assistant","content":"f"},{"role":"user","content":"g"},{"role":"assistant","content":"h"},{"role":"user","content":"i"}]}`, ""},
		{`{"messages":[{"role":"user","content":"` + strings.Repeat("y", 1100) + `"}]}`, "c1"},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}` + strings.Repeat(" ", 10), "c1"},
	} {
		for _, ct := range []string{"application/json", "application/json; charset=utf-8", "", "text/plain"} {
			f.Add([]byte(seed.body), seed.conv, ct)
		}
	}

	var seq atomic.Int64
	f.Fuzz(func(t *testing.T, body []byte, conv, contentType string) {
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/v1/chat/completions", bytes.NewReader(body))
		if contentType != "" {
			req.Header["Content-Type"] = []string{contentType}
		}
		if conv != "" {
			// A fresh conversation per iteration, so that histories do not
			// grow over a long run; the id keeps the fuzzed bytes, so that
			// bad ids (too long, control characters) are still refused.
			req.Header[sut.DefaultConversationHeader] = []string{conv + "#" + strconv.FormatInt(seq.Add(1), 10)}
		}
		calls := m.CallCount()
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req) // a panic fails the fuzz target

		res := rec.Result()
		defer res.Body.Close()
		got := rec.Body.Bytes()
		switch res.StatusCode {
		case http.StatusOK:
			checkOK(t, res.Header.Get("Content-Type"), got)
			// The fake model's replies are short: a long answer is the
			// server copying the request into it (the model name into
			// every chunk once made 1 MB into 36).
			if len(got) > 16<<10 {
				t.Errorf("a %d-byte request got a %d-byte answer", len(body), len(got))
			}
			return
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
			if n := m.CallCount(); n != calls {
				t.Errorf("status %d, but the model got %d call(s)", res.StatusCode, n-calls)
			}
		case http.StatusBadGateway, http.StatusGatewayTimeout:
		default:
			t.Fatalf("status %d not in the contract; body %q", res.StatusCode, got)
		}
		var eb struct {
			Error *struct {
				Message *string `json:"message"`
				Type    *string `json:"type"`
			} `json:"error"`
		}
		if err := json.Unmarshal(got, &eb); err != nil || eb.Error == nil || eb.Error.Message == nil || eb.Error.Type == nil {
			t.Fatalf("status %d without an OpenAI error body: %q (%v)", res.StatusCode, got, err)
		}
		if goTypes.MatchString(*eb.Error.Message) {
			t.Errorf("status %d names Go types: %q", res.StatusCode, *eb.Error.Message)
		}
		if ct := res.Header.Get("Content-Type"); !strings.Contains(ct, "application/json") {
			t.Errorf("status %d with content type %q", res.StatusCode, ct)
		}
	})
}

// checkOK checks a 200: a chat.completion object, or an event stream that
// ends with [DONE].
func checkOK(t *testing.T, contentType string, body []byte) {
	t.Helper()
	switch {
	case strings.Contains(contentType, "text/event-stream"):
		if !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) {
			t.Fatalf("stream does not end with [DONE]: %q", body)
		}
	case strings.Contains(contentType, "application/json"):
		var c struct {
			Object  string            `json:"object"`
			Choices []json.RawMessage `json:"choices"`
		}
		if err := json.Unmarshal(body, &c); err != nil || c.Object != "chat.completion" || len(c.Choices) != 1 {
			t.Fatalf("200 without a chat.completion: %q (%v)", body, err)
		}
	default:
		t.Fatalf("200 with content type %q: %q", contentType, body)
	}
}
