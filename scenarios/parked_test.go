package scenarios_test

import (
	"context"
	"net/http"
	"runtime/pprof"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/examples/memserver"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/sut"
)

// handlerOf is the reference server as a Go user's test starts it: an
// http.Handler, its bursts known at rest by their goroutines.
func handlerOf(m sut.Mutant) scenarios.Target {
	return scenarios.Handler(scenarios.Profile{Model: "turncheck", ModelTimeout: time.Second},
		func(modelURL, dataDir string) (http.Handler, error) {
			return sut.New(sut.Config{ModelURL: modelURL, DataDir: dataDir, Mutant: m})
		})
}

// TestHandlerBurstsRestByTheirGoroutines: a handler's bursts come to rest
// with no quiet period, each request answered, held by the model, or
// parked (queued behind its conversation's running turn), and a handler
// that runs two turns of one conversation on one base is caught so.
func TestHandlerBurstsRestByTheirGoroutines(t *testing.T) {
	t.Parallel() // it mostly waits on the model
	res, err := scenarios.Check(handlerOf(""), scenarios.Options{Checks: 1, Seed: 1})
	require.NoError(t, err)
	require.Nil(t, res.Failure, "clean handler failed")
	require.Positive(t, res.Invariants[model.T4], "no burst was judged")
	assert.NotContains(t, res.TimeMS, "quiet periods (the server reports no activity)")

	res, err = scenarios.Check(handlerOf(sut.NoConversationLock), scenarios.Options{Checks: 50, Seed: 1, ShrinkTime: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NotNil(t, res.Failure)
	require.NotNil(t, res.Failure.Violation, res.Failure.Report)
	assert.Equal(t, model.T4, res.Failure.Violation.Invariant, res.Failure.Report)
	assert.NotContains(t, res.TimeMS, "quiet periods (the server reports no activity)")
}

// pollingLock serializes each conversation's turns with a lock it polls,
// asleep between tries: a request waiting for it is asleep, not parked,
// and nothing announces when it will try again.
type pollingLock struct {
	next  http.Handler
	mu    sync.Mutex
	convs map[string]*sync.Mutex
}

func (p *pollingLock) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	l := p.convs[r.Header.Get("X-Conversation-Id")]
	if l == nil {
		l = &sync.Mutex{}
		p.convs[r.Header.Get("X-Conversation-Id")] = l
	}
	p.mu.Unlock()
	for !l.TryLock() {
		time.Sleep(time.Millisecond)
	}
	defer l.Unlock()
	p.next.ServeHTTP(w, r)
}

// TestHandlerAsleepRestsAfterAQuietPeriod: a request that waits asleep on
// a timer comes to rest once a quiet period passes with nothing changed,
// as on a server that reports nothing: the check goes on, and passes.
func TestHandlerAsleepRestsAfterAQuietPeriod(t *testing.T) {
	t.Parallel() // it mostly waits on the model
	target := scenarios.Handler(scenarios.Profile{Model: "turncheck", ModelTimeout: time.Second},
		func(modelURL, dataDir string) (http.Handler, error) {
			return &pollingLock{next: memserver.New(modelURL), convs: map[string]*sync.Mutex{}}, nil
		})
	res, err := scenarios.Check(target, scenarios.Options{Checks: 1, Seed: 1, Steps: 10})
	require.NoError(t, err)
	require.Nil(t, res.Failure, "a correct handler failed")
	assert.Positive(t, res.TimeMS["quiet periods (the server reports no activity)"], "no request was seen asleep")
}

// labelling is a handler that labels its requests' goroutines for its own
// profiles, as a server with profiling middleware does: from the
// request's context (pprof.Do), or anew from none (wipe).
type labelling struct {
	next http.Handler
	wipe bool
}

func (l labelling) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if l.wipe {
		pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("route", r.URL.Path)))
		l.next.ServeHTTP(w, r)
		return
	}
	pprof.Do(r.Context(), pprof.Labels("route", r.URL.Path), func(ctx context.Context) { l.next.ServeHTTP(w, r.WithContext(ctx)) })
}

// TestHandlerThatLabelsItsGoroutines: a handler that labels its goroutines
// from the request's context keeps the harness's label, and its bursts
// come to rest with no quiet period; one that labels them anew hides
// them, and gets quiet periods, the check going on all the same.
func TestHandlerThatLabelsItsGoroutines(t *testing.T) {
	t.Parallel() // it mostly waits on the model
	for _, wipe := range []bool{false, true} {
		target := scenarios.Handler(scenarios.Profile{Model: "turncheck", ModelTimeout: time.Second},
			func(modelURL, dataDir string) (http.Handler, error) {
				return labelling{next: memserver.New(modelURL), wipe: wipe}, nil
			})
		// Seed 1's one check of 10 steps judges bursts.
		res, err := scenarios.Check(target, scenarios.Options{Checks: 1, Seed: 1, Steps: 10})
		require.NoError(t, err)
		require.Nil(t, res.Failure, "a correct handler failed")
		require.Positive(t, res.Invariants[model.T4], "no burst was judged")
		quiet := res.TimeMS["quiet periods (the server reports no activity)"]
		if wipe {
			assert.Positive(t, quiet, "a handler whose goroutines cannot be seen")
		} else {
			assert.Zero(t, quiet, "a handler that keeps the label")
		}
	}
}
