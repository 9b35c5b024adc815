package goroutines

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const key = "goroutines-test"

// labelled runs f in a goroutine of its own carrying key=value.
func labelled(value string, f func()) {
	pprof.Do(context.Background(), pprof.Labels(key, value), func(context.Context) { go f() })
}

// until polls for cond, within the test's bound: a goroutine parks when
// the scheduler gets to it.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "%s: never came about", what)
	}
}

func parked(value string) bool { return States(Snapshot(), key, []string{value})[0] == Parked }

// TestParkedWaitsForAnotherGoroutine: goroutines on a lock, a channel, a
// select, a condition or a WaitGroup are parked; one asleep on a timer is
// asleep; one spinning and one waiting for the answer to a call it made to
// a server are working.
func TestParkedWaitsForAnotherGoroutine(t *testing.T) {
	var mu sync.Mutex
	mu.Lock()
	ch := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	cond := sync.NewCond(&sync.Mutex{})
	var woken atomic.Bool
	var ended sync.WaitGroup
	run := func(value string, f func()) {
		ended.Add(1)
		labelled(value, func() { defer ended.Done(); f() })
	}
	run("mutex", func() { mu.Lock(); mu.Unlock() }) //nolint:staticcheck // taken to wait on it
	run("chan", func() { <-ch })
	run("select", func() {
		select {
		case <-ch:
		case <-time.After(time.Hour):
		}
	})
	run("waitgroup", wg.Wait)
	run("cond", func() {
		cond.L.Lock()
		for !woken.Load() {
			cond.Wait()
		}
		cond.L.Unlock()
	})
	for _, v := range []string{"mutex", "chan", "select", "waitgroup", "cond"} {
		until(t, v, func() bool { return parked(v) })
	}

	stop := make(chan struct{})
	var spins, sleeps atomic.Int64
	run("sleep", func() {
		for {
			select {
			case <-stop:
				return
			default:
				sleeps.Add(1)
				time.Sleep(time.Millisecond)
			}
		}
	})
	run("spin", func() {
		for {
			select {
			case <-stop:
				return
			default:
				spins.Add(1)
			}
		}
	})
	// The model: holds every call until released.
	release, arrived := make(chan struct{}), make(chan struct{})
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
	}))
	tr := &http.Transport{}
	run("round trip", func() {
		if resp, err := (&http.Client{Transport: tr}).Get(model.URL); err == nil {
			_ = resp.Body.Close()
		}
	})
	<-arrived
	until(t, "sleeps and spins", func() bool { return sleeps.Load() > 3 && spins.Load() > 3 })
	// Looked at many times: a goroutine that works is never seen at rest,
	// one that sleeps never parked.
	for range 50 {
		st := States(Snapshot(), key, []string{"sleep", "spin", "round trip"})
		assert.Contains(t, []State{Working, Asleep}, st[0], "sleep")
		assert.Equal(t, []State{Working, Working}, st[1:], "spin, round trip")
	}
	until(t, "asleep", func() bool { return States(Snapshot(), key, []string{"sleep"})[0] == Asleep })

	mu.Unlock()
	close(ch)
	wg.Done()
	woken.Store(true)
	cond.Broadcast()
	close(stop)
	close(release)
	ended.Wait()
	model.Close()
	tr.CloseIdleConnections()
}

// TestParkedFollowsTheLabel: goroutines started by a labelled one carry
// its label, even once their own starter is gone, and all of them must
// be parked; a value no goroutine carries is not parked.
func TestParkedFollowsTheLabel(t *testing.T) {
	work, gate, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var running atomic.Bool
	var ended sync.WaitGroup
	ended.Add(2)
	labelled("root", func() {
		defer ended.Done()
		go func() { // the child starts the grandchild and ends
			go func() {
				defer ended.Done()
				running.Store(true)
				for {
					select {
					case <-work:
						<-gate
						return
					default:
					}
				}
			}()
		}()
		<-done
	})
	until(t, "the grandchild runs", running.Load)
	assert.False(t, parked("root"), "its grandchild runs")
	close(work)
	until(t, "all parked", func() bool { return parked("root") })
	close(gate)
	close(done)
	ended.Wait()
	until(t, "all gone", func() bool {
		for _, g := range Snapshot() {
			if g.Labels[key] == "root" {
				return false
			}
		}
		return true
	})
	assert.False(t, parked("root"), "gone")
	assert.False(t, parked("never"))
}

// TestParseReadsTheProfile: groups, labels with quotes in them, and frames,
// as the goroutine profile writes them.
func TestParseReadsTheProfile(t *testing.T) {
	gs := parse("goroutine profile: total 3\n" +
		"2 @ 0x0 0x44f8c5\n" +
		"# labels: {\"k\":\"v \\\"1\\\"\", \"other\":\"x\"}\n" +
		"#\t0x4bdd65\tsync.runtime_SemacquireMutex+0x25\t/go/src/runtime/sema.go:95\n" +
		"#\t0x4bdd66\tnet/http.(*conn).serve+0x5\t/go/src/net/http/server.go:2000\n" +
		"\n" +
		"1 @ 0x0\n" +
		"#\t0x4dc460\tmain.main+0x0\t/tmp/st.go:8\n")
	require.Len(t, gs, 2)
	assert.Equal(t, G{Count: 2, Labels: map[string]string{"k": `v "1"`, "other": "x"},
		Funcs: []string{"sync.runtime_SemacquireMutex", "net/http.(*conn).serve"}}, gs[0])
	assert.Equal(t, G{Count: 1, Funcs: []string{"main.main"}}, gs[1])
}
