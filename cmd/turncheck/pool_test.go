package main

import (
	"bufio"
	"bytes"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/pgserver"
	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/internal/testbin"
)

// The pool probe: replicas of `turncheck serve` over one PostgreSQL whose
// max_connections is small against the turns sent at once, every turn on
// a conversation of its own client and a model that takes a while to
// answer. It asserts only what no load excuses: no 500, every refusal a
// 503 with Retry-After sent before any model call, every refusal in a
// replica's log, and no acknowledged turn missing from the store
// afterwards. The share of turns served and their latencies are the
// machine's: TestPoolProbe logs them, BenchmarkPool reports them.

var (
	poolProbe         = flag.Duration("poolprobe", 0, "TestPoolProbe: how long the clients send turns (0 skips it)")
	poolProbeReplicas = flag.Int("poolprobe.replicas", 3, "TestPoolProbe and BenchmarkPool: replicas of the server")
	poolProbeClients  = flag.Int("poolprobe.clients", 60, "TestPoolProbe: clients, each sending turns one after another on a conversation of its own (BenchmarkPool: 1,000)")
	poolProbeMaxConns = flag.Int("poolprobe.max-connections", 20, "TestPoolProbe: PostgreSQL's max_connections (BenchmarkPool: 100)")
	poolProbeModel    = flag.Duration("poolprobe.model", 300*time.Millisecond, "TestPoolProbe and BenchmarkPool: how long the model takes to answer")
	poolProbeArgs     = flag.String("poolprobe.serve-args", "", "TestPoolProbe and BenchmarkPool: more arguments for each replica's `turncheck serve`, space-separated")
)

// TestPoolProbe: -poolprobe.clients clients, each sending turns one after
// another on a conversation of its own to the replicas in turn, for
// -poolprobe; the replicas (-poolprobe.replicas, with their default caps)
// share a PostgreSQL the test starts with -poolprobe.max-connections,
// connected to as an ordinary role (so its reserved slots are not theirs).
// No turn gets 500; every turn refused gets 503 with Retry-After and
// never reached the model; every turn answered 200 is in the store once
// the clients are done.
//
//	go test ./cmd/turncheck -run TestPoolProbe -poolprobe 20s -poolprobe.clients 300 -poolprobe.max-connections 100 -v
func TestPoolProbe(t *testing.T) {
	if *poolProbe == 0 {
		t.Skip("replicas over a PostgreSQL with few connections: go test ./cmd/turncheck -run TestPoolProbe -poolprobe 10s -v")
	}
	end := time.Now().Add(*poolProbe)
	runPool(t, *poolProbeClients, *poolProbeMaxConns, func() bool { return time.Now().Before(end) }).log(t)
}

// BenchmarkPool: b.N turns, from 1,000 clients each sending turns one
// after another on a conversation of its own, over three replicas
// (-poolprobe.replicas) on one PostgreSQL with max_connections 100, the
// model taking 300 ms (-poolprobe.model). Its op is a turn; it reports
// turns/s, the latencies of all turns (p50, p99, max, in ms) and each
// replica's p99, the 503s (all with Retry-After, or it fails) and the
// refusals the replicas logged. The clients start at once, so give it
// turns enough for their start to be a small part of the run:
//
//	go test ./cmd/turncheck -run '^$' -bench BenchmarkPool -benchtime 20000x
func BenchmarkPool(b *testing.B) {
	var sent atomic.Int64
	n := int64(b.N)
	res := runPool(b, 1000, 100, func() bool { return sent.Add(1) <= n })
	b.ReportMetric(float64(len(res.took))/res.elapsed.Seconds(), "turns/s")
	b.ReportMetric(ms(quantile(res.took, 0.5)), "p50-ms")
	b.ReportMetric(ms(quantile(res.took, 0.99)), "p99-ms")
	b.ReportMetric(ms(quantile(res.took, 1)), "max-ms")
	for r, d := range res.byReplica {
		b.ReportMetric(ms(quantile(d, 0.99)), "replica"+strconv.Itoa(r)+"-p99-ms")
	}
	b.ReportMetric(float64(res.codes["500"]), "500s")
	b.ReportMetric(float64(res.codes["503"]), "503s")
	b.ReportMetric(float64(res.logged), "refusals-logged")
	res.log(b)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// poolResult is what a pool run saw.
type poolResult struct {
	replicas, clients, maxConns int
	peak                        int64           // connections PostgreSQL held for the replicas, at most
	elapsed                     time.Duration   // from the clients' start to the last answer
	warmUp                      []time.Duration // of each client's first turn, sent all at once, sorted
	took                        []time.Duration // of every turn, sorted
	tookOK                      []time.Duration // of the turns answered 200, sorted
	byReplica                   [][]time.Duration
	loggedBy                    []map[string]int // per replica: the refusals its log counts, by who refused
	logged                      int              // the refusals all logs count
	codes                       map[string]int   // the turns by answer, the warm-up's too: "200", "503", another status, or how the call failed
	loadBefore, loadAfter       string
}

func (r poolResult) String() string {
	return fmt.Sprintf("%d replicas, PostgreSQL max_connections %d (peak %d held by the replicas), %d clients, model %s: "+
		"warm-up (a turn per client, at once) p50 %s, p99 %s, max %s; then %d turns in %s (%.0f/s), %v; all turns p50 %s, p99 %s, max %s; turns answered 200 p50 %s, p99 %s, max %s; refusals logged %d; load %s -> %s",
		r.replicas, r.maxConns, r.peak, r.clients, *poolProbeModel,
		quantile(r.warmUp, 0.5), quantile(r.warmUp, 0.99), quantile(r.warmUp, 1), len(r.took), r.elapsed.Round(time.Millisecond), float64(len(r.took))/r.elapsed.Seconds(), r.codes,
		quantile(r.took, 0.5), quantile(r.took, 0.99), quantile(r.took, 1),
		quantile(r.tookOK, 0.5), quantile(r.tookOK, 0.99), quantile(r.tookOK, 1), r.logged, r.loadBefore, r.loadAfter)
}

// log logs r, then a line per replica: its turns' latencies and the
// refusals its log counts, by who refused.
func (r poolResult) log(tb testing.TB) {
	tb.Logf("%s", r)
	for i, d := range r.byReplica {
		tb.Logf("replica %d: %d turns, p50 %s, p99 %s, max %s; refusals logged, by whom: %v",
			i, len(d), quantile(d, 0.5), quantile(d, 0.99), quantile(d, 1), r.loggedBy[i])
	}
}

// runPool starts PostgreSQL with maxConns connections, the slow model
// and -poolprobe.replicas replicas, then clients that send turns while
// more says so, each asking it before each turn, and fails tb on what no
// load excuses. Under a benchmark, only the clients' turns are timed.
func runPool(tb testing.TB, clients, maxConns int, more func() bool) poolResult {
	tb.Helper()
	if err := pgserver.Installed(); errors.Is(err, pgserver.ErrNotInstalled) {
		tb.Skip("the pool probe runs a PostgreSQL of its own: ", err)
	}
	bin := testbin.Turncheck(tb)
	res := poolResult{replicas: *poolProbeReplicas, clients: clients, maxConns: maxConns, codes: map[string]int{}, loadBefore: loadAvg()}

	pg, err := pgserver.Start("max_connections="+strconv.Itoa(maxConns), "fsync=off")
	require.NoError(tb, err)
	defer func() { require.NoError(tb, pg.Stop()) }()
	require.NoError(tb, pg.Exec("postgres", "CREATE ROLE turns LOGIN"))
	require.NoError(tb, pg.Exec("postgres", "CREATE DATABASE pool OWNER turns"))
	storeURL := strings.Replace(pg.URL("pool"), "postgres@", "turns@", 1)

	m := startSlowModel(tb, *poolProbeModel)
	var bases []string
	var logs []*syncbuf.Buffer
	var stops []func()
	for i := range res.replicas {
		base, log, stop := startReplica(tb, bin, m.url, storeURL, i)
		bases, logs, stops = append(bases, base), append(logs, log), append(stops, stop)
	}

	// The peak of connections PostgreSQL holds for the replicas, polled
	// as the superuser, whose reserved slots they cannot take.
	admin, err := sql.Open("pgx", pg.URL("postgres"))
	require.NoError(tb, err)
	defer admin.Close()
	admin.SetMaxOpenConns(1)
	var peak atomic.Int64
	stopPoll := make(chan struct{})
	var polling sync.WaitGroup
	polling.Go(func() {
		for {
			var n int64
			if admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE usename = 'turns'`).Scan(&n) == nil && n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stopPoll:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})

	var (
		mu      sync.Mutex
		wrong   = map[string]int{}
		refused []string // the user messages of the turns refused with 503
		acked   []string // the user messages of the turns answered 200
	)
	res.byReplica = make([][]time.Duration, len(bases))
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = clients
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	// turn sends client c's turn n, counts it in res where timed, and
	// after a 503 waits the second its Retry-After asks.
	turn := func(c, n int, timed bool) {
		text := fmt.Sprintf("pool-%d-%d", c, n)
		r := (c + n) % len(bases)
		sentAt := time.Now()
		code, retryAfter, reply, err := poolTurn(client, bases[r], "pool-"+strconv.Itoa(c), text)
		d := time.Since(sentAt)
		if code == http.StatusServiceUnavailable {
			defer time.Sleep(time.Second)
		}
		mu.Lock()
		defer mu.Unlock()
		if timed {
			res.took = append(res.took, d)
			res.byReplica[r] = append(res.byReplica[r], d)
		} else {
			res.warmUp = append(res.warmUp, d)
		}
		switch {
		case err != nil:
			res.codes[err.Error()]++
		case code == http.StatusOK && reply == "reply to "+text:
			res.codes["200"]++
			acked = append(acked, text)
			if timed {
				res.tookOK = append(res.tookOK, d)
			}
		case code == http.StatusOK:
			wrong[fmt.Sprintf("a 200 with the reply %q", reply)]++
		case code == http.StatusServiceUnavailable && retryAfter == "":
			wrong["a 503 without Retry-After"]++
		case code == http.StatusServiceUnavailable:
			res.codes["503"]++
			refused = append(refused, text)
		default:
			res.codes[strconv.Itoa(code)]++
			wrong["status "+strconv.Itoa(code)]++
		}
	}
	// The warm-up: each client's first turn, all at once, while the
	// replicas open their connections to PostgreSQL. Its latencies are
	// the start's, logged apart: the run measures the pool at work.
	var sending sync.WaitGroup
	for c := range clients {
		sending.Go(func() { turn(c, 0, false) })
	}
	sending.Wait()
	slices.Sort(res.warmUp)
	if b, ok := tb.(*testing.B); ok {
		b.ResetTimer()
	}
	start := time.Now()
	for c := range clients {
		sending.Go(func() {
			for n := 1; more(); n++ {
				turn(c, n, true)
			}
		})
	}
	sending.Wait()
	res.elapsed = time.Since(start)
	if b, ok := tb.(*testing.B); ok {
		b.StopTimer()
	}
	close(stopPoll)
	polling.Wait()
	res.peak = peak.Load()
	res.loadAfter = loadAvg()

	for _, text := range refused {
		if m.called(text) {
			wrong["a 503 after the model was called"]++
		}
	}
	// Every acknowledged turn is in the store: its user message and its
	// reply. Read as the superuser, as the replicas may hold every
	// ordinary slot.
	db, err := sql.Open("pgx", pg.URL("pool"))
	require.NoError(tb, err)
	defer db.Close()
	stored := map[string]bool{}
	rows, err := db.Query(`SELECT content FROM messages`)
	require.NoError(tb, err)
	for rows.Next() {
		var content string
		require.NoError(tb, rows.Scan(&content))
		stored[content] = true
	}
	require.NoError(tb, errors.Join(rows.Err(), rows.Close()))
	lost := 0
	for _, text := range acked {
		if !stored[text] || !stored["reply to "+text] {
			lost++
		}
	}

	slices.Sort(res.took)
	slices.Sort(res.tookOK)
	// The refusals each replica's log says (each kind's lines,
	// rate-limited, sum its counts), once it has stopped and logged those
	// it had not yet.
	for _, stop := range stops {
		stop()
	}
	for r, d := range res.byReplica {
		slices.Sort(d)
		logged := map[string]int{}
		for _, line := range strings.Split(logs[r].String(), "\n") {
			if by := fieldOf(line, "by="); by != "" && strings.Contains(line, `msg="refused for load"`) {
				n, _ := strconv.Atoi(fieldOf(line, "refused_since_last_line="))
				logged[by] += n
				res.logged += n
			}
		}
		res.loggedBy = append(res.loggedBy, logged)
	}
	if len(wrong) > 0 {
		tb.Errorf("answers no correct server gives, however loaded: %v", wrong)
	}
	if res.logged < res.codes["503"] {
		// PostgreSQL's refusals of a connection are logged though a
		// later try got one: the log may say more than the 503s, never
		// fewer.
		tb.Errorf("%d turns refused 503, and the replicas' logs count %d refusals", res.codes["503"], res.logged)
	}
	if lost > 0 {
		tb.Errorf("%d of %d acknowledged turns are not in the store", lost, len(acked))
	}
	require.NotEmpty(tb, acked, "no turn was served at all")
	return res
}

// poolTurn sends the chat turn text on conv to base, not streamed, and
// returns its status, its Retry-After and its reply.
func poolTurn(c *http.Client, base, conv, text string) (code int, retryAfter, reply string, err error) {
	body, err := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": text}}})
	if err != nil {
		return 0, "", "", err
	}
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Conversation-Id", conv)
	resp, err := c.Do(req)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return 0, "", "", errors.New("timeout")
		}
		return 0, "", "", errors.New("connection failed")
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", "", errors.New("answer cut short")
	}
	var completion openai.Completion
	if resp.StatusCode == http.StatusOK && json.Unmarshal(got, &completion) == nil && len(completion.Choices) > 0 && completion.Choices[0].Message != nil {
		reply = string(completion.Choices[0].Message.Content)
	}
	return resp.StatusCode, resp.Header.Get("Retry-After"), reply, nil
}

// slowModel is a model that answers every call, after a delay, with
// "reply to " and the last message it was sent, streamed as the server
// asks, and remembers what it was called for.
type slowModel struct {
	url   string
	mu    sync.Mutex
	calls map[string]bool
}

func (m *slowModel) called(text string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[text]
}

func startSlowModel(t testing.TB, delay time.Duration) *slowModel {
	m := &slowModel{calls: map[string]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req openai.ChatRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		last := string(req.Messages[len(req.Messages)-1].Content)
		m.mu.Lock()
		m.calls[last] = true
		m.mu.Unlock()
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		chunk, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "delta": map[string]string{"content": "reply to " + last}}}})
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", chunk)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	m.url = "http://" + ln.Addr().String() + "/v1"
	return m
}

// startReplica starts `turncheck serve` on storeURL and returns its base
// URL, its log, and its stop (SIGTERM, then SIGKILL past 20 s), which the
// test calls as it ends if it did not before. Its log is the test's if
// it fails.
func startReplica(t testing.TB, bin, modelURL, storeURL string, i int) (base string, log *syncbuf.Buffer, stop func()) {
	args := []string{"serve", "--listen", "127.0.0.1:0", "--model-url", modelURL, "--store", storeURL}
	args = append(args, strings.Fields(*poolProbeArgs)...)
	srv := exec.Command(bin, args...)
	log = &syncbuf.Buffer{}
	srv.Stderr = log
	out, err := srv.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	exited := make(chan struct{})
	go func() { _ = srv.Wait(); close(exited) }()
	var once sync.Once
	stop = func() { once.Do(func() { terminate(srv.Process, exited) }) }
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("replica %d's log (its last 4 KiB):\n%s", i, tail(log.String(), 4096))
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "replica %d did not say where it listens:\n%s", i, log.String())
	return strings.TrimSpace(line[strings.LastIndex(line, " "):]), log, stop
}

// fieldOf is the value of a log line's field that starts with key
// (key=value, as slog's text handler writes it), "" if it has none.
func fieldOf(line, key string) string {
	i := strings.Index(line, " "+key)
	if i < 0 {
		return ""
	}
	v := line[i+1+len(key):]
	if j := strings.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return v
}

// tail is the last n bytes of s.
func tail(s string, n int) string { return s[max(0, len(s)-n):] }
