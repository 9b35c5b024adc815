package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/internal/testbin"
)

// The flood probe: thousands of slow clients (slowloris), each reopened as
// soon as the server closes it, against `turncheck serve` run as a
// subprocess with its default caps, beside one normal client doing turns.
// What it measures is how many of the normal client's turns succeed, and
// how long they take; it asserts nothing about either (the machine decides
// them), and runs only when -flood gives it a duration.

var flood = flag.Duration("flood", 0, "TestConnFlood: how long the normal client runs beside each flood (0 skips it)")

// floodEnv, set, makes this test binary a flooder: "KIND ADDR N" opens N
// slowloris connections of KIND (header or body) to ADDR until its stdin
// closes, then prints its counts. A process holds at most `ulimit -n`
// descriptors, so a flood of 20,000 runs as several.
const floodEnv = "TURNCHECK_FLOODER"

// floodConns is the size of a flood; floodProcs share it.
const (
	floodConns = 20000
	floodProcs = 2
)

// slowlorisPrefix is what a slowloris of kind sends before it stalls: the
// start of a request head (header), or a whole head and one byte of the
// body it declares (body).
func slowlorisPrefix(kind string) string {
	if kind == "header" {
		return "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	}
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
		"X-Conversation-Id: stalled\r\nContent-Length: 100\r\n\r\n{"
}

// flooder is a flood process's main: see floodEnv.
func flooder(spec string) int {
	var kind, addr string
	var n int
	if _, err := fmt.Sscan(spec, &kind, &addr, &n); err != nil {
		fmt.Fprintf(os.Stderr, "flooder: %s=%q: %v\n", floodEnv, spec, err)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	prefix := []byte(slowlorisPrefix(kind))
	var dials, failed atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			d := net.Dialer{Timeout: 10 * time.Second}
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					failed.Add(1)
					select { // not a hot loop when the ports run out
					case <-ctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
					continue
				}
				dials.Add(1)
				stop := context.AfterFunc(ctx, func() { _ = c.Close() })
				if _, err := c.Write(prefix); err == nil {
					// Until the server answers (408, 503) and closes, or
					// just closes.
					_, _ = io.Copy(io.Discard, c)
				}
				stop()
				_ = c.Close()
			}
		})
	}
	wg.Wait()
	fmt.Printf("dials %d failed %d\n", dials.Load(), failed.Load())
	return 0
}

// floodRun is what one run of the probe saw.
type floodRun struct {
	turns, ok int
	took      []time.Duration // of every turn, ok or not
	errs      map[string]int
	failedAt  []int // the first few failed turns, counted from 0
	dials     int64 // the flood's connections opened (and failed)
	failed    int64
	capLogs   int
	loadAvg   [2]string // before, after
}

// TestConnFlood: a flood of 20,000 slowloris connections, sending part of a
// head (header) or a head and part of a body (body), each reopened as soon
// as it is closed, beside one normal client: a Go net/http client doing
// turns one after another, alternately streamed and not, with keep-alive
// (keep-alive) or a new connection per turn (fresh); and the client with
// no flood (none), for what the machine's load costs alone. It reports the share
// of the client's turns that succeeded, their p50 and p99, and what
// failed.
//
//	go test ./cmd/turncheck -run TestConnFlood -flood 15s -v
func TestConnFlood(t *testing.T) {
	if *flood == 0 {
		t.Skip("a flood of 20,000 connections for a while: go test ./cmd/turncheck -run TestConnFlood -flood 15s -v")
	}
	bin := testbin.Turncheck(t)
	for _, kind := range []string{"none", "header", "body"} {
		for _, client := range []string{"keep-alive", "fresh"} {
			t.Run(kind+"/"+client, func(t *testing.T) {
				r := runFlood(t, bin, kind, client == "keep-alive", *flood)
				slices.Sort(r.took)
				t.Logf("%s flood x%d, %s client for %s: %d/%d turns ok (%.1f%%), p50 %s, p99 %s, max %s; "+
					"flood opened %d connections (%.0f/s), %d dials failed; cap logged %d times; load %s -> %s; errors %v at turns %v",
					kind, floodConns, client, *flood, r.ok, r.turns, 100*float64(r.ok)/float64(max(r.turns, 1)),
					quantile(r.took, 0.5), quantile(r.took, 0.99), quantile(r.took, 1),
					r.dials, float64(r.dials)/flood.Seconds(), r.failed, r.capLogs, r.loadAvg[0], r.loadAvg[1], r.errs, r.failedAt)
			})
		}
	}
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[min(len(ds)-1, int(q*float64(len(ds))))].Round(time.Millisecond)
}

// loadAvg is the 1- and 5-minute load averages, as uptime shows them.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// runFlood starts a server, floods it with kind, and runs the normal
// client beside the flood for d.
func runFlood(t *testing.T, bin, kind string, keepAlive bool, d time.Duration) (r floodRun) {
	r.errs = map[string]int{}
	r.loadAvg[0] = loadAvg()
	m, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	defer m.Close()

	// The server: `turncheck serve` with its default caps.
	var serverLog syncbuf.Buffer
	srv := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--model-url", m.URL(), "--data-dir", t.TempDir())
	srv.Stderr = &serverLog
	out, err := srv.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, srv.Start())
	defer func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = srv.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = srv.Process.Kill()
			<-done
		}
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the server did not say where it listens")
	base := strings.TrimSpace(line[strings.LastIndex(line, " "):])
	addr := strings.TrimPrefix(base, "http://")

	// The flood, from floodProcs processes.
	exe, err := os.Executable()
	require.NoError(t, err)
	type flooderProc struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   bytes.Buffer
	}
	procs := floodProcs
	if kind == "none" {
		procs = 0 // the control: the client alone, on the same machine
	}
	var floods []*flooderProc
	for range procs {
		f := &flooderProc{cmd: exec.Command(exe)}
		f.cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d", floodEnv, kind, addr, floodConns/floodProcs))
		f.cmd.Stdout, f.cmd.Stderr = &f.out, &f.out
		f.stdin, err = f.cmd.StdinPipe()
		require.NoError(t, err)
		require.NoError(t, f.cmd.Start())
		floods = append(floods, f)
	}
	defer func() {
		for _, f := range floods {
			_ = f.stdin.Close()
		}
		for _, f := range floods {
			if err := f.cmd.Wait(); err != nil {
				t.Errorf("flooder: %v\n%s", err, f.out.String())
			}
			var dials, failed int64
			if _, err := fmt.Sscanf(f.out.String(), "dials %d failed %d", &dials, &failed); err != nil {
				t.Errorf("flooder said %q: %v", f.out.String(), err)
			}
			r.dials += dials
			r.failed += failed
		}
	}()
	if procs > 0 {
		// Let the flood reach the server's cap before the client starts.
		time.Sleep(2 * time.Second)
	}

	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = !keepAlive
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.CloseIdleConnections()
	for end := time.Now().Add(d); time.Now().Before(end); r.turns++ {
		start := time.Now()
		err := floodTurn(client, base, r.turns)
		r.took = append(r.took, time.Since(start))
		if err != nil {
			r.errs[err.Error()]++
			if len(r.failedAt) < 5 {
				r.failedAt = append(r.failedAt, r.turns)
			}
			continue
		}
		r.ok++
	}
	r.loadAvg[1] = loadAvg()
	r.capLogs = strings.Count(serverLog.String(), "connection cap reached")
	return r // the flood's counts are added as it stops
}

// floodTurn sends the normal client's turn i and checks its answer: 200
// and a reply (streamed every other turn, ending in [DONE]). A conversation
// takes 50 turns, well within the server's bound on its length.
func floodTurn(c *http.Client, base string, i int) error {
	stream := i%2 == 1
	body, err := json.Marshal(map[string]any{"model": "m", "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("tc-u%d hello", i+1)}}})
	if err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Conversation-Id", "flood-"+strconv.Itoa(i/50))
	resp, err := c.Do(req)
	if err != nil {
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			return errors.New("timeout")
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return errors.New("EOF")
		case errors.Is(err, syscall.ECONNRESET):
			return errors.New("reset")
		}
		return err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return fmt.Errorf("reading the answer: %w", err)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("status %d", resp.StatusCode)
	case stream && !bytes.Contains(got, []byte("data: [DONE]")):
		return errors.New("a stream without [DONE]")
	case !bytes.Contains(got, []byte(fmt.Sprintf("tc-a%d", i+1))):
		return errors.New("no reply")
	}
	return nil
}
