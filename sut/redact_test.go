package sut_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// What the model says stays in the server's log, redacted (redact.go).

// secretModelError is what a model gateway may say when it fails: a key
// and an internal host.
const secretModelError = `Incorrect API key provided: sk-live-4f8a9b2c7d1e6f3a. Authorization: Bearer eyJhbGciOi.payload.sig ` +
	`(upstream https://svc:hunter2@llm-gw.corp.internal:8443/v1?api_key=abc123def; see http://10.1.2.3/runbook) ` +
	`login failed for password s3cr3t-pass`

// secrets are the parts of secretModelError no one may see, in a
// response or in the log: credentials, internal hosts, what follows a
// password.
var secrets = []string{"sk-live-4f8a9b2c7d1e6f3a", "eyJhbGciOi", "hunter2", "svc:", "abc123def", "corp.internal", "10.1.2.3", "s3cr3t-pass"}

// TestModelErrorsDoNotReachClients: whatever the model says when it fails,
// before its stream or in it, the client gets the status class and a
// fixed message; the log has the details, with the credentials redacted.
func TestModelErrorsDoNotReachClients(t *testing.T) {
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "midstream") {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tc-a1\"}}]}\n\ndata: %s\n\n",
				mustJSON(t, map[string]any{"error": map[string]string{"message": secretModelError}}))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(mustJSON(t, map[string]any{"error": map[string]string{"message": secretModelError, "type": "invalid_api_key"}})))
	}))
	t.Cleanup(failing.Close)

	for _, path := range []string{"/v1", "/midstream/v1"} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%t", path, stream), func(t *testing.T) {
				var log syncbuf.Buffer
				e := newEnv(t, sut.Config{ModelURL: failing.URL + path, Logger: slog.New(slog.NewTextHandler(&log, nil))})
				r := e.turn(t, "", "c1", "tc-u1", stream)
				var msg string
				if stream && path == "/midstream/v1" {
					s := parseStream(t, r)
					require.Equal(t, 1, s.errors())
					for _, c := range s.chunks {
						if c.Error != nil {
							msg = c.Error.Message
						}
					}
				} else {
					requireErrorBody(t, r, http.StatusBadGateway, "upstream_error")
					var eb struct{ Error struct{ Message string } }
					require.NoError(t, json.Unmarshal(r.body, &eb))
					msg = eb.Error.Message
				}
				assert.Equal(t, "the model failed", msg)
				// A chunk's "created" time may hold any digits, "401" too.
				body := createdTime.ReplaceAllString(string(r.body), `"created":0`)
				for _, s := range append(secrets, "401") {
					assert.NotContains(t, body, s)
				}
				logged := log.String()
				assert.Contains(t, logged, "Incorrect API key provided", "the operator needs the details")
				for _, s := range secrets {
					assert.NotContains(t, logged, s, "a credential reached the log")
				}
			})
		}
	}
}

// TestModelURLCredentialsStayHidden: a model URL with credentials that
// cannot be reached fails turns with the fixed message, and neither the
// client nor the log sees the credentials.
func TestModelURLCredentialsStayHidden(t *testing.T) {
	var log syncbuf.Buffer
	e := newEnv(t, sut.Config{ModelURL: "http://svc:hunter2@127.0.0.1:1/v1", Logger: slog.New(slog.NewTextHandler(&log, nil))})
	r := e.turn(t, "", "c1", "tc-u1", false)
	requireErrorBody(t, r, http.StatusBadGateway, "upstream_error")
	assert.Contains(t, string(r.body), "the model failed")
	for _, out := range []string{string(r.body), log.String()} {
		assert.NotContains(t, out, "hunter2")
		assert.NotContains(t, out, "svc")
	}
	assert.Contains(t, log.String(), "connection refused")
}

// expireAtOnce is Deadlines under which every model call times out at
// once.
type expireAtOnce struct{}

func (expireAtOnce) WithTimeout(parent context.Context, _ time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, 0)
}

func TestModelTimeoutMessageIsFixed(t *testing.T) {
	e := newEnv(t, sut.Config{Deadlines: expireAtOnce{}})
	r := e.turn(t, "", "c1", "tc-u1", false)
	requireErrorBody(t, r, http.StatusGatewayTimeout, "upstream_timeout")
	assert.Contains(t, string(r.body), `"the model timed out"`)
}

func TestBadModelURLsAreRefusedWithoutTheirCredentials(t *testing.T) {
	for _, raw := range []string{
		"http://svc:hunter2@llm-gw:80x/v1",
		"htp://svc:hunter2@llm-gw/v1",
		"svc:hunter2@llm-gw/v1",
		"http:/svc:hunter2@llm-gw/v1",
		"http://svc:hunter2@/v1",
		"http://svc:hunter2@llm gw/v1",
		"http://svc:hunter2@llm-gw/v1#x",
		"ftp://svc:hunter2@llm-gw/v1",
		"http:llm-gw",
		"http://",
		"",
	} {
		t.Run(raw, func(t *testing.T) {
			s, err := sut.New(sut.Config{ModelURL: raw, DataDir: t.TempDir()})
			if s != nil {
				_ = s.Close()
			}
			require.Error(t, err)
			assert.NotContains(t, err.Error(), "hunter2")
			assert.NotContains(t, err.Error(), "svc")
			assert.NotContains(t, err.Error(), "\n")
		})
	}
}

func TestRedact(t *testing.T) {
	redact := func(s string) string { return sut.Redact([]string{"key-alpha", "k"}, "http://user:pass1234@h/v1", s) }
	for in, hidden := range map[string]string{
		"Incorrect API key provided: sk-proj-AbC123xyz_-99":   "AbC123xyz",
		"Authorization: Bearer abc.def.ghi":                   "abc.def.ghi",
		"authorization=Basic dXNlcjpwYXNz":                    "dXNlcjpwYXNz",
		`Post "http://user:pass1234@h/v1/chat/completions"`:   "pass1234",
		"token in a URL: https://tok3n@gw.example/v1":         "tok3n",
		`{"api_key": "s3cr3t-value"}`:                         "s3cr3t-value",
		"https://gw.example/v1?key=s3cr3t&x=1":                "s3cr3t",
		"x-api-key: s3cr3t":                                   "s3cr3t",
		"the client sent key-alpha":                           "key-alpha",
		"password=hunter2 secret: swordfish access_token=zzz": "hunter2",
		"upstream http://10.1.2.3:8080/internal/v1 refused":   "10.1.2.3",
		"login failed for password s3cr3t, try again":         "s3cr3t",
	} {
		out := redact(in)
		assert.NotContains(t, out, hidden, "%q -> %q", in, out)
		assert.Contains(t, out, "[redacted]", "%q", in)
	}
	// Short keys are not hunted for, and plain words survive.
	assert.Equal(t, "the model timed out at a known point", redact("the model timed out at a known point"))
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// createdTime matches a chunk's creation time, whose digits are the clock's.
var createdTime = regexp.MustCompile(`"created":\d+`)
