package scenarios_test

import (
	"bytes"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/examples/memserver"
	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/sut"
)

// BenchmarkSteps measures the harness end to end: steps per second (the
// requests a run sends, as its summary counts them) against the
// in-process reference server, faults, checks and per-run server start-up
// included, against the same target the tests and the CLI use: its checks
// one at a time, and one per core, as the CLI runs them by default. The
// metric to compare is steps/s against BenchmarkBaseline's turns/s, and
// the requests a check sends include the model calls of tool loops,
// restarts and faults that a bare turn has none of.
func BenchmarkSteps(b *testing.B) {
	for _, c := range []struct {
		name     string
		parallel int
	}{{"one-at-a-time", 1}, {"one-per-core", runtime.GOMAXPROCS(0)}} {
		b.Run(c.name, func(b *testing.B) {
			target := reference.Target{}
			steps := 0
			start := time.Now()
			for b.Loop() {
				res, err := scenarios.Check(target, scenarios.Options{Checks: 10, Parallel: c.parallel})
				require.NoError(b, err)
				if res.Failure != nil {
					b.Fatalf("clean server failed:\n%s", res.Failure.Report)
				}
				steps += res.Steps
			}
			b.ReportMetric(float64(steps)/time.Since(start).Seconds(), "steps/s")
		})
	}
}

// BenchmarkBaseline is what one step costs without the harness: one
// loopback request client -> server -> model and one durable SQLite commit.
// "bare" is a minimal server written for the purpose; "reference" is the
// reference server continuing one conversation.
func BenchmarkBaseline(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		fake, err := faults.StartModel(faults.ModelConfig{})
		require.NoError(b, err)
		defer fake.Close()
		db, err := sql.Open("sqlite", "file:"+filepath.Join(b.TempDir(), "bare.db")+
			"?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
		require.NoError(b, err)
		defer db.Close()
		db.SetMaxOpenConns(1)
		_, err = db.Exec(`CREATE TABLE turns (seq INTEGER PRIMARY KEY, body BLOB)`)
		require.NoError(b, err)
		upstream := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		defer upstream.CloseIdleConnections()
		srv := startBare(b, func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			resp, err := upstream.Post(fake.URL()+"/chat/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			reply, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if _, err := db.Exec(`INSERT INTO turns (body) VALUES (?)`, reply); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			_, _ = w.Write(reply)
		})
		turns(b, srv, "")
	})
	b.Run("reference", func(b *testing.B) {
		fake, err := faults.StartModel(faults.ModelConfig{})
		require.NoError(b, err)
		defer fake.Close()
		run, err := sut.Start(sut.Config{ModelURL: fake.URL(), DataDir: b.TempDir()}, "")
		require.NoError(b, err)
		defer run.Close()
		turns(b, run.URL()+"/v1/chat/completions", "bench")
	})
}

// turns sends b.N turns to url, on conversation conv if not "", and reports
// turns per second.
func turns(b *testing.B, url, conv string) {
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer client.CloseIdleConnections()
	n := 0
	start := time.Now()
	for b.Loop() {
		n++
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"Please remember tc-u%d."}]}`, n)
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewBufferString(body))
		require.NoError(b, err)
		req.Header.Set("Content-Type", "application/json")
		if conv != "" {
			// A fresh conversation every 30 turns, as state-machine runs
			// have about 30 steps, so histories stay as long as theirs.
			req.Header.Set("X-Conversation-Id", fmt.Sprintf("%s-%d", conv, n/30))
		}
		resp, err := client.Do(req)
		require.NoError(b, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		require.Equal(b, http.StatusOK, resp.StatusCode)
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "turns/s")
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

func startBare(b *testing.B, h http.HandlerFunc) string {
	srv := &http.Server{Handler: h}
	ln, err := netListen()
	require.NoError(b, err)
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String() + "/"
}

// BenchmarkCatchAndShrink measures, per mutant, the wall time from the
// start of a check to a shrunk failure, the shrunk length, and how many
// replays shrinking took: the number that decides the cost on a server
// that takes a second to start.
func BenchmarkCatchAndShrink(b *testing.B) {
	for _, info := range sut.Mutants() {
		b.Run(string(info.Mutant), func(b *testing.B) {
			target := reference.Target{Mutant: info.Mutant}
			steps, runs := 0, 0
			for b.Loop() {
				res, err := scenarios.Check(target, scenarios.Options{Checks: 100})
				require.NoError(b, err)
				require.NotNil(b, res.Failure)
				steps += len(res.Failure.Plans)
				runs += res.Failure.ShrinkRuns
			}
			b.ReportMetric(float64(steps)/float64(b.N), "steps")
			b.ReportMetric(float64(runs)/float64(b.N), "shrink-runs")
		})
	}
}

// BenchmarkHandlerDefaultRun is what a Go user's check of one correct
// handler costs: the README's snippet, Options{Checks: 20, Seed: 1}, on
// examples/memserver, a whole in-memory server of 150 lines. It reports
// the wall time of a run and where it went: quiet periods (none: a
// handler's bursts are known at rest by their goroutines) and held calls
// waiting out the handler's own model timeout.
func BenchmarkHandlerDefaultRun(b *testing.B) {
	target := scenarios.Handler(scenarios.Profile{Model: "my-agent"},
		func(modelURL, dataDir string) (http.Handler, error) { return memserver.New(modelURL), nil })
	for b.Loop() {
		start := time.Now()
		res, err := scenarios.Check(target, scenarios.Options{Checks: 20, Seed: 1})
		require.NoError(b, err)
		if res.Failure != nil {
			b.Fatalf("clean server failed:\n%s", res.Failure.Report)
		}
		b.ReportMetric(time.Since(start).Seconds(), "s/run")
		b.ReportMetric(float64(res.Stats.TimeMS["quiet periods (the server reports no activity)"])/1000, "quiet-s/run")
		b.ReportMetric(float64(res.Stats.TimeMS["held calls waiting out the server's model timeout"])/1000, "timeout-s/run")
		b.ReportMetric(float64(res.Steps), "steps/run")
	}
}
