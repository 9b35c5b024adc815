//go:build unix

// This file starts servers under test as subprocesses. It is built on unix
// only: it runs every server in a process group of its own
// (syscall.SysProcAttr.Setpgid) so that stopping or killing the server
// reaches the children it started too, and process groups are a unix notion.

package faults

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// MaxProcessOutput bounds what a Process keeps of its server's output
	// (stdout and stderr together): the most recent bytes, so that a chatty
	// server costs bounded memory and a crashing one still leaves its last
	// words for the error message.
	MaxProcessOutput = 64 << 10

	// processErrorTail bounds the output quoted in an error, which is read
	// by a person: the last lines are the ones that say why.
	processErrorTail = 4 << 10

	defaultReady        = "/healthz"
	defaultStartTimeout = 15 * time.Second
	defaultStopGrace    = 5 * time.Second

	// readyPoll is how often readiness is polled. Polling is what decides
	// that a server is up, not any verdict, so a short fixed period is fine.
	readyPoll = 20 * time.Millisecond
	// readyRequestTimeout bounds one readiness probe, so a server that
	// accepts but never answers cannot outlast StartTimeout by much.
	readyRequestTimeout = time.Second
	// startAttempts is how many ports a start tries when the server exits
	// saying its address is in use: the port is free when picked but may be
	// taken by someone else before the server binds it.
	startAttempts = 5
	// drainGrace is how long the output is still read once the server's
	// group is dead. Only a process that left the group (setsid) can hold
	// the pipe open that long; its output is then cut off rather than
	// waited for.
	drainGrace = 2 * time.Second
)

// ProcessConfig says how to start a server under test as a subprocess.
type ProcessConfig struct {
	// Command is the command line template, split into argv and run without
	// a shell: every "{addr}", "{model_url}" and "{data_dir}" in an argument
	// is replaced. {addr} is 127.0.0.1:PORT, a free loopback port picked for
	// each start; a command without {addr} cannot learn its port and so
	// never becomes ready.
	Command []string
	// ModelURL is substituted for {model_url}: the base URL of the model
	// provider the server is to call.
	ModelURL string
	// DataDir is substituted for {data_dir}. The caller owns the directory:
	// it survives stops, kills and restarts, which is what lets a restart
	// test durability.
	DataDir string
	// Env is extra environment, KEY=VALUE, added to the harness's own (a
	// later value of a key wins).
	Env []string
	// Ready is the path polled with GET until it answers with any status
	// below 500; "" means "/healthz". Any HTTP answer counts, a 404 too, so a
	// server without the path is ready as soon as it answers HTTP at all.
	Ready string
	// StartTimeout bounds a start, from exec to ready; 0 means 15s.
	StartTimeout time.Duration
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL; 0
	// means 5s.
	StopGrace time.Duration
}

// Process is one server under test running as a subprocess, in a process
// group of its own, on a loopback port. It keeps the recent output of the
// server (stdout and stderr interleaved) across restarts.
//
// A running server and the two goroutines that drain and reap it live until
// it exits: the caller ends it with Stop or Kill.
//
// A Process is safe for concurrent use. Stop, Kill and Restart are
// serialized: one waits for another to finish (a Kill during a graceful Stop
// waits for the Stop, at most StopGrace). URL, PID and Stderr never wait for
// them.
type Process struct {
	cfg ProcessConfig
	out *ring

	life sync.Mutex // serializes starts, stops and kills
	// cur is the latest run, nil before the first start and after a failed
	// one; once its done is closed it has ended and been reaped. Written
	// under life and mu, read under either.
	cur *run
	// reported is set once cur has been stopped or killed, or its own exit
	// reported by Stop: a later Stop then has nothing to say, which keeps
	// it idempotent.
	reported bool

	mu   sync.Mutex // guards addr and cur for readers outside life
	addr string
}

// run is one exec of the command.
type run struct {
	pid  int
	mark int64         // the output's length when the run started
	done chan struct{} // closed once the run has exited, its group is dead and its output drained
	err  error         // what cmd.Wait returned; read after done
}

// StartProcess starts the server and returns once it answers at
// cfg.Ready. If the server exits first saying its address is in use, it is
// started again on another port, a few times. If it exits for another
// reason, or is not ready within StartTimeout, StartProcess kills its
// process group and returns an error that quotes the tail of its output.
func StartProcess(cfg ProcessConfig) (*Process, error) {
	if len(cfg.Command) == 0 {
		return nil, errors.New("start server: empty command")
	}
	cfg.Command = append([]string(nil), cfg.Command...)
	cfg.Env = append([]string(nil), cfg.Env...)
	if cfg.Ready == "" {
		cfg.Ready = defaultReady
	}
	if !strings.HasPrefix(cfg.Ready, "/") {
		cfg.Ready = "/" + cfg.Ready
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = defaultStartTimeout
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = defaultStopGrace
	}
	p := &Process{cfg: cfg, out: &ring{buf: make([]byte, MaxProcessOutput)}}
	p.life.Lock()
	defer p.life.Unlock()
	if err := p.start(""); err != nil {
		return nil, err
	}
	return p, nil
}

// URL is the server's base URL, http://127.0.0.1:PORT (of the latest start,
// once the server has stopped).
func (p *Process) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return "http://" + p.addr
}

// PID is the process id of the server's latest run, which is also the id of
// its process group; 0 if it never started.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return 0
	}
	return p.cur.pid
}

// Stderr returns the server's most recent output, stdout and stderr
// interleaved as written, across restarts: at most MaxProcessOutput bytes.
// It is meant for error messages.
func (p *Process) Stderr() string { return p.out.tail(0, MaxProcessOutput) }

// Stop stops the server gracefully: SIGTERM to its process group, and
// SIGKILL to the group if the server has not exited within StopGrace. It
// returns once the server has exited, every process left in its group is
// dead and its output is drained. The error reports a server that did not
// stop gracefully: one that needed SIGKILL, exited with a failure status
// after SIGTERM, or had already exited on its own before Stop. Stop is
// idempotent: once the server is down it does nothing and returns nil.
func (p *Process) Stop() error {
	p.life.Lock()
	defer p.life.Unlock()
	return p.stop()
}

func (p *Process) stop() error {
	r := p.cur
	if r == nil || p.reported {
		return nil
	}
	p.reported = true
	select {
	case <-r.done:
		return fmt.Errorf("server had %s on its own before Stop%s", exitString(r.err), p.outputSince(r.mark))
	default:
	}
	if err := syscall.Kill(-r.pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop server: SIGTERM to group %d: %w", r.pid, err)
	}
	grace := time.NewTimer(p.cfg.StopGrace)
	defer grace.Stop()
	select {
	case <-r.done:
		if !cleanAfterTerm(r.err) {
			return fmt.Errorf("server %s after SIGTERM%s", exitString(r.err), p.outputSince(r.mark))
		}
		return nil
	case <-grace.C:
	}
	_ = syscall.Kill(-r.pid, syscall.SIGKILL)
	<-r.done
	return fmt.Errorf("server did not exit within %v of SIGTERM; killed%s", p.cfg.StopGrace, p.outputSince(r.mark))
}

// Kill kills the server's whole process group with SIGKILL, as a crash or
// kill -9 would, and returns once the server has exited and its output is
// drained. It returns nil also when the server is already down.
func (p *Process) Kill() error {
	p.life.Lock()
	defer p.life.Unlock()
	return p.kill()
}

func (p *Process) kill() error {
	r := p.cur
	if r == nil {
		return nil
	}
	p.reported = true
	select {
	case <-r.done:
		return nil // reaped already: its group id may belong to someone else now
	default:
	}
	if err := syscall.Kill(-r.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill server: SIGKILL to group %d: %w", r.pid, err)
	}
	<-r.done
	return nil
}

// Restart starts the server again with the same configuration and data
// directory, and returns once it is ready. A server still running is first
// stopped gracefully; an error of that stop is returned (joined with any
// start error) but does not prevent the start. The new run tries the old
// port first, so URL usually stays the same, and moves to another port if
// that one has been taken meanwhile.
func (p *Process) Restart() error {
	p.life.Lock()
	defer p.life.Unlock()
	stopErr := p.stop()
	p.mu.Lock()
	addr := p.addr
	p.mu.Unlock()
	return errors.Join(stopErr, p.start(addr))
}

// start runs the command until it is ready, trying first on addr if it is
// not "", then on fresh ports. Called with life held.
func (p *Process) start(addr string) error {
	var last error
	for attempt := 0; attempt < startAttempts; attempt++ {
		if addr == "" || attempt > 0 {
			a, err := freeLoopbackAddr()
			if err != nil {
				return fmt.Errorf("start server: pick a port: %w", err)
			}
			addr = a
		}
		inUse, err := p.startOn(addr)
		if err == nil {
			return nil
		}
		if !inUse {
			return err
		}
		last = err
	}
	return fmt.Errorf("start server: address in use on %d ports in a row; the last: %w", startAttempts, last)
}

// startOn runs the command once, listening on addr, and waits until it is
// ready. On failure the run is dead and reaped; inUse says that it exited
// with output suggesting the address was taken, so another port may do.
func (p *Process) startOn(addr string) (inUse bool, err error) {
	argv := make([]string, len(p.cfg.Command))
	repl := strings.NewReplacer("{addr}", addr, "{model_url}", p.cfg.ModelURL, "{data_dir}", p.cfg.DataDir)
	for i, a := range p.cfg.Command {
		argv[i] = repl.Replace(a)
	}
	r, err := p.exec(argv)
	if err != nil {
		return false, err
	}
	p.mu.Lock()
	p.addr = addr
	p.cur = r
	p.reported = false
	p.mu.Unlock()

	err = waitReady(r, "http://"+addr+p.cfg.Ready, p.cfg.StartTimeout)
	if err == nil {
		return false, nil
	}
	var exited bool
	select {
	case <-r.done:
		exited = true
	default:
		_ = syscall.Kill(-r.pid, syscall.SIGKILL)
		<-r.done
	}
	p.mu.Lock()
	p.cur = nil
	p.mu.Unlock()
	out := p.out.tail(r.mark, processErrorTail)
	if exited {
		return suggestsInUse(out), fmt.Errorf("server %q on %s %s before it was ready%s", argv[0], addr, exitString(r.err), quote(out))
	}
	return false, fmt.Errorf("server %q on %s: %w%s", argv[0], addr, err, quote(out))
}

// exec starts argv in a process group of its own, its stdout and stderr on
// one pipe that is drained into the output ring, and a goroutine that reaps
// it. Both goroutines have ended when the run's done is closed.
func (p *Process) exec(argv []string) (*run, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), p.cfg.Env...)
	// Files, not writers: exec then copies nothing itself, so Wait returns
	// when the server exits, not when the last holder of the pipe does.
	cmd.Stdout = pw
	cmd.Stderr = pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	mark := p.out.len()
	if err := cmd.Start(); err != nil {
		_ = pr.Close()
		_ = pw.Close()
		return nil, fmt.Errorf("start server %q: %w", argv[0], err)
	}
	_ = pw.Close() // the children hold it now; EOF once they all let go
	r := &run{pid: cmd.Process.Pid, mark: mark, done: make(chan struct{})}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		_, _ = io.Copy(p.out, pr)
	}()
	go func() {
		r.err = cmd.Wait()
		// The leader is gone: whatever it left in its group goes too, so
		// that no server process outlives its run. The group id cannot have
		// been reused while members remain.
		_ = syscall.Kill(-r.pid, syscall.SIGKILL)
		t := time.NewTimer(drainGrace)
		select {
		case <-drained:
		case <-t.C:
		}
		t.Stop()
		_ = pr.Close() // unblocks the copy if a process outside the group holds the pipe
		<-drained
		close(r.done)
	}()
	return r, nil
}

// waitReady polls url until it answers with a status below 500, the run
// exits, or timeout passes.
func waitReady(r *run, url string, timeout time.Duration) error {
	tr := &http.Transport{DisableKeepAlives: true} // no proxy: loopback only
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("not ready within %v (GET %s)", timeout, url)
		}
		client.Timeout = min(left, readyRequestTimeout)
		if resp, err := client.Get(url); err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			_ = resp.Body.Close()
			if resp.StatusCode < 500 {
				return nil
			}
		}
		select {
		case <-r.done:
			return errors.New("exited before it was ready")
		case <-tick.C:
		}
	}
}

// freeLoopbackAddr picks a port that is free now. Another process may take
// it before the server binds it; start then tries another.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// suggestsInUse reports whether a server's output says that its address
// was taken, in the words of the common runtimes.
func suggestsInUse(out string) bool {
	out = strings.ToLower(out)
	for _, s := range []string{"address already in use", "eaddrinuse", "address in use", "only one usage of each socket address"} {
		if strings.Contains(out, s) {
			return true
		}
	}
	return false
}

// cleanAfterTerm reports whether an exit after SIGTERM is a graceful one:
// status 0, death by the SIGTERM itself, or 143 (128+15, how shells and
// several runtimes report it).
func cleanAfterTerm(err error) bool {
	if err == nil {
		return true
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok {
		return false
	}
	return (ws.Signaled() && ws.Signal() == syscall.SIGTERM) || (ws.Exited() && ws.ExitStatus() == 128+int(syscall.SIGTERM))
}

// exitString says how a run ended: "exited with status 2", "died of
// signal killed".
func exitString(err error) string {
	var ee *exec.ExitError
	if err == nil {
		return "exited with status 0"
	}
	if !errors.As(err, &ee) {
		return "ended: " + err.Error()
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "died of signal " + ws.Signal().String()
	}
	return "exited with status " + strconv.Itoa(ee.ExitCode())
}

// outputSince quotes the tail of the output written since mark.
func (p *Process) outputSince(mark int64) string { return quote(p.out.tail(mark, processErrorTail)) }

// quote formats output for the end of an error message.
func quote(out string) string {
	out = strings.TrimRight(out, "\n")
	if out == "" {
		return " (no output)"
	}
	return "; its output ends:\n" + out
}

// ring keeps the last len(buf) bytes written to it. Safe for concurrent
// use.
type ring struct {
	mu    sync.Mutex
	buf   []byte
	total int64 // bytes ever written; the next byte goes to buf[total%len(buf)]
}

// Write keeps the tail of b; it never fails or blocks on a reader, which
// is what keeps the server's pipe drained.
func (r *ring) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(b)
	size := int64(len(r.buf))
	if int64(len(b)) > size {
		r.total += int64(len(b)) - size
		b = b[len(b)-int(size):]
	}
	for len(b) > 0 {
		c := copy(r.buf[r.total%size:], b)
		r.total += int64(c)
		b = b[c:]
	}
	return n, nil
}

// len is how many bytes were ever written.
func (r *ring) len() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

// tail returns the last at most max bytes of what was written after the
// first mark bytes, as far as the ring still holds them.
func (r *ring) tail(mark int64, max int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	size := int64(len(r.buf))
	n := min(r.total-mark, size, int64(max))
	if n <= 0 {
		return ""
	}
	var b bytes.Buffer
	b.Grow(int(n))
	start := (r.total - n) % size
	if end := start + n; end <= size {
		b.Write(r.buf[start:end])
	} else {
		b.Write(r.buf[start:])
		b.Write(r.buf[:end-size])
	}
	return b.String()
}

// String names the server for logs: its command template and URL.
func (p *Process) String() string {
	return "server " + strconv.Quote(strings.Join(p.cfg.Command, " ")) + " at " + p.URL()
}
