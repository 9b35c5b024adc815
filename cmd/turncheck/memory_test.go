//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/internal/testbin"
)

// memprobe runs the three memory scenarios at the server's
// default settings, or under -memprobe.budget, and logs the server's
// peak RSS after each: a probe, not a test (at full size it takes
// minutes and gigabytes). At any size it asserts what a budget promises
// (probeHolds); CI runs it smaller, under a budget the scenarios
// overrun many times over.
var (
	memprobe       = flag.Bool("memprobe", false, "run TestMemoryProbe: the memory scenarios at full size, peak RSS logged")
	memprobeBudget = flag.String("memprobe.budget", "", "--max-memory for TestMemoryProbe (empty: the server's default)")
	memprobeConvs  = flag.Int("memprobe.convs", 200, "TestMemoryProbe: full conversations filled")
	memprobeHeld   = flag.Int("memprobe.held", 128, "TestMemoryProbe: 4 MB replies held in flight at once")
	memprobeStalls = flag.Int("memprobe.stalls", 200, "TestMemoryProbe: clients that never read their 1 MB stream")
)

// budgetMargin is how far past its --max-memory the server's peak RSS may
// go: the GC limit's margin (memoryMargin: the Go heap's garbage and
// what the runtime keeps besides), and 48 MiB for what is not the Go
// runtime's: the binary's text and data (an idle server's RSS is about
// 19 MiB), and what SQLite's own allocator keeps of the largest rows it
// wrote (4 MiB replies: about 25 MiB). Neither grows with the clients.
const budgetMargin = memoryMargin + 48<<20

// TestServeStaysInItsMemoryBudget: a server with a 24 MiB budget stays
// under it plus budgetMargin (the kernel's peak RSS of the process,
// VmHWM) whatever its clients do, each scenario on a server of its own:
// they cache four times more conversations than it can keep (24 of
// 4 MiB), hold ten times more 1 MiB replies in flight than it can
// afford, or open 1 MiB streams they never read. What does not fit is refused with 503 and
// Retry-After, and the server answers turns once they are done, on a
// conversation it had to drop from its cache as well, reloaded whole from
// the store.
func TestServeStaysInItsMemoryBudget(t *testing.T) {
	t.Parallel() // it mostly waits on its servers
	const budget = 24 << 20
	bin := testbin.Turncheck(t)
	m := startBigModel(t)
	// Small bodies and histories, so that the budget may be small: it
	// must afford one turn at the limits.
	serve := func(t *testing.T) *servedProcess {
		return startServe(t, bin, m.url(), "--max-memory", "24MiB", "--max-body-bytes", "65536", "--max-history-bytes", "1048576")
	}
	c := &http.Client{}
	defer c.CloseIdleConnections()
	// within checks that srv still serves a new conversation, and that its
	// peak RSS is within the budget and the margin.
	within := func(t *testing.T, srv *servedProcess, what string) {
		status, _, body := chatTurn(t, c, srv.url, "after", "reply 1024 tc-u1", false)
		assert.Equal(t, http.StatusOK, status, body)
		peak := srv.peakRSS(t)
		t.Logf("%s: peak RSS %d MiB with a budget of %d MiB (margin %d MiB)", what, peak>>20, budget>>20, budgetMargin>>20)
		assert.LessOrEqual(t, peak, int64(budget+budgetMargin), "the server's peak RSS is past its budget and the margin")
	}

	t.Run("cache", func(t *testing.T) {
		t.Parallel()
		srv := serve(t)
		// Each of one turn, whose reply fills it (the reply limit, 4 MiB,
		// less room for the turn's JSON).
		fill := fillConversations(t, c, srv.url, 24, 1, 4<<20-4<<10, 1)
		assert.Equal(t, 24, fill.ok, "every turn of the conversations filled must be served: %+v", fill)
		// The first one, long since dropped from the cache, is reloaded
		// whole from the store: 4 MiB, past the history limit, so that its
		// next turn is refused, saying how long it is.
		status, _, body := chatTurn(t, c, srv.url, "fill-0", "tc-u2", false)
		assert.Equal(t, http.StatusBadRequest, status, body)
		if g := regexp.MustCompile(`its history would be (\d+) bytes`).FindStringSubmatch(body); assert.NotNil(t, g, body) {
			n, _ := strconv.Atoi(g[1])
			assert.Greater(t, n, 4<<20-4<<10, "the conversation dropped from the cache did not reload whole")
		}
		within(t, srv, "24 conversations of 4 MiB")
	})
	t.Run("replies in flight", func(t *testing.T) {
		t.Parallel()
		srv := serve(t)
		held := holdReplies(t, c, srv.url, m, 80, 1<<20)
		assert.Positive(t, held.ok, "no reply fit the budget: %+v", held)
		assert.Positive(t, held.refused, "every reply fit the budget: %+v", held)
		assert.Equal(t, 80, held.ok+held.refused, "%+v", held)
		within(t, srv, fmt.Sprintf("80 replies of 1 MiB held (%d served, %d refused)", held.ok, held.refused))
	})
	t.Run("streams not read", func(t *testing.T) {
		t.Parallel()
		srv := serve(t)
		// Each reply in one event, as long as an event may be: the server
		// reads it whole before it writes a byte of it.
		stallStreams(t, srv.url, m, 128, 1<<20-1<<10)
		within(t, srv, "128 streams of a 1 MiB event not read")
	})
}

// TestMemoryProbe runs the scenarios at full size (-memprobe):
// full conversations up to the cache's default count, 4 MB replies held
// in flight, clients that never read their 1 MB streams; it logs the peak
// RSS after each, for a server of the default budget or of
// -memprobe.budget, and checks what the budget promises (probeHolds).
// Each scenario gets a server of its own.
//
//	go test ./cmd/turncheck -run TestMemoryProbe -memprobe -v -timeout 30m
func TestMemoryProbe(t *testing.T) {
	if !*memprobe {
		t.Skip("a probe of minutes and gigabytes: run with -memprobe")
	}
	bin := testbin.Turncheck(t)
	m := startBigModel(t)
	c := &http.Client{}
	defer c.CloseIdleConnections()
	var extra []string
	if *memprobeBudget != "" {
		extra = []string{"--max-memory", *memprobeBudget}
	}
	{
		srv := startServe(t, bin, m.url(), extra...)
		fill := fillConversations(t, c, srv.url, *memprobeConvs, 4, 1<<20, 2)
		t.Logf("%d full conversations: peak RSS %d MiB (%+v)", *memprobeConvs, srv.peakRSS(t)>>20, fill)
		probeHolds(t, c, srv, fmt.Sprintf("%d full conversations", *memprobeConvs))
		srv.stop(t)
	}
	{
		srv := startServe(t, bin, m.url(), extra...)
		held := holdReplies(t, c, srv.url, m, *memprobeHeld, 4<<20)
		t.Logf("%d 4 MB replies in flight: peak RSS %d MiB (%+v)", *memprobeHeld, srv.peakRSS(t)>>20, held)
		probeHolds(t, c, srv, fmt.Sprintf("%d 4 MB replies in flight", *memprobeHeld))
		srv.stop(t)
	}
	{
		srv := startServe(t, bin, m.url(), extra...)
		stallStreams(t, srv.url, m, *memprobeStalls, 1<<20-1<<10)
		t.Logf("%d clients not reading 1 MB streams: peak RSS %d MiB", *memprobeStalls, srv.peakRSS(t)>>20)
		probeHolds(t, c, srv, fmt.Sprintf("%d clients not reading 1 MB streams", *memprobeStalls))
		srv.stop(t)
	}
}

// probeHolds checks, after a scenario of TestMemoryProbe, what the
// server's budget promises whatever the scenario's size and the
// machine's speed: a new conversation's turn is served, and the peak RSS
// is within the budget the server logged and budgetMargin. (How many
// turns the budget refused on the way is the tally's to log.) A turn
// refused for room (503) is sent again, as Retry-After asks, while the
// server lets go of the scenario's clients; one still refused after that
// leaves the check not exercised, not failed.
func probeHolds(t *testing.T, c *http.Client, srv *servedProcess, what string) {
	t.Helper()
	for try := 1; ; try++ {
		status, _, body := chatTurn(t, c, srv.url, "after", "tc-u1", false)
		if status == http.StatusServiceUnavailable {
			if try < 30 {
				time.Sleep(time.Second)
				continue
			}
			t.Logf("%s: a new turn after it not exercised: still refused for room after %d tries", what, try)
			break
		}
		assert.Equal(t, http.StatusOK, status, "%s: a new turn after it: %s", what, body)
		break
	}
	budget, peak := srv.budget(t), srv.peakRSS(t)
	t.Logf("%s: peak RSS %d MiB with a budget of %d MiB (margin %d MiB)", what, peak>>20, budget>>20, budgetMargin>>20)
	assert.LessOrEqual(t, peak, budget+budgetMargin, "%s: the server's peak RSS is past its budget and the margin", what)
}

// tally counts the turns of a scenario by how they ended.
type tally struct{ ok, refused, other int }

func (tl *tally) add(t *testing.T, status int, retryAfter, body string) {
	switch {
	case status == http.StatusOK:
		tl.ok++
	case status == http.StatusServiceUnavailable:
		tl.refused++
		assert.Equal(t, "1", retryAfter, "a 503 without Retry-After: %s", body)
		assert.Contains(t, body, `"overloaded"`)
		assert.Contains(t, body, "memory budget")
	default:
		tl.other++
		t.Errorf("status %d: %s", status, body)
	}
}

// fillConversations fills n conversations with turns of replies of size
// bytes (4 of 1 MiB fill one to the history limit), workers at a time; a
// turn refused with 503 is sent again after a moment, as Retry-After asks.
func fillConversations(t *testing.T, c *http.Client, base string, n, turns, size, workers int) tally {
	var mu sync.Mutex
	var all tally
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				for turn := 1; turn <= turns; turn++ {
					for try := 0; ; try++ {
						status, retry, body := chatTurn(t, c, base, fmt.Sprintf("fill-%d", i), fmt.Sprintf("reply %d tc-u%d", size, turn), false)
						if status == http.StatusServiceUnavailable && try < 20 {
							time.Sleep(20 * time.Millisecond)
							continue
						}
						mu.Lock()
						all.add(t, status, retry, body)
						mu.Unlock()
						break
					}
				}
			}
		})
	}
	wg.Wait()
	return all
}

// holdReplies sends n turns at once, each on a conversation of its own,
// whose replies of size bytes the model holds before their end, until
// every one is either held or answered; then it lets them end.
func holdReplies(t *testing.T, c *http.Client, base string, m *bigModel, n, size int) tally {
	m.hold()
	var mu sync.Mutex
	var all tally
	answered := atomic.Int64{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			status, retry, body := chatTurn(t, c, base, fmt.Sprintf("held-%d", i), fmt.Sprintf("reply %d hold tc-u1", size), false)
			answered.Add(1)
			mu.Lock()
			all.add(t, status, retry, body)
			mu.Unlock()
		})
	}
	deadline := time.Now().Add(time.Minute)
	for m.holding.Load()+answered.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// A machine too slow to get every turn this far in a minute leaves
	// the scenario short of its full load: not exercised, not failed.
	if got := m.holding.Load() + answered.Load(); got < int64(n) {
		t.Logf("not exercised at full load: %d of %d turns held or answered within a minute", got, n)
	}
	m.unhold()
	wg.Wait()
	return all
}

// stallStreams opens n streamed turns of size-byte replies, each sent by
// the model in one event, whose clients never read, waits until the model has stopped sending (the server
// stopped reading it, its clients' buffers full), then closes them.
func stallStreams(t *testing.T, base string, m *bigModel, n, size int) {
	var conns []net.Conn
	defer func() {
		for _, conn := range conns {
			_ = conn.Close()
		}
	}()
	host := strings.TrimPrefix(base, "http://")
	for i := range n {
		conn, err := net.Dial("tcp", host)
		require.NoError(t, err)
		conns = append(conns, conn)
		body := fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":"reply %d whole tc-u1"}]}`, size)
		_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Conversation-Id: stall-%d\r\nContent-Length: %d\r\n\r\n%s",
			host, i, len(body), body)
		require.NoError(t, err)
	}
	// Settled when the model's bytes sent stop growing for a while.
	last, still := int64(-1), 0
	for deadline := time.Now().Add(time.Minute); still < 25 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if now := m.sent.Load(); now == last {
			still++
		} else {
			last, still = now, 0
		}
	}
}

// chatTurn sends one chat turn on conversation conv and returns its
// status, Retry-After and body (of a stream, the whole stream).
func chatTurn(t *testing.T, c *http.Client, base, conv, content string, stream bool) (int, string, string) {
	body := fmt.Sprintf(`{"model":"m","stream":%t,"messages":[{"role":"user","content":%q}]}`, stream, content)
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Conversation-Id", conv)
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if len(out) > 512 {
		out = out[:512]
	}
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(out)
}

// bigModel is a model provider whose reply is as long as the request's
// last user message asks ("reply N"), sent in chunks of 32 KiB or, for
// "whole", in one; for "hold", it is held before its end until unhold.
type bigModel struct {
	ln      net.Listener
	srv     *http.Server
	holding atomic.Int64
	sent    atomic.Int64

	mu       sync.Mutex
	released chan struct{}
}

func startBigModel(t *testing.T) *bigModel {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	m := &bigModel{ln: ln, released: make(chan struct{})}
	close(m.released)
	m.srv = &http.Server{Handler: http.HandlerFunc(m.serve)}
	done := make(chan struct{})
	go func() { defer close(done); _ = m.srv.Serve(ln) }()
	t.Cleanup(func() {
		m.unhold()
		_ = m.srv.Close()
		<-done
	})
	return m
}

func (m *bigModel) url() string { return "http://" + m.ln.Addr().String() + "/v1" }

// hold makes the replies asked to hold wait for unhold.
func (m *bigModel) hold() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.released = make(chan struct{})
}

func (m *bigModel) unhold() {
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case <-m.released:
	default:
		close(m.released)
	}
}

var replyWanted = regexp.MustCompile(`reply (\d+)`)

func (m *bigModel) serve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	last := req.Messages[len(req.Messages)-1].Content

	size := 16
	if g := replyWanted.FindStringSubmatch(last); g != nil {
		size, _ = strconv.Atoi(g[1])
	}
	w.Header().Set("Content-Type", "text/event-stream")
	flusher := w.(http.Flusher)
	send := func(chunk string) bool {
		n, err := fmt.Fprintf(w, "data: %s\n\n", chunk)
		m.sent.Add(int64(n))
		flusher.Flush()
		return err == nil
	}
	if !send(`{"choices":[{"index":0,"delta":{"role":"assistant"}}]}`) {
		return
	}
	piece := strings.Repeat("x", 32<<10)
	if strings.Contains(last, " whole ") {
		piece = strings.Repeat("x", size)
	}
	for left := size; left > 0; left -= len(piece) {
		text := piece[:min(left, len(piece))]
		if !send(`{"choices":[{"index":0,"delta":{"content":"` + text + `"}}]}`) {
			return
		}
	}
	if strings.Contains(last, " hold ") {
		m.mu.Lock()
		released := m.released
		m.mu.Unlock()
		m.holding.Add(1)
		select {
		case <-released:
		case <-r.Context().Done():
		}
		m.holding.Add(-1)
	}
	send(`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`)
	send(`[DONE]`)
}

// servedProcess is a 'turncheck serve' subprocess.
type servedProcess struct {
	url     string
	cmd     *exec.Cmd
	stderr  *syncbuf.Buffer
	stopped bool
}

// startServe starts 'turncheck serve' with a data dir of t's, on model,
// with extra flags, and stops it when t ends.
func startServe(t *testing.T, bin, model string, extra ...string) *servedProcess {
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--model-url", model, "--data-dir", t.TempDir(), "--grace", "1s"}, extra...)
	cmd := exec.Command(bin, args...)
	stderr := &syncbuf.Buffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &servedProcess{cmd: cmd, stderr: stderr}
	t.Cleanup(func() { p.stop(t) })
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		_ = cmd.Wait()
		p.stopped = true
		t.Fatalf("turncheck serve printed no address: %s", stderr.String())
	}
	_, url, ok := strings.Cut(sc.Text(), "listening on ")
	require.True(t, ok, sc.Text())
	p.url = strings.TrimSpace(url)
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return p
}

// stop stops the server (SIGTERM), and kills it if it has not exited in
// 20 s; it fails t if the server had died before.
func (p *servedProcess) stop(t *testing.T) {
	if p.stopped {
		return
	}
	p.stopped = true
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("the server had died: %v\n%s", err, p.stderr.String())
	}
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	select {
	case err := <-exited:
		assert.NoError(t, err, "the server's exit\n%s", p.stderr.String())
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-exited
		t.Errorf("the server did not stop within 20s of SIGTERM")
	}
}

// budget is the memory budget the server logged at its start, in bytes:
// its --max-memory, or the default it took.
func (p *servedProcess) budget(t *testing.T) int64 {
	g := regexp.MustCompile(`msg="memory budget" max_memory=(\d+)`).FindStringSubmatch(p.stderr.String())
	require.NotNil(t, g, "the server logged no memory budget:\n%s", p.stderr.String())
	n, err := strconv.ParseInt(g[1], 10, 64)
	require.NoError(t, err)
	return n
}

// peakRSS is the server's peak resident set size so far, as the kernel
// counts it (VmHWM), in bytes.
func (p *servedProcess) peakRSS(t *testing.T) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	require.NoError(t, err, "the server has died")
	m := regexp.MustCompile(`(?m)^VmHWM:\s+(\d+) kB$`).FindSubmatch(status)
	require.NotNil(t, m, "no VmHWM in /proc/PID/status")
	kb, err := strconv.ParseInt(string(m[1]), 10, 64)
	require.NoError(t, err)
	return kb << 10
}
