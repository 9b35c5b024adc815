//go:build unix

package misbehaving_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/loopback"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/sut"
)

// These tests hold a run's verdicts to what the server did: a line says
// PASS only for what was exercised, a run that could judge little says
// why, and a server that stops answering never passes.

// referenceHandler is the reference server as a Handler target's
// factory, calling the model at modelURL (or the one given).
func referenceHandler(modelURL, dataDir string) (http.Handler, error) {
	return sut.New(sut.Config{ModelURL: modelURL, DataDir: dataDir})
}

// noPassWithout asserts that no verdict passes unexercised, and that
// none of invs passes at all.
func noPassWithout(t *testing.T, c *scenarios.Conformance, invs ...model.Invariant) {
	t.Helper()
	require.NotNil(t, c)
	assert.False(t, c.Passed())
	for _, v := range c.Verdicts {
		if v.Status == scenarios.Pass {
			assert.Positive(t, v.Evaluations, "%s passed, evaluated never", v.Invariant)
		}
	}
	for _, inv := range invs {
		assert.NotEqual(t, scenarios.Pass, c.Verdict(inv).Status, "%s: %+v", inv, c.Verdict(inv))
	}
}

// TestNothingPassesVacuously: servers that never commit a turn the way
// the contract says get no PASS for what they never did, and the run's
// summary says why it is weak.
func TestNothingPassesVacuously(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	t.Run("answers 400 to everything", func(t *testing.T) {
		r := conformWithin(t, hostileHandler(chatOnly(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":{"message":"no","type":"invalid_request_error"}}`))
		})), 10*time.Second, scenarios.Options{Checks: 4, Steps: 10})
		require.NoError(t, r.err)
		noPassWithout(t, r.c, model.Invariants()...)
		assert.Equal(t, scenarios.NotExercised, r.c.Verdict(model.T3).Status, "nothing committed, so nothing to replay")
		assert.Contains(t, strings.Join(r.c.Stats.Warnings(), "\n"), "no turn of")
		assert.Contains(t, strings.Join(r.c.Stats.FirstAnswers, "\n"), "status 400: no")
	})
	t.Run("answers 500 to everything", func(t *testing.T) {
		// The run serves nothing: no verdict fails on the one status
		// every request got, T3's "want 400" included.
		r := conformWithin(t, hostileHandler(chatOnly(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"error":{"message":"down","type":"server_error"}}`))
		})), 10*time.Second, scenarios.Options{Checks: 4, Steps: 10})
		require.NoError(t, r.err)
		noPassWithout(t, r.c, model.Invariants()...)
		for _, v := range r.c.Verdicts {
			assert.NotEqual(t, scenarios.Fail, v.Status, "%s: %+v", v.Invariant, v)
		}
		assert.Contains(t, strings.Join(r.c.Stats.Warnings(), "\n"), "no turn of")
	})
	t.Run("answers by itself, never calling the model", func(t *testing.T) {
		r := conformWithin(t, hostileHandler(chatOnly(func(w http.ResponseWriter, req *http.Request) {
			_, _ = io.Copy(io.Discard, req.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`))
		})), 10*time.Second, scenarios.Options{Checks: 4, Steps: 10})
		require.NoError(t, r.err)
		noPassWithout(t, r.c, model.T4, model.T3, model.T5)
	})
	t.Run("wrong model URL", func(t *testing.T) {
		dead := closedPort(t)
		r := conformWithin(t, scenarios.Handler(scenarios.Profile{Model: "turncheck", ModelTimeout: time.Second},
			func(_, dataDir string) (http.Handler, error) { return referenceHandler("http://"+dead+"/v1", dataDir) }),
			20*time.Second, scenarios.Options{Checks: 3, Steps: 8})
		require.NoError(t, r.err)
		noPassWithout(t, r.c, model.Invariants()...)
		w := strings.Join(r.c.Stats.Warnings(), "\n")
		assert.Contains(t, w, "calls the model URL it was given")
		assert.Contains(t, w, "status 502", "the first answers are quoted")
	})
	t.Run("streams end without finish_reason stop", func(t *testing.T) {
		r := conformWithin(t, scenarios.Handler(scenarios.Profile{Model: "turncheck"},
			func(modelURL, dataDir string) (http.Handler, error) {
				h, err := referenceHandler(modelURL, dataDir)
				return noStop{h}, err
			}), 30*time.Second, scenarios.Options{Checks: 3, Steps: 10})
		require.NoError(t, r.err)
		assert.Positive(t, r.c.Stats.Causes["no finish_reason stop before [DONE]"])
		assert.Contains(t, strings.Join(r.c.Stats.Warnings(), "\n"), `no chunk carries finish_reason "stop"`)
		assert.Contains(t, r.c.Text(scenarios.Profile{}), "WARNING:")
	})
	// A stream that never ends: TestHostileEndlessStream.
}

// noStop is a server whose streams say nothing of how they finished: it
// drops finish_reason from every chunk.
type noStop struct{ http.Handler }

func (n noStop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n.Handler.ServeHTTP(stopStripper{w}, r)
}

func (n noStop) Close() error { return n.Handler.(io.Closer).Close() }

type stopStripper struct{ http.ResponseWriter }

func (s stopStripper) Write(b []byte) (int, error) {
	_, err := s.ResponseWriter.Write(bytes.ReplaceAll(b, []byte(`"finish_reason":"stop"`), []byte(`"finish_reason":null`)))
	return len(b), err
}

func (s stopStripper) Flush() { s.ResponseWriter.(http.Flusher).Flush() }

// closedPort is a loopback address nothing listens on, below the range
// the kernel hands out for port 0 (loopback.FreeAddr): no other process's
// server takes it before a fake model binds it.
func closedPort(t *testing.T) string {
	addr, err := loopback.FreeAddr()
	require.NoError(t, err)
	return addr
}

// TestDeadRemoteServerNeverPasses: a running server (conform --url) that
// stops answering after some requests ends the run with an error that
// says so, never a pass.
func TestDeadRemoteServerNeverPasses(t *testing.T) {
	t.Parallel()
	modelAddr := closedPort(t)
	srv, err := sut.New(sut.Config{ModelURL: "http://" + modelAddr + "/v1", DataDir: t.TempDir()})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var served atomic.Int64
	hs := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if served.Add(1) == 40 {
			go func() { _ = ln.Close() }() // dies: later connections are refused
		}
		srv.ServeHTTP(w, r)
	})}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(ln) }()
	defer func() {
		_ = hs.Close()
		<-done
		require.NoError(t, srv.Close())
	}()
	r := conformWithin(t, scenarios.Remote{URL: "http://" + ln.Addr().String(), ModelAt: modelAddr,
		Reaches: scenarios.Profile{Model: "turncheck"}}, 60*time.Second, scenarios.Options{Checks: 100, Steps: 20, Seed: 1})
	require.Error(t, r.err, "a server that stopped answering passed")
	assert.Contains(t, r.err.Error(), "stopped answering")
	assert.Contains(t, r.err.Error(), "connection refused")
	// What the server answered last, in this check or, when it died
	// between two, in the one before.
	assert.Regexp(t, `its last answers before: (none in this check; in the check before, )?step \d+: `, r.err.Error())
}

// TestFlakyOnlyAfterTrying: a failure that does not come back is called
// flaky only after several replays of its steps, and says how many.
func TestFlakyOnlyAfterTrying(t *testing.T) {
	var once atomic.Bool
	target := scenarios.Handler(scenarios.Profile{Model: "turncheck", ModelTimeout: time.Second},
		func(modelURL, dataDir string) (http.Handler, error) {
			h, err := referenceHandler(modelURL, dataDir)
			if err != nil {
				return nil, err
			}
			return onceWrong{h, &once}, nil
		})
	res, err := scenarios.Check(target, scenarios.Options{Checks: 50, Seed: 3, ShrinkTime: 20 * time.Second})
	require.NoError(t, err)
	require.NotNil(t, res.Failure, "the one wrong answer went unnoticed")
	f := res.Failure
	require.NotNil(t, f.Violation)
	assert.Equal(t, model.T3, f.Violation.Invariant)
	assert.True(t, f.Flaky, f.Report)
	assert.GreaterOrEqual(t, f.ShrinkRuns, 3, "called flaky after fewer than three replays")
	// The count the report gives is the count of replays it lists.
	listed := strings.Count(f.Report, " differed: ")
	assert.GreaterOrEqual(t, listed, 3)
	assert.Contains(t, f.Report, fmt.Sprintf("did not reproduce in %d replay(s)", listed))
	assert.Contains(t, f.Report, "\nThis is the run that failed:", "on a line of its own")
	assert.Equal(t, scenarios.NotShrunk, f.Shrink)
	// What differed: the invalid continuation the server once answered
	// ok got its 400 in every replay.
	for i := 1; i <= listed; i++ {
		assert.Regexp(t, fmt.Sprintf(`Replay %d differed: at step \d+, request 1 \(conv-\d+, no new user message\): the failing run got ok 200, the replay fail 400`, i), f.Report)
	}
}

// onceWrong is a server that answers the first request without a usable
// user message with 200 instead of 400, once in its whole life across
// restarts: a failure no replay brings back.
type onceWrong struct {
	http.Handler
	done *atomic.Bool
}

func (o onceWrong) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/chat/completions" && r.Header.Get("X-Conversation-Id") != "" {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if lastRoleNotUser(body) {
			if o.done.CompareAndSwap(false, true) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`))
				return
			}
		}
	}
	o.Handler.ServeHTTP(w, r)
}

func (o onceWrong) Close() error { return o.Handler.(io.Closer).Close() }

// lastRoleNotUser reports whether a chat request's last message is not a
// user message with text.
func lastRoleNotUser(body []byte) bool {
	var req struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		return true
	}
	last := req.Messages[len(req.Messages)-1]
	return last.Role != "user" || strings.TrimSpace(last.Content) == ""
}
