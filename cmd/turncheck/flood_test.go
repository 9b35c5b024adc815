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
	"maps"
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
	"github.com/turncheck/turncheck/model"
)

// The flood probe: thousands of slow clients (slowloris), each reopened as
// soon as the server closes it, against `turncheck serve` run as a
// subprocess with its default caps, beside one normal client doing turns.
// What it measures is how many of the normal client's turns succeed, and
// how long they take; it asserts nothing about either (the machine decides
// them), only what no load excuses: the server lives through the flood,
// gives no answer a correct server never gives (a 500, a refusal of a
// well-formed turn, a 200 without its reply), and loses no turn it
// acknowledged. It runs only when -flood gives it a duration.

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
	// wrong counts the answers no correct server gives, however loaded,
	// by what was wrong with them.
	wrong map[string]int
	// acked is, for each conversation, the user tokens of its turns the
	// server acknowledged, in the order it did.
	acked map[string][]model.Token
	// checked and unchecked count the conversations whose acknowledged
	// turns were looked for after the flood, and those whose last turn
	// got no answer in time to look (not exercised, not a failure).
	checked, unchecked int
}

// TestConnFlood: a flood of 20,000 slowloris connections, sending part of a
// head (header) or a head and part of a body (body), each reopened as soon
// as it is closed, beside one normal client: a Go net/http client doing
// turns one after another, alternately streamed and not, with keep-alive
// (keep-alive) or a new connection per turn (fresh); and the client with
// no flood (none), for what the machine's load costs alone. It reports the share
// of the client's turns that succeeded, their p50 and p99, and what
// failed. How many succeed, and how fast, is the machine's to decide and
// never fails the test; what does is what no load excuses: the server
// exits, gives an answer no correct server gives (runFlood's wrong), or,
// once the flood has stopped, shows the model a conversation without a
// turn it acknowledged during the flood.
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
				t.Logf("after the flood: the acknowledged turns of %d conversations looked for, %d not exercised (their last turn got no answer in time)",
					r.checked, r.unchecked)
				if len(r.wrong) > 0 {
					t.Errorf("answers no correct server gives, however loaded: %v", r.wrong)
				}
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
	r.errs, r.wrong, r.acked = map[string]int{}, map[string]int{}, map[string][]model.Token{}
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
	// exited closes when the server exits: under the flood, it must not.
	exited := make(chan struct{})
	go func() { _ = srv.Wait(); close(exited) }()
	defer terminate(srv.Process, exited)
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
	// stopFlood ends the flood and adds its counts: before the checks
	// made once it is over, or as the test ends if it stops before them.
	floodStopped := false
	stopFlood := func() {
		if floodStopped {
			return
		}
		floodStopped = true
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
	}
	defer stopFlood()
	if procs > 0 {
		// Let the flood reach the server's cap before the client starts.
		time.Sleep(2 * time.Second)
	}

	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = !keepAlive
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.CloseIdleConnections()
	for end := time.Now().Add(d); time.Now().Before(end); r.turns++ {
		// A conversation takes 50 turns, well within the server's bound
		// on its length; turn i carries the user token i+1.
		conv, tok := "flood-"+strconv.Itoa(r.turns/50), model.UserToken(r.turns+1)
		start := time.Now()
		outcome, err := floodTurn(client, base, conv, tok, r.turns%2 == 1)
		r.took = append(r.took, time.Since(start))
		switch outcome {
		case turnOK:
			r.ok++
			r.acked[conv] = append(r.acked[conv], tok)
			continue
		case turnWrong:
			r.wrong[err.Error()]++
		}
		r.errs[err.Error()]++
		if len(r.failedAt) < 5 {
			r.failedAt = append(r.failedAt, r.turns)
		}
	}
	r.loadAvg[1] = loadAvg()
	stopFlood()
	select {
	case <-exited:
		t.Fatalf("the server exited under the flood:\n%s", serverLog.String())
	default:
	}
	r.capLogs = strings.Count(serverLog.String(), "connection cap reached")
	r.checked, r.unchecked = checkAcked(t, base, m, r.acked, r.turns+1, r.wrong)
	return r
}

// checkAcked sends, once the flood is over, one more turn on each
// conversation of acked, and checks that the model, called for it, is
// shown every turn the server acknowledged on that conversation during
// the flood, each user message before its reply, in the order they were
// acknowledged (T2). A turn that failed for the client may be there or
// not. The turn is sent again (with a new token) while it fails as a
// loaded server's turn may, a bounded number of times; a conversation
// whose turn never got through is counted as unchecked, not failed. An
// answer no correct server gives is added to wrong. The user tokens of
// these turns start at next.
func checkAcked(t *testing.T, base string, m *faults.Model, acked map[string][]model.Token, next int, wrong map[string]int) (checked, unchecked int) {
	// A connection per turn, so that none is one the server closed as
	// idle; a bound past any the server puts on a turn, so that only a
	// machine slower than that bound leaves a conversation unchecked.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	last := map[string]model.Token{} // the turn that got through, by conversation
	for _, conv := range slices.Sorted(maps.Keys(acked)) {
		for try := 0; try < 10; try++ {
			tok := model.UserToken(next)
			next++
			outcome, err := floodTurn(client, base, conv, tok, false)
			if outcome == turnOK {
				last[conv] = tok
				break
			}
			if outcome == turnWrong {
				wrong["after the flood: "+err.Error()]++
				break
			}
			time.Sleep(time.Second) // as Retry-After: 1 asks
		}
	}
	// What the model was shown for each of those turns.
	shown := map[model.Token][]model.Token{}
	for _, c := range m.CallsAfter(0) {
		shown[c.Turn] = c.History
	}
	for _, conv := range slices.Sorted(maps.Keys(acked)) {
		tok, ok := last[conv]
		if !ok {
			unchecked++
			continue
		}
		checked++
		hist, ok := shown[tok]
		if !ok {
			t.Errorf("%s: the server answered %s with its reply without the model ever shown it", conv, tok)
			continue
		}
		if missing := lostTurn(hist, acked[conv]); missing != "" {
			t.Errorf("%s: a turn acknowledged during the flood is lost: %s; the model was shown %v", conv, missing, hist)
		}
	}
	return checked, unchecked
}

// lostTurn is "" if hist holds each of the user tokens acked and, after
// it, its reply, in the order of acked; else what is missing.
func lostTurn(hist []model.Token, acked []model.Token) string {
	at := 0
	for _, u := range acked {
		for _, tok := range []model.Token{u, u.Reply()} {
			i := slices.Index(hist[at:], tok)
			if i < 0 {
				return fmt.Sprintf("%s, or it comes out of order", tok)
			}
			at += i + 1
		}
	}
	return ""
}

// A turnOutcome is how one turn of the normal client ended.
type turnOutcome int

const (
	// turnOK: the server acknowledged the turn with its reply.
	turnOK turnOutcome = iota
	// turnFailed: the turn failed as a correct server's turn may when
	// the machine is loaded: no answer within the client's time, a
	// connection closed or reset, 408, 503 or another status from 502
	// up, a stream that ended in an error or short of [DONE].
	turnFailed
	// turnWrong: an answer no correct server gives to this well-formed
	// turn, however loaded: 500 or 501, a refusal from 400 to 499 other
	// than 408, a 200 without the turn's reply.
	turnWrong
)

// floodTurn sends the normal client's turn tok on conv (streamed, or
// not) and says how it ended, with why if it did not succeed.
func floodTurn(c *http.Client, base, conv string, tok model.Token, stream bool) (turnOutcome, error) {
	body, err := json.Marshal(map[string]any{"model": "m", "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": string(tok) + " hello"}}})
	if err != nil {
		return turnFailed, err
	}
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return turnFailed, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Conversation-Id", conv)
	resp, err := c.Do(req)
	if err != nil {
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			return turnFailed, errors.New("timeout")
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return turnFailed, errors.New("EOF")
		case errors.Is(err, syscall.ECONNRESET):
			return turnFailed, errors.New("reset")
		}
		return turnFailed, err
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	code := resp.StatusCode
	switch {
	case err != nil:
		return turnFailed, fmt.Errorf("reading the answer: %w", err)
	case code == http.StatusInternalServerError || code == http.StatusNotImplemented ||
		code >= 400 && code < 500 && code != http.StatusRequestTimeout:
		return turnWrong, fmt.Errorf("status %d", code)
	case code != http.StatusOK:
		return turnFailed, fmt.Errorf("status %d", code)
	case stream && bytes.Contains(got, []byte(`"error"`)):
		return turnFailed, errors.New("a stream that ended in an error")
	case stream && !bytes.Contains(got, []byte("data: [DONE]")):
		return turnFailed, errors.New("a stream without [DONE]")
	case !slices.Contains(model.Tokens(string(got)), tok.Reply()):
		return turnWrong, errors.New("a 200 without the turn's reply")
	}
	return turnOK, nil
}

// TestLostTurn: what the flood probe counts as a lost turn, which only a
// flood would otherwise show.
func TestLostTurn(t *testing.T) {
	t.Parallel()
	u := model.UserToken
	acked := []model.Token{u(1), u(3)}
	// A failed turn (2) in between, or a turn sent after, is no loss.
	require.Empty(t, lostTurn([]model.Token{u(1), u(1).Reply(), u(2), u(3), u(3).Reply(), u(9)}, acked))
	require.Empty(t, lostTurn([]model.Token{u(1), u(1).Reply(), u(3), u(3).Reply()}, acked))
	for _, hist := range [][]model.Token{
		{u(1), u(1).Reply(), u(9)},               // turn 3 lost
		{u(1), u(3), u(3).Reply()},               // the reply to turn 1 lost
		{u(3), u(3).Reply(), u(1), u(1).Reply()}, // out of order
		{},
	} {
		require.NotEmpty(t, lostTurn(hist, acked), "%v", hist)
	}
}

// terminate stops a server process with SIGTERM, and SIGKILL if it has not
// exited (exited closed) 20 s later, and returns once it has.
func terminate(p *os.Process, exited <-chan struct{}) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		_ = p.Kill()
		<-exited
	}
}
