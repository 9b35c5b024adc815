//go:build unix

package misbehaving_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/sut"
)

// These tests hold Conform, the engine of `turncheck conform`, to its
// promise against servers that misbehave: within the wall-clock bound of
// Options.Context, in bounded memory, it gives honest verdicts (nothing
// passed that was not shown, nothing failed that the server did not
// break) or an error that names the problem.

// hostileEnv, in a re-executed test binary, names the hostile server it
// plays (see runHostileChild).
const hostileEnv = "TURNCHECK_HOSTILE"

const (
	// hostileSeed fixes the steps of every run here.
	hostileSeed = 20240601
	// hostileSlack is what a run may take past its bound: the steps in
	// flight are aborted and the servers stopped after the bound ends.
	hostileSlack = 5 * time.Second
)

// hostileProfile is how the hostile servers are talked to: a short model
// timeout, so that a hung request would be given up on (ModelTimeout +
// 10s) even without the run's bound.
var hostileProfile = scenarios.Profile{Model: "turncheck", ModelTimeout: 500 * time.Millisecond}

// hostileRun is what one bounded Conform came to.
type hostileRun struct {
	c       *scenarios.Conformance
	err     error
	elapsed time.Duration
}

// conformWithin runs Conform against target under a run bound, checks that
// it returned within the bound and a slack, and logs what it said.
func conformWithin(t *testing.T, target scenarios.Target, bound time.Duration, opts scenarios.Options) hostileRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	opts.Context = ctx
	if opts.Seed == 0 {
		opts.Seed = hostileSeed
	}
	if opts.ShrinkTime == 0 {
		opts.ShrinkTime = time.Second
	}
	start := time.Now()
	c, err := scenarios.Conform(target, opts)
	r := hostileRun{c: c, err: err, elapsed: time.Since(start)}
	t.Logf("Conform returned after %s (bound %s)", r.elapsed.Round(time.Millisecond), bound)
	if err != nil {
		t.Logf("error: %v", err)
	}
	if c != nil {
		var b strings.Builder
		for _, v := range c.Verdicts {
			fmt.Fprintf(&b, "  %-3s %-14s evaluated %d", v.Invariant, v.Status, v.Evaluations)
			if v.Failure != nil && v.Failure.Violation != nil {
				fmt.Fprintf(&b, ": %s", firstLineOf(v.Failure.Violation.Error()))
			}
			b.WriteByte('\n')
		}
		t.Logf("%s; stopped: %q\n%s", c.Stats.Summary(), c.Stopped, b.String())
	}
	assert.Less(t, r.elapsed, bound+hostileSlack, "Conform overran its bound of %s", bound)
	return r
}

func firstLineOf(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// assertHonest checks the verdicts on a server that never committed a
// turn: it does not conform, the invariants about committed turns were
// not exercised (never passed), and every Fail is one that genuine says
// the server did break.
func assertHonest(t *testing.T, c *scenarios.Conformance, genuine func(scenarios.Verdict) bool) {
	t.Helper()
	require.NotNil(t, c)
	assert.False(t, c.Passed(), "a server that served no turn conforms")
	for _, inv := range []model.Invariant{model.T1, model.T2, model.T6} {
		v := c.Verdict(inv)
		assert.Equal(t, scenarios.NotExercised, v.Status, "%s: %+v", inv, v)
	}
	for _, v := range c.Verdicts {
		if v.Status != scenarios.Fail {
			continue
		}
		if v.Failure == nil {
			// A FAIL no steps show (a server that did not start): its
			// reason says it.
			if genuine == nil || !genuine(v) {
				t.Errorf("%s failed against a server that served no turn: a false alarm?\n%s", v.Invariant, v.Reason)
			}
			continue
		}
		if genuine == nil || !genuine(v) {
			t.Errorf("%s failed against a server that served no turn: a false alarm?\n%s", v.Invariant, v.Failure.Report)
		}
	}
}

// t3AnsweredWith accepts a T3 failure for a server that answered a request
// without a usable user message with the given status, not 400: that is
// a genuine break of T3, whatever the body said.
func t3AnsweredWith(status int) func(scenarios.Verdict) bool {
	return func(v scenarios.Verdict) bool {
		return v.Invariant == model.T3 && v.Failure.Violation != nil &&
			strings.Contains(v.Failure.Violation.Reason, fmt.Sprintf("with status %d; want 400", status))
	}
}

// hostileHandler is a Handler target serving h for every check.
func hostileHandler(h http.HandlerFunc) scenarios.Target {
	return scenarios.Handler(hostileProfile, func(string, string) (http.Handler, error) { return h, nil })
}

// chatOnly sends anything but the chat endpoint a 404, and answers the
// chat endpoint with h.
func chatOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}
}

// TestHostileGarbage: a server that answers 200 with a body that is not
// a chat.completion, or a stream of garbage lines, committed nothing the
// client could learn of: every turn's outcome is unknown. Nothing about
// committed turns is exercised, nothing passes, and the only failure is
// the genuine one: a 200 to a request that must get 400 (T3).
func TestHostileGarbage(t *testing.T) {
	cases := []struct{ name, contentType, body string }{
		{"json", "application/json", "<html><body><h1>502 Bad Gateway</h1></body></html>\n"},
		{"sse", "text/event-stream", ": keep-alive\n" +
			"garbage without a field\n" +
			"event: weird\n" +
			"data: {\"choices\": 7, \n\n" +
			"data: [DONE]\n\n"},
		{"sse without data", "text/event-stream", "retry: never\n\nid: 1\n\n: nothing here\n"},
	}
	for _, b := range cases {
		t.Run(b.name, func(t *testing.T) {
			var served atomic.Int64
			target := hostileHandler(chatOnly(func(w http.ResponseWriter, _ *http.Request) {
				served.Add(1)
				w.Header().Set("Content-Type", b.contentType)
				_, _ = w.Write([]byte(b.body))
			}))
			r := conformWithin(t, target, 3*time.Second, scenarios.Options{Checks: 10, Steps: 10})
			require.NoError(t, r.err)
			assert.Positive(t, served.Load())
			assert.Positive(t, r.c.Stats.Outcomes["unknown"], "every garbage answer is an unknown outcome")
			assert.Zero(t, r.c.Stats.Outcomes["ok"], "a garbage answer taken for ok")
			assert.Equal(t, scenarios.Fail, r.c.Verdict(model.T3).Status, "a 200 to a request that must get 400 went unnoticed")
			assertHonest(t, r.c, t3AnsweredWith(200))
		})
	}
}

// TestHostileHang: a server that accepts and never answers, or sends its
// headers and then never a byte of body, holds every request until the
// run's bound aborts it; Conform then stops, says so, and claims nothing.
func TestHostileHang(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	// Each case waits out its run's bound: the four wait at once.
	t.Run("no headers", func(t *testing.T) {
		t.Parallel()
		// It answers a GET (a liveness probe) but holds every POST.
		url := "http://" + silentServer(t, true)
		target := scenarios.Remote{URL: url, ModelAt: anyModelAddr, Reaches: hostileProfile}
		r := conformWithin(t, target, 2*time.Second, scenarios.Options{Checks: 3, Steps: 5})
		require.NoError(t, r.err)
		assert.Equal(t, "the time bound was reached", r.c.Stopped)
		assert.Positive(t, r.c.Stats.Outcomes["unknown"])
		assert.Zero(t, r.c.Stats.Outcomes["ok"]+r.c.Stats.Outcomes["fail"])
		assertHonest(t, r.c, nil)
	})
	t.Run("not even a probe", func(t *testing.T) {
		t.Parallel()
		// It holds every request, a liveness probe too: the error says
		// that no server answers there, even though the probe ran past
		// the time bound.
		url := "http://" + silentServer(t, false)
		target := scenarios.Remote{URL: url, ModelAt: anyModelAddr, Reaches: hostileProfile}
		r := conformWithin(t, target, 2*time.Second, scenarios.Options{Checks: 3, Steps: 5})
		require.Error(t, r.err)
		assert.Contains(t, r.err.Error(), "no server answers at "+url)
		if r.c != nil {
			assert.Zero(t, r.c.Stats.Outcomes["ok"]+r.c.Stats.Outcomes["fail"])
			assertHonest(t, r.c, nil)
		}
	})
	for _, ct := range []string{"application/json", "text/event-stream"} {
		t.Run("headers only, "+ct, func(t *testing.T) {
			t.Parallel()
			target := hostileHandler(chatOnly(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", ct)
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			}))
			r := conformWithin(t, target, 2*time.Second, scenarios.Options{Checks: 3, Steps: 5})
			require.NoError(t, r.err)
			assert.Equal(t, "the time bound was reached", r.c.Stopped)
			assert.Positive(t, r.c.Stats.Outcomes["unknown"])
			assert.Zero(t, r.c.Stats.Outcomes["ok"]+r.c.Stats.Outcomes["fail"])
			assertHonest(t, r.c, t3AnsweredWith(200))
		})
	}
}

// silentServer listens on loopback and returns its address. It reads each
// request's head and never answers it, except, with probes, a GET, which
// gets an empty 200. Its connections close when the test ends.
func silentServer(t *testing.T, probes bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	serve := func(c net.Conn) {
		defer wg.Done()
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if !probes || req.Method != http.MethodGet {
				_, _ = io.Copy(io.Discard, br) // hold it: until the client or the test hangs up
				return
			}
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"); err != nil {
				return
			}
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go serve(c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// anyModelAddr is where the fake model listens for a hostile server,
// which never calls it: a port of the model's own. (One picked free and
// let go of before was once taken by another process by the time the
// model bound it.)
const anyModelAddr = "127.0.0.1:0"

// chunk is a well-formed chat.completion.chunk with content s and no
// finish reason.
func chunk(s string) string {
	return `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":` + strconv.Quote(s) + `}}]}`
}

// TestHostileEndlessStream: a stream of well-formed chunks that never
// finishes and never sends [DONE] is no ok turn: it is cut by the run's
// bound, and its outcome is unknown.
func TestHostileEndlessStream(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	var chunks atomic.Int64
	target := hostileHandler(chatOnly(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			if _, err := fmt.Fprintf(w, "data: %s\n\n", chunk("still thinking ")); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			chunks.Add(1)
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
			}
		}
	}))
	r := conformWithin(t, target, 2*time.Second, scenarios.Options{Checks: 3, Steps: 5})
	require.NoError(t, r.err)
	assert.Equal(t, "the time bound was reached", r.c.Stopped)
	assert.Greater(t, chunks.Load(), int64(50), "the stream did flow")
	assert.Zero(t, r.c.Stats.Outcomes["ok"]+r.c.Stats.Outcomes["fail"])
	assertHonest(t, r.c, t3AnsweredWith(200))
	assert.Contains(t, strings.Join(r.c.Stats.Warnings(), "\n"), "may never end", "the run says no response ever ended")
}

// TestHostileGigabytes: a response body without end, as fast as the
// server can write it, is read only up to the client's bounds: the server
// gets to send little per request, and the heap stays small.
func TestHostileGigabytes(t *testing.T) {
	const fill = 32 << 10
	endless := func(status int, contentType, prefix string, each func() []byte) func(*atomic.Int64, *atomic.Int64) http.HandlerFunc {
		return func(sent, requests *atomic.Int64) http.HandlerFunc {
			return chatOnly(func(w http.ResponseWriter, r *http.Request) {
				requests.Add(1)
				w.Header().Set("Content-Type", contentType)
				w.WriteHeader(status)
				n, err := w.Write([]byte(prefix))
				sent.Add(int64(n))
				for err == nil && r.Context().Err() == nil {
					n, err = w.Write(each())
					sent.Add(int64(n))
				}
			})
		}
	}
	as := []byte(strings.Repeat("a", fill))
	same := func() []byte { return as }
	var chunks []byte
	for len(chunks) < fill {
		chunks = append(chunks, "data: "+chunk(strings.Repeat("x", 1000))+"\n\n"...)
	}
	cases := []struct {
		name    string
		status  int // what the server answers every request, an invalid one too (T3)
		handler func(sent, requests *atomic.Int64) http.HandlerFunc
	}{
		{"json body", http.StatusOK, endless(http.StatusOK, "application/json", `{"choices":[{"message":{"role":"assistant","content":"`, same)},
		{"one sse data line", http.StatusOK, endless(http.StatusOK, "text/event-stream", "data: ", same)},
		{"sse chunks", http.StatusOK, endless(http.StatusOK, "text/event-stream", "", func() []byte { return chunks })},
		{"error body", http.StatusInternalServerError, endless(http.StatusInternalServerError, "application/json", `{"error":{"message":"`, same)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var sent, requests atomic.Int64
			target := hostileHandler(tc.handler(&sent, &requests))
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			peak := sampleHeap(5 * time.Millisecond)
			r := conformWithin(t, target, 4*time.Second, scenarios.Options{Checks: 2, Steps: 5})
			heapPeak := peak()
			runtime.ReadMemStats(&after)
			require.NoError(t, r.err)
			n, total := requests.Load(), sent.Load()
			require.Positive(t, n)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d requests; server sent %d MiB (%.1f MiB a request); allocated %d MiB in all; heap in use %d MiB before, peak %d MiB",
				n, total>>20, float64(total)/float64(n)/(1<<20), alloc>>20, before.HeapInuse>>20, heapPeak>>20)
			// The client reads at most 8 MiB of a response (and 1 MiB of an
			// event, 4 KiB of an error); what more a request got sent sat in
			// socket buffers when the client hung up.
			assert.Less(t, total/n, int64(24<<20), "the client read on far past its bounds")
			assert.Less(t, heapPeak, before.HeapInuse+256<<20, "the heap grew with what the server sent")
			assert.Zero(t, r.c.Stats.Outcomes["ok"])
			assertHonest(t, r.c, t3AnsweredWith(tc.status))
		})
	}
}

// sampleHeap samples HeapInuse every interval until the returned function
// is called, which returns the highest value seen.
func sampleHeap(interval time.Duration) func() uint64 {
	stop, done := make(chan struct{}), make(chan struct{})
	var peak uint64
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 {
		close(stop)
		<-done
		return peak
	}
}

// startTimeout is how long a hostile server of mode is given to start.
func startTimeout(mode string) time.Duration {
	if mode == "never-ready" {
		// Long enough for the re-executed binary to start and say it is
		// warming up on a loaded machine, so that its words are quoted.
		return 2 * time.Second
	}
	return 20 * time.Second
}

// hostileCommand is the command that re-executes this test binary as the
// hostile server mode names.
func hostileCommand(t *testing.T, mode string) scenarios.Subprocess {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	return scenarios.Subprocess{
		Command: []string{exe, "{addr}", "{model_url}", "{data_dir}"},
		Env:     []string{hostileEnv + "=" + mode},
		// A server that never becomes ready is given 2s, tried once:
		// well within the bounds here. Any other starts in time however
		// loaded the machine is: whether it started must not depend on
		// the load.
		StartTimeout: startTimeout(mode),
		StopGrace:    time.Second,
		Reaches:      hostileProfile,
	}
}

// TestHostileDeathAtStart: a server that exits at once, or never becomes
// ready, is the start finding, which says so and quotes what the server
// said: no error, and no other verdict but what nothing exercised.
func TestHostileDeathAtStart(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	cases := []struct{ mode, says, quotes string }{
		{"exit-at-start", "exited with status 3 before it was ready", "hostile: cannot read my configuration"},
		{"never-ready", "not ready within 2s", "hostile: warming up"},
	}
	for _, tc := range cases {
		t.Run(tc.mode, func(t *testing.T) {
			r := conformWithin(t, hostileCommand(t, tc.mode), 20*time.Second, scenarios.Options{Checks: 3, Steps: 5})
			require.NoError(t, r.err)
			v := r.c.Verdict(model.Start)
			require.Equal(t, scenarios.Fail, v.Status)
			assert.Contains(t, v.Reason, "the server did not start at check 1: its start failed in 1 try")
			assert.Contains(t, v.Reason, tc.says)
			assert.Contains(t, v.Reason, tc.quotes, "the server's output is quoted")
			assert.Equal(t, "0 of 3 checks asked ran: the server did not start at check 1", r.c.Stopped)
			assertHonest(t, r.c, func(v scenarios.Verdict) bool { return v.Invariant == model.Start })
		})
	}
}

// hostileRequests is how many chat requests the dying server serves.
const hostileRequests = 4

// TestHostileDeathMidRun: a server, run once for the whole run, that
// serves a few requests and then exits is a crash finding, with its last
// words, within the bound; the run starts it again and goes on, and
// nothing else is judged broken.
func TestHostileDeathMidRun(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	// Under the client's 30s: the run ends on the death, not on a timeout.
	const bound = 20 * time.Second
	r := conformWithin(t, hostileCommand(t, "die-mid-run"), bound, scenarios.Options{Checks: 3, Steps: 8})
	require.NoError(t, r.err)
	require.NotNil(t, r.c)
	v := r.c.Verdict(model.Crash)
	require.Equal(t, scenarios.Fail, v.Status, "%+v", v)
	require.NotNil(t, v.Failure)
	assert.Contains(t, v.Failure.Violation.Reason, "exited with status 7")
	assert.Contains(t, v.Failure.Violation.Reason, fmt.Sprintf("hostile: served %d requests, exiting", hostileRequests))
	assert.NotEmpty(t, v.Failure.Plans)
	assert.Positive(t, r.c.Stats.SetAside[model.Crash], "the server died again, started again each time")
	for _, v := range r.c.Verdicts {
		if v.Status == scenarios.Fail && v.Invariant != model.Crash {
			t.Errorf("%s failed against a correct server that died: a false alarm?\n%s", v.Invariant, v.Failure.Report)
		}
	}
}

// runHostileChild plays the hostile server that hostileEnv names, when it
// is set: this process is then a test binary re-executed by a Subprocess
// target, with {addr}, {model_url} and {data_dir} as its arguments. It
// never returns then.
func runHostileChild() {
	mode := os.Getenv(hostileEnv)
	if mode == "" {
		return
	}
	os.Exit(hostileChild(mode, os.Args[1:]))
}

func hostileChild(mode string, args []string) int {
	if len(args) != 3 {
		fmt.Fprintf(os.Stderr, "hostile: want addr, model URL and data dir; got %q\n", args)
		return 2
	}
	addr, modelURL, dataDir := args[0], args[1], args[2]
	switch mode {
	case "exit-at-start":
		fmt.Fprintln(os.Stderr, "hostile: cannot read my configuration: no such file")
		return 3
	case "never-ready":
		fmt.Fprintln(os.Stderr, "hostile: warming up")
		time.Sleep(time.Hour) // killed by the harness first
		return 0
	case "die-mid-run":
		// The reference server, which exits as it is about to serve its
		// hostileRequests+1-th chat request.
		srv, err := sut.New(sut.Config{ModelURL: modelURL, DataDir: dataDir, RequestTimeout: time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, "hostile:", err)
			return 2
		}
		var served atomic.Int64
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/chat/completions" && served.Add(1) > hostileRequests {
				fmt.Fprintf(os.Stderr, "hostile: served %d requests, exiting\n", hostileRequests)
				os.Exit(7)
			}
			srv.ServeHTTP(w, r)
		})
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "hostile:", err)
			return 2
		}
		err = http.Serve(ln, h)
		fmt.Fprintln(os.Stderr, "hostile:", err)
		return 2
	case "untidy-stop":
		// The reference server, which exits 1 on SIGTERM, as some servers
		// do, once it has served everything asked of it.
		srv, err := sut.New(sut.Config{ModelURL: modelURL, DataDir: dataDir, RequestTimeout: time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, "hostile:", err)
			return 2
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "hostile:", err)
			return 2
		}
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		go func() { _ = http.Serve(ln, srv) }()
		<-term
		fmt.Fprintln(os.Stderr, "hostile: panic: close of closed channel (on SIGTERM)")
		return 1
	}
	fmt.Fprintf(os.Stderr, "hostile: unknown mode %q\n", mode)
	return 2
}

// TestHostileUntidyStop: a server that exits 1 on SIGTERM after the run
// gets its verdicts all the same, with a note that quotes it, not an
// error in their place.
func TestHostileUntidyStop(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	r := conformWithin(t, hostileCommand(t, "untidy-stop"), 20*time.Second, scenarios.Options{Checks: 3, Steps: 8})
	require.NoError(t, r.err)
	require.NotNil(t, r.c)
	assert.Equal(t, scenarios.Pass, r.c.Verdict(model.T2).Status)
	require.Len(t, r.c.Notes, 1)
	assert.Contains(t, r.c.Notes[0], "exited with status 1 after SIGTERM")
	assert.Contains(t, r.c.Notes[0], "close of closed channel")
	assert.Contains(t, r.c.Text(hostileProfile), "note: the server did not stop cleanly")
}
