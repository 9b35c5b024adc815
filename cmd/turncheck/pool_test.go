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
// 503 with Retry-After sent before any model call, and no acknowledged
// turn missing from the store afterwards. The share of turns served and
// their latencies are the machine's, and are logged.

var (
	poolProbe         = flag.Duration("poolprobe", 0, "TestPoolProbe: how long the clients send turns (0 skips it)")
	poolProbeReplicas = flag.Int("poolprobe.replicas", 3, "TestPoolProbe: replicas of the server")
	poolProbeClients  = flag.Int("poolprobe.clients", 60, "TestPoolProbe: clients, each sending turns one after another on a conversation of its own")
	poolProbeMaxConns = flag.Int("poolprobe.max-connections", 20, "TestPoolProbe: PostgreSQL's max_connections")
	poolProbeModel    = flag.Duration("poolprobe.model", 300*time.Millisecond, "TestPoolProbe: how long the model takes to answer")
	poolProbeArgs     = flag.String("poolprobe.serve-args", "", "TestPoolProbe: more arguments for each replica's `turncheck serve`, space-separated")
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
	if err := pgserver.Installed(); errors.Is(err, pgserver.ErrNotInstalled) {
		t.Skip("TestPoolProbe runs a PostgreSQL of its own: ", err)
	}
	bin := testbin.Turncheck(t)
	load := loadAvg()

	pg, err := pgserver.Start("max_connections="+strconv.Itoa(*poolProbeMaxConns), "fsync=off")
	require.NoError(t, err)
	defer func() { require.NoError(t, pg.Stop()) }()
	require.NoError(t, pg.Exec("postgres", "CREATE ROLE turns LOGIN"))
	require.NoError(t, pg.Exec("postgres", "CREATE DATABASE pool OWNER turns"))
	storeURL := strings.Replace(pg.URL("pool"), "postgres@", "turns@", 1)

	m := startSlowModel(t, *poolProbeModel)
	var bases []string
	var logs []*syncbuf.Buffer
	var stops []func()
	for i := range *poolProbeReplicas {
		base, log, stop := startReplica(t, bin, m.url, storeURL, i)
		bases, logs, stops = append(bases, base), append(logs, log), append(stops, stop)
	}

	// The peak of connections PostgreSQL holds for the replicas, polled
	// as the superuser, whose reserved slots they cannot take.
	admin, err := sql.Open("pgx", pg.URL("postgres"))
	require.NoError(t, err)
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
		took    []time.Duration // of every turn
		byBase  = make([][]time.Duration, len(bases))
		tookOK  []time.Duration // of the turns answered 200
		codes   = map[string]int{}
		wrong   = map[string]int{}
		refused []string // the user messages of the turns refused with 503
		acked   []string // the user messages of the turns answered 200
	)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = *poolProbeClients
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	end := time.Now().Add(*poolProbe)
	var clients sync.WaitGroup
	for c := range *poolProbeClients {
		clients.Go(func() {
			for n := 0; time.Now().Before(end); n++ {
				text := fmt.Sprintf("pool-%d-%d", c, n)
				r := (c + n) % len(bases)
				start := time.Now()
				code, retryAfter, reply, err := poolTurn(client, bases[r], "pool-"+strconv.Itoa(c), text)
				d := time.Since(start)
				mu.Lock()
				took = append(took, d)
				byBase[r] = append(byBase[r], d)
				switch {
				case err != nil:
					codes[err.Error()]++
				case code == http.StatusOK && reply == "reply to "+text:
					codes["200"]++
					acked = append(acked, text)
					tookOK = append(tookOK, d)
				case code == http.StatusOK:
					wrong[fmt.Sprintf("a 200 with the reply %q", reply)]++
				case code == http.StatusServiceUnavailable && retryAfter == "":
					wrong["a 503 without Retry-After"]++
				case code == http.StatusServiceUnavailable:
					codes["503"]++
					refused = append(refused, text)
				default:
					codes[strconv.Itoa(code)]++
					wrong["status "+strconv.Itoa(code)]++
				}
				mu.Unlock()
				if code == http.StatusServiceUnavailable {
					time.Sleep(time.Second) // as Retry-After: 1 asks
				}
			}
		})
	}
	clients.Wait()
	close(stopPoll)
	polling.Wait()

	for _, text := range refused {
		if m.called(text) {
			wrong["a 503 after the model was called"]++
		}
	}
	// Every acknowledged turn is in the store: its user message and its
	// reply. Read as the superuser, as the replicas may hold every
	// ordinary slot.
	db, err := sql.Open("pgx", pg.URL("pool"))
	require.NoError(t, err)
	defer db.Close()
	stored := map[string]bool{}
	rows, err := db.Query(`SELECT content FROM messages`)
	require.NoError(t, err)
	for rows.Next() {
		var content string
		require.NoError(t, rows.Scan(&content))
		stored[content] = true
	}
	require.NoError(t, errors.Join(rows.Err(), rows.Close()))
	lost := 0
	for _, text := range acked {
		if !stored[text] || !stored["reply to "+text] {
			lost++
		}
	}

	slices.Sort(took)
	slices.Sort(tookOK)
	t.Logf("%d replicas, PostgreSQL max_connections %d (peak %d held by the replicas), %d clients, model %s, for %s: "+
		"%d turns, %v; all turns p50 %s, p99 %s, max %s; turns answered 200 p50 %s, p99 %s, max %s; load %s -> %s",
		*poolProbeReplicas, *poolProbeMaxConns, peak.Load(), *poolProbeClients, *poolProbeModel, *poolProbe,
		len(took), codes, quantile(took, 0.5), quantile(took, 0.99), quantile(took, 1),
		quantile(tookOK, 0.5), quantile(tookOK, 0.99), quantile(tookOK, 1), load, loadAvg())
	// Per replica: its turns' latencies, and the refusals its log says
	// (each kind's lines, rate-limited, sum its counts), once it has
	// stopped and logged those it had not yet.
	for _, stop := range stops {
		stop()
	}
	inLog := 0
	for r, d := range byBase {
		slices.Sort(d)
		logged := map[string]int{}
		for _, line := range strings.Split(logs[r].String(), "\n") {
			if by := fieldOf(line, "by="); by != "" && strings.Contains(line, `msg="refused for load"`) {
				n, _ := strconv.Atoi(fieldOf(line, "refused_since_last_line="))
				logged[by] += n
				inLog += n
			}
		}
		t.Logf("replica %d: %d turns, p50 %s, p99 %s, max %s; refusals logged, by whom: %v",
			r, len(d), quantile(d, 0.5), quantile(d, 0.99), quantile(d, 1), logged)
	}
	if len(wrong) > 0 {
		t.Errorf("answers no correct server gives, however loaded: %v", wrong)
	}
	if inLog < codes["503"] {
		// PostgreSQL's refusals of a connection are logged though a
		// later try got one: the log may say more than the 503s, never
		// fewer.
		t.Errorf("%d turns refused 503, and the replicas' logs count %d refusals", codes["503"], inLog)
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged turns are not in the store", lost, len(acked))
	}
	require.NotEmpty(t, acked, "no turn was served at all")
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

func startSlowModel(t *testing.T, delay time.Duration) *slowModel {
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
func startReplica(t *testing.T, bin, modelURL, storeURL string, i int) (base string, log *syncbuf.Buffer, stop func()) {
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
