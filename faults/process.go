//go:build unix

// This file starts servers under test as subprocesses. It is built on unix
// only: it runs every server in a process group of its own
// (syscall.SysProcAttr.Setpgid) so that stopping or killing the server
// reaches the children it started too, and process groups are a unix notion.

package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/turncheck/turncheck/internal/loopback"
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
	// maxReadyLine bounds the part of a line of output that ReadyLine is
	// matched against, and so what a Process buffers to find it: a line
	// longer than this is matched on its first maxReadyLine bytes.
	maxReadyLine = 4 << 10
	// captureListen and capturePort are what {addr} and {port} stand for
	// when ReadyLine captures the address: port 0, so that the server
	// picks a free port itself and no other process can take it first.
	captureListen = "127.0.0.1:0"
	capturePort   = "0"
	// drainGrace is how long the output is still read once the server's
	// group is dead. Only a process that left the group (setsid) can hold
	// the pipe open that long; its output is then cut off rather than
	// waited for.
	drainGrace = 2 * time.Second
)

// ProcessConfig says how to start a server under test as a subprocess.
type ProcessConfig struct {
	// Command is the command line template, split into argv and run without
	// a shell: every "{addr}", "{port}", "{model_url}" and "{data_dir}" in an
	// argument is replaced, and an argument with "{agents}" is repeated per
	// agent (see Agents). {addr} is 127.0.0.1:PORT, a free loopback port
	// picked for each start, and {port} is that PORT alone (41237), for a
	// server that takes its port apart from its host. A command with neither
	// cannot learn its port and so never becomes ready, unless ReadyLine
	// captures the address the server picked itself.
	Command []string
	// ModelURL is substituted for {model_url}: the base URL of the model
	// provider the server is to call.
	ModelURL string
	// DataDir is substituted for {data_dir}. The caller owns the directory:
	// it survives stops, kills and restarts, which is what lets a restart
	// test durability.
	DataDir string
	// Agents are the agent references (URLs or files, see "Agent sources"
	// in PROTOCOL.md) the server loads at start-up. An argument of Command
	// that contains "{agents}" is repeated once per reference, with
	// {agents} replaced by it, and dropped when there are none: with two
	// agents "--agent={agents}" becomes "--agent=R1" "--agent=R2". Write the
	// flag and the placeholder as that one argument: a separate "--agent"
	// "{agents}" pair repeats only the "{agents}" argument, which gives
	// "--agent" "R1" "R2" (R2 a stray positional argument), and with no
	// agents leaves "--agent" to swallow the argument after it. The other
	// placeholders are replaced in the same argument; a reference itself is
	// taken literally. SetAgents changes the references for the next
	// Restart.
	Agents []string
	// Env is extra environment, KEY=VALUE, added to the harness's own (a
	// later value of a key wins). {addr}, {port}, {model_url} and
	// {data_dir} in a value are replaced as in Command: many servers take
	// their model's base URL from the environment (OPENAI_BASE_URL).
	Env []string
	// Files are written into DataDir before every start, a restart's too:
	// each maps a path relative to DataDir to a template, whose {addr},
	// {port}, {model_url} and {data_dir} are replaced as in Command. A
	// server that reads its model's base URL only from a config file
	// (an agent YAML, a JSON config) then needs no wrapper script to
	// write one. Paths must stay inside DataDir (CheckFilePath).
	Files map[string]string
	// Ready is the path polled with GET until it answers with any status
	// below 500; "" means "/healthz". Any HTTP answer counts, a 404 too, so a
	// server without the path is ready as soon as it answers HTTP at all.
	// Ignored when ReadyLine is set.
	Ready string
	// ReadyLine, when set, replaces the HTTP probe of Ready: it is a Go
	// regular expression (regexp syntax) matched against each line of the
	// server's output, stdout and stderr together, and the server is ready
	// once a line written by this run matches (a line of an earlier run of
	// the same Process, still in Stderr, does not count). A line is matched
	// without its "\n" or "\r\n", and a line longer than 4 KiB on its first
	// 4 KiB only, which bounds what is buffered. It suits a server that
	// says when it is up but has no path to poll, or that picks its own
	// port.
	//
	// Without a capture group the line only signals readiness: {addr} and
	// {port} are a free port as without ReadyLine. With one, the text of
	// the first group is the address the server listens on, as
	// "host:port", ":port" (meaning 127.0.0.1) or "http://host:port"; the
	// host must be a loopback address or "localhost". {addr} then stands
	// for "127.0.0.1:0" and {port} for "0", so that the server binds a port
	// of its own choosing, which no other process can take between a pick
	// and the bind, and URL reports the captured address, which may change
	// on Restart. "listening on (http://\S+)" reads the reference server's
	// line. Use (?:...) for a group that is not the address. An address
	// that is not a loopback one, or port 0 (the server printed what it was
	// told, not what it bound), fails the start.
	ReadyLine string
	// StartTimeout bounds a start, from exec to ready (by either probe); 0
	// means 15s.
	StartTimeout time.Duration
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL; 0
	// means 5s.
	StopGrace time.Duration
	// StopStatus are exit statuses the server gives on SIGTERM as its
	// ordinary stop (docker-agent exits 1): Stop reads them as a tidy
	// exit, as it does 0, death by the signal, and 143.
	StopStatus []int
	// Handshake, if set, makes the server one that speaks over its stdin
	// and stdout (an ACP agent) rather than on a port: stdout is then a
	// pipe of its own, apart from stderr, and the server is ready once
	// Handshake, called with each run's pipes, returns nil (Ready and
	// ReadyLine are ignored). It is bounded by StartTimeout, and by the
	// run's exit. The pipes stay the handshake's for the whole run: it
	// keeps them, and the harness closes them once the run has ended.
	Handshake func(ctx context.Context, run StdioRun) error
	// Started, if set, is called with the command line of each run once
	// it is ready, the first and every restart's: its placeholders
	// filled, what was actually run (not a try on a port that was taken),
	// for a person to read or run again. It is called while the Process
	// starts the run: it must not call the Process back.
	Started func(argv []string)
	// Context, if set, bounds every wait for the server to be ready, the
	// first start's and each Restart's: once it ends, a start still
	// waiting kills its run and returns an error that wraps the
	// context's. A run's time bound then holds through a restart in
	// flight on a server that takes long to start.
	Context context.Context
}

// StdioRun is one run of a server that speaks over its stdin and stdout
// (ProcessConfig.Handshake).
type StdioRun struct {
	// In is the run's stdin. A write to it may block while the server
	// does not read: a caller that must never block queues its writes.
	In io.Writer
	// Out is the run's stdout; it ends (io.EOF) once the run has ended.
	Out io.Reader
	// Log keeps lines in the server's output (Stderr), beside what it
	// writes to stderr: what the caller found on Out that was not for it.
	Log io.Writer
	// Exited is closed once the run has ended.
	Exited <-chan struct{}
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
// them, and neither do SetAgents and Exited.
type Process struct {
	cfg ProcessConfig
	out *ring
	// readyLine is cfg.ReadyLine compiled, nil for the HTTP probe; capture
	// says that it has a group that captures the address.
	readyLine *regexp.Regexp
	capture   bool

	life sync.Mutex // serializes starts, stops and kills
	// cur is the latest run, nil before the first start and after a failed
	// one; once its done is closed it has ended and been reaped. Written
	// under life and mu, read under either.
	cur *run
	// last is the latest run that started, kept after a failed start
	// that followed it: what String names.
	last *run
	// reported is set once cur has been stopped or killed, or its own exit
	// reported by Stop: a later Stop then has nothing to say, which keeps
	// it idempotent.
	reported bool

	mu   sync.Mutex // guards addr, agents and cur for readers outside life
	addr string
	// agents are the references the next start substitutes for {agents}:
	// cfg.Agents until SetAgents replaces them. Never modified in place.
	agents []string
}

// run is one exec of the command.
type run struct {
	pid   int
	mark  int64         // the output's length when the run started
	done  chan struct{} // closed once the run has exited, its group is dead and its output drained
	err   error         // what cmd.Wait returned; read after done
	watch *lineWatch    // finds the ReadyLine in this run's output; nil for the HTTP probe
	// stdio is the run's stdin and stdout, for a Handshake; nil otherwise.
	stdio *StdioRun
	// argv is the command line the run was started with, placeholders
	// filled.
	argv []string
}

// StartProcess starts the server and returns once it answers at
// cfg.Ready, or has written a line matching cfg.ReadyLine. If the server
// exits first saying its address is in use, it is started again on another
// port, a few times (not when ReadyLine captures the address: the server
// picks the port then). If it exits for another reason, is not ready within
// StartTimeout, or captures an address that is not a loopback one,
// StartProcess kills its process group and returns an error that quotes
// the tail of its output: a *StartError where the server is to blame
// (it exited, or was not ready in time). A ReadyLine that is not a valid
// regular expression is an error before anything runs.
func StartProcess(cfg ProcessConfig) (*Process, error) {
	if len(cfg.Command) == 0 {
		return nil, errors.New("start server: empty command")
	}
	cfg.Command = append([]string(nil), cfg.Command...)
	cfg.Env = append([]string(nil), cfg.Env...)
	cfg.Agents = append([]string(nil), cfg.Agents...)
	var readyLine *regexp.Regexp
	if cfg.ReadyLine != "" {
		re, err := regexp.Compile(cfg.ReadyLine)
		if err != nil {
			return nil, fmt.Errorf("start server: ReadyLine: %w", err)
		}
		readyLine = re
	}
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
	p := &Process{
		cfg:       cfg,
		out:       &ring{buf: make([]byte, MaxProcessOutput)},
		readyLine: readyLine,
		capture:   readyLine != nil && readyLine.NumSubexp() > 0,
		agents:    cfg.Agents,
	}
	p.life.Lock()
	defer p.life.Unlock()
	if err := p.start(context.Background(), ""); err != nil {
		return nil, err
	}
	return p, nil
}

// URL is the server's base URL, http://127.0.0.1:PORT, or http:// and the
// address ReadyLine captured (of the latest start, once the server has
// stopped).
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

// Exited returns a channel that is closed once the current run of the
// server has ended, whether it exited on its own, crashed, or was stopped
// or killed, and its output has been drained (so Stderr then holds its
// last words). It lets a harness notice a server that died mid-run rather
// than blame the next failed request on something else. Each run has its
// own channel: after a Restart, Exited returns the new run's, and one got
// before it stays closed, so a caller that watches across restarts asks
// again after each. After a failed Restart there is no current run and the
// channel returned is already closed.
func (p *Process) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur == nil {
		return closedChan
	}
	return p.cur.done
}

// Ended says how the current run of the server ended once Exited is
// closed ("exited with status 2", "died of signal killed"), "" while it
// runs or when no run is current: a harness quotes it beside the
// server's last words.
func (p *Process) Ended() string {
	p.mu.Lock()
	r := p.cur
	p.mu.Unlock()
	if r == nil {
		return ""
	}
	select {
	case <-r.done:
		return exitString(r.err)
	default:
		return ""
	}
}

// closedChan is what Exited returns when no run is current.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// SetAgents replaces the agent references substituted for {agents} (see
// ProcessConfig.Agents) from the next start on: a running server keeps the
// ones it was started with until Restart. This is how a test restarts a
// server with a changed query on an agent's source. refs is copied; nil or
// empty means no agents.
func (p *Process) SetAgents(refs []string) {
	refs = append([]string(nil), refs...)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.agents = refs
}

// Stderr returns the server's most recent output, stdout and stderr
// interleaved as written, across restarts: at most MaxProcessOutput bytes.
// It is meant for error messages.
func (p *Process) Stderr() string { return p.out.tail(0, MaxProcessOutput) }

// Stop stops the server gracefully: SIGTERM to its process group, and
// SIGKILL to the group if the server has not exited within StopGrace. It
// returns once the server has exited, every process left in its group is
// dead and its output is drained. The error reports a server that did not
// stop gracefully: a *StopError for one that exited with a failure status
// after SIGTERM or needed SIGKILL (it is down, and what it served stands),
// another error for one that had already exited on its own before Stop
// or could not be signalled. Stop is idempotent: once the server is down
// it does nothing and returns nil.
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
		if !cleanAfterTerm(r.err, p.cfg.StopStatus) {
			return &StopError{msg: fmt.Sprintf("server %s after SIGTERM%s", exitString(r.err), p.outputSince(r.mark))}
		}
		return nil
	case <-grace.C:
	}
	_ = syscall.Kill(-r.pid, syscall.SIGKILL)
	<-r.done
	// Killed, it is down all the same: a StopError, as an untidy exit is.
	return &StopError{msg: fmt.Sprintf("server did not exit within %v of SIGTERM; killed%s", p.cfg.StopGrace, p.outputSince(r.mark))}
}

// StopError is Stop's error for a server that was asked to stop and is
// down, but not tidily: it exited on SIGTERM with a failure status, or
// it outlived StopGrace and was killed. What it served before stands; a
// harness reports this beside its verdicts, not instead of them.
type StopError struct{ msg string }

func (e *StopError) Error() string { return e.msg }

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
// directory, and the agents of the latest SetAgents, and returns once it is
// ready. A server still running is first stopped gracefully; an error of
// that stop is returned (joined with any start error) but does not prevent
// the start. The new run tries the old port first, so URL usually stays
// the same, and moves to another port if that one has been taken
// meanwhile; when ReadyLine captures the address, the server picks its
// port afresh and URL follows it.
func (p *Process) Restart() error { return p.RestartContext(context.Background()) }

// RestartContext is Restart, with ctx bounding the wait for the new run to
// be ready, as Context does: a shrinker's replay bounded by its own time
// cuts short a restart in it.
func (p *Process) RestartContext(ctx context.Context) error {
	p.life.Lock()
	defer p.life.Unlock()
	stopErr := p.stop()
	p.mu.Lock()
	addr := p.addr
	p.mu.Unlock()
	return errors.Join(stopErr, p.start(ctx, addr))
}

// start runs the command until it is ready, trying first on addr if it is
// not "", then on fresh ports. When ReadyLine captures the address, it runs
// the command once on port 0 instead: the server binds a port of its own
// choosing, so a port taken by someone else is not the server's to retry.
// ctx, and the configuration's Context, bound the waits for readiness.
// Called with life held.
func (p *Process) start(ctx context.Context, addr string) error {
	if p.cfg.Context != nil {
		var stop func() bool
		ctx, stop = bothContexts(ctx, p.cfg.Context)
		defer stop()
	}
	if p.capture {
		_, err := p.startOn(ctx, captureListen)
		return err
	}
	var last error
	for attempt := 0; attempt < startAttempts; attempt++ {
		if addr == "" || attempt > 0 {
			a, err := loopback.FreeAddr()
			if err != nil {
				return fmt.Errorf("start server: pick a port: %w", err)
			}
			addr = a
		}
		inUse, err := p.startOn(ctx, addr)
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
func (p *Process) startOn(ctx context.Context, addr string) (inUse bool, err error) {
	p.mu.Lock()
	agents := p.agents
	p.mu.Unlock()
	argv := expandCommand(p.cfg.Command, agents, addr, p.cfg.ModelURL, p.cfg.DataDir)
	env := expandCommand(p.cfg.Env, nil, addr, p.cfg.ModelURL, p.cfg.DataDir)
	if len(argv) == 0 {
		return false, errors.New("start server: the command is empty once {agents} is expanded with no agents")
	}
	if err := p.writeFiles(addr); err != nil {
		return false, err
	}
	r, err := p.exec(argv, env)
	if err != nil {
		return false, err
	}
	p.mu.Lock()
	if !p.capture {
		p.addr = addr
	}
	p.cur, p.last = r, r
	p.reported = false
	p.mu.Unlock()

	// badCapture says the start failed on the address the ready line
	// captured: the pattern's doing, or the server's listening off
	// loopback, never a server that did not get ready.
	badCapture := false
	if p.cfg.Handshake != nil {
		err = handshake(ctx, r, p.cfg.Handshake, p.cfg.StartTimeout)
	} else if r.watch != nil {
		var line, captured string
		line, captured, err = waitLine(ctx, r, p.cfg.ReadyLine, p.cfg.StartTimeout)
		if err == nil && p.capture {
			var got string
			if got, err = capturedAddr(captured); err != nil {
				badCapture = true
				err = fmt.Errorf("the address captured from the line %q: %w", line, err)
			} else {
				p.mu.Lock()
				p.addr = got
				p.mu.Unlock()
			}
		}
	} else {
		err = waitReady(ctx, r, "http://"+addr+p.cfg.Ready, p.cfg.StartTimeout)
	}
	if err == nil {
		if p.cfg.Started != nil {
			p.cfg.Started(slices.Clone(argv))
		}
		return false, nil
	}
	select {
	case <-r.done: // reaped already: its group id may belong to someone else now
	default:
		_ = syscall.Kill(-r.pid, syscall.SIGKILL)
		<-r.done
	}
	// No current run: a start that failed is no exit of a server that
	// ran (Exited, Ended).
	p.mu.Lock()
	p.cur = nil
	p.mu.Unlock()
	if ctx.Err() != nil {
		// What the server wrote as it was stopped mid-start ("context
		// canceled", say) is the harness's doing: said so where its last
		// output is quoted.
		_, _ = fmt.Fprintf(p.out, "[turncheck: the start above was cut short by the harness (%v): its last lines are no fault of the server's]\n", context.Cause(ctx))
	}
	out := p.out.tail(r.mark, processErrorTail)
	if p.cfg.Handshake != nil && errors.Is(err, errExited) {
		return false, &StartError{msg: fmt.Sprintf("server %q %s before it answered the handshake%s", argv[0], exitString(r.err), quote(out)), Output: out}
	}
	if errors.Is(err, errExited) {
		return suggestsInUse(out), &StartError{msg: fmt.Sprintf("server %q on %s %s before it was ready%s", argv[0], addr, exitString(r.err), quote(out)), Output: out}
	}
	err = fmt.Errorf("server %q on %s: %w%s", argv[0], addr, err, quote(out))
	if badCapture || ctx.Err() != nil {
		return false, err
	}
	// Not ready within StartTimeout, or a handshake the server failed.
	return false, &StartError{msg: err.Error(), Output: out, err: err}
}

// StartError is the error of a start whose server ran but did not get
// ready: it exited first, its ready probe (the HTTP path, the ready line,
// the handshake) did not succeed within StartTimeout, or it failed its
// handshake. The server is to blame: a harness may try the start again,
// and judge a server that never gets ready. Any other error of a start
// is not the server's: a command that could not be run, a file that
// could not be written, a ready line whose capture is no loopback
// address, a wait the context cut short.
type StartError struct {
	msg string
	err error
	// Output is the tail of what the run wrote, its last words: why it
	// did not get ready, most often.
	Output string
}

// Error says how the start failed, with the tail of the server's output.
func (e *StartError) Error() string { return e.msg }

// Unwrap is the wait's own error, for a start that was not ready in
// time or failed its handshake; nil for one that exited first.
func (e *StartError) Unwrap() error { return e.err }

// exec starts argv in a process group of its own, its stdout and stderr on
// one pipe that is drained into the output ring, and a goroutine that reaps
// it. Both goroutines have ended when the run's done is closed.
func (p *Process) exec(argv, env []string) (*run, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	// Files, not writers: exec then copies nothing itself, so Wait returns
	// when the server exits, not when the last holder of the pipe does.
	cmd.Stdout = pw
	cmd.Stderr = pw
	var stdio stdioPipes
	if p.cfg.Handshake != nil {
		if stdio, err = newStdioPipes(); err != nil {
			_ = pr.Close()
			_ = pw.Close()
			return nil, fmt.Errorf("start server: %w", err)
		}
		cmd.Stdin, cmd.Stdout = stdio.inR, stdio.outW
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	mark := p.out.len()
	if err := cmd.Start(); err != nil {
		_ = pr.Close()
		_ = pw.Close()
		stdio.closeAll()
		return nil, fmt.Errorf("start server %q: %w", argv[0], err)
	}
	_ = pw.Close() // the children hold it now; EOF once they all let go
	stdio.started()
	r := &run{pid: cmd.Process.Pid, mark: mark, done: make(chan struct{}), argv: argv}
	if stdio.outR != nil {
		r.stdio = &StdioRun{In: stdio.inW, Out: closingReader{stdio.outR}, Log: p.out, Exited: r.done}
	}
	var out io.Writer = p.out
	if p.readyLine != nil {
		r.watch = newLineWatch(p.readyLine, p.capture)
		out = teeLines{ring: p.out, watch: r.watch}
	}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		_, _ = io.Copy(out, pr)
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
		// Whoever holds the run's stdio sees it end: a write fails, and
		// a read ends once what the run wrote is read (at most
		// drainGrace more, for a process that left the group).
		stdio.ended(drainGrace)
		close(r.done)
	}()
	return r, nil
}

// stdioPipes are a run's stdin and stdout for a Handshake: all nil for a
// server that speaks on a port.
type stdioPipes struct {
	inR, inW, outR, outW *os.File
}

// newStdioPipes makes a run's stdin and stdout pipes.
func newStdioPipes() (stdioPipes, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return stdioPipes{}, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		_ = inR.Close()
		_ = inW.Close()
		return stdioPipes{}, err
	}
	return stdioPipes{inR: inR, inW: inW, outR: outR, outW: outW}, nil
}

// started closes the ends the children hold now: a read of stdout then
// ends once they all let go.
func (s stdioPipes) started() {
	if s.inR != nil {
		_ = s.inR.Close()
		_ = s.outW.Close()
	}
}

// closeAll closes every end, for a start that failed.
func (s stdioPipes) closeAll() {
	for _, f := range []*os.File{s.inR, s.inW, s.outR, s.outW} {
		if f != nil {
			_ = f.Close()
		}
	}
}

// ended closes the harness's ends once the run's group is dead: stdin at
// once (a write then fails rather than blocks), stdout after grace,
// which leaves what the run wrote to be read, and cuts off a process
// that left the group and holds the pipe.
func (s stdioPipes) ended(grace time.Duration) {
	if s.inW == nil {
		return
	}
	_ = s.inW.Close()
	_ = s.outR.SetReadDeadline(time.Now().Add(grace))
}

// closingReader closes its file once a read of it fails (io.EOF, or the
// deadline ended set): nothing more can come of it.
type closingReader struct{ f *os.File }

func (c closingReader) Read(b []byte) (int, error) {
	n, err := c.f.Read(b)
	if err != nil {
		_ = c.f.Close()
	}
	return n, err
}

// handshake waits until h, given the run's pipes, says the server is
// ready, the run exits, timeout passes, or ctx ends.
func handshake(ctx context.Context, r *run, h func(context.Context, StdioRun) error, timeout time.Duration) error {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("no answer to the handshake within %v", timeout))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- h(ctx, *r.stdio) }()
	select {
	case err := <-done:
		if err != nil {
			select {
			case <-r.done:
				return errExited
			default:
			}
		}
		return err // the handshake's own words, the timeout's among them
	case <-r.done:
		cancel()
		<-done
		return errExited
	}
}

// bothContexts is ctx, ended also when other ends (with other's cause);
// stop releases what ties them.
func bothContexts(ctx, other context.Context) (context.Context, func() bool) {
	both, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(other, func() { cancel(context.Cause(other)) })
	return both, func() bool { cancel(nil); return stop() }
}

// errExited is what a wait for readiness returns when the run exits first;
// startOn then reports how it exited instead.
var errExited = errors.New("exited before it was ready")

// waitReady polls url until it answers with a status below 500, the run
// exits, timeout passes, or ctx ends.
func waitReady(ctx context.Context, r *run, url string, timeout time.Duration) error {
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
			return errExited
		case <-ctx.Done():
			return fmt.Errorf("not waited for any longer: %w", context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// waitLine waits until the run writes a line that matches its ReadyLine
// expr, the run exits, timeout passes, or ctx ends. It
// returns the line and the text of the expression's first group in it.
func waitLine(ctx context.Context, r *run, expr string, timeout time.Duration) (line, captured string, err error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return "", "", fmt.Errorf("not waited for any longer: %w", context.Cause(ctx))
	case <-r.watch.seen:
		return r.watch.line, r.watch.captured, nil
	case <-r.done:
		// The output is drained before done is closed: a line the run
		// wrote before it exited has been seen by now, and counts.
		select {
		case <-r.watch.seen:
			return r.watch.line, r.watch.captured, nil
		default:
			return "", "", errExited
		}
	case <-t.C:
		return "", "", fmt.Errorf("no line of output matched %q within %v", expr, timeout)
	}
}

// writeFiles writes cfg.Files into the data dir for a start on addr.
func (p *Process) writeFiles(addr string) error {
	for _, name := range slices.Sorted(maps.Keys(p.cfg.Files)) {
		if err := CheckFilePath(name); err != nil {
			return fmt.Errorf("start server: file %q: %w", name, err)
		}
		text := expandCommand([]string{p.cfg.Files[name]}, nil, addr, p.cfg.ModelURL, p.cfg.DataDir)[0]
		dst := filepath.Join(p.cfg.DataDir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return fmt.Errorf("start server: %w", err)
		}
		if err := os.WriteFile(dst, []byte(text), 0o600); err != nil {
			return fmt.Errorf("start server: %w", err)
		}
	}
	return nil
}

// CheckFilePath says what is wrong with name as the path of a file
// written into a server's data dir, nil if nothing: it must be relative,
// with forward slashes, and stay inside the directory.
func CheckFilePath(name string) error {
	switch {
	case name == "":
		return errors.New("empty path")
	case path.IsAbs(name) || filepath.IsAbs(name) || strings.Contains(name, `\`):
		return errors.New("want a path relative to the data dir, with / between its parts")
	case !filepath.IsLocal(filepath.FromSlash(name)):
		return errors.New("the path leaves the data dir")
	}
	return nil
}

// expandCommand fills in the command template: {agents} repeats its
// argument once per agent reference, and the other placeholders are
// replaced where they stand. Each argument is replaced in one pass, so a
// value that happens to contain a placeholder (a reference with "{addr}" in
// its query, say) is left as it is.
func expandCommand(tmpl, agents []string, addr, modelURL, dataDir string) []string {
	port := capturePort
	if _, p, err := net.SplitHostPort(addr); err == nil {
		port = p
	}
	pairs := []string{"{addr}", addr, "{port}", port, "{model_url}", modelURL, "{data_dir}", dataDir}
	repl := strings.NewReplacer(pairs...)
	argv := make([]string, 0, len(tmpl))
	for _, a := range tmpl {
		if !strings.Contains(a, "{agents}") {
			argv = append(argv, repl.Replace(a))
			continue
		}
		for _, ref := range agents {
			argv = append(argv, strings.NewReplacer(append(pairs, "{agents}", ref)...).Replace(a))
		}
	}
	return argv
}

// capturedAddr checks the address ReadyLine captured and returns it as
// host:port: "host:port", ":port" (127.0.0.1) or "http://host:port", with
// a loopback host and a port that is not 0. The harness speaks to the
// server on loopback only, so another host is refused rather than called.
func capturedAddr(s string) (string, error) {
	hostport := s
	if rest, ok := strings.CutPrefix(s, "http://"); ok {
		hostport = strings.TrimSuffix(rest, "/")
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", fmt.Errorf("%q is not host:port, :port or http://host:port", s)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	switch {
	case err != nil:
		return "", fmt.Errorf("%q: its port %q is not a number; the ready line's pattern must capture the address alone, "+
			"host:port, :port or http://host:port, with nothing around it (a pattern such as ([0-9.]+:[0-9]+) does)", s, port)
	case n == 0:
		return "", fmt.Errorf("%q has port 0 (the server may have printed the address it was given, not the one it bound)", s)
	}
	switch {
	case host == "":
		host = "127.0.0.1"
	case strings.EqualFold(host, "localhost"):
	default:
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			return "", fmt.Errorf("%q is not a loopback address", s)
		}
	}
	return net.JoinHostPort(host, port), nil
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
// several runtimes report it), or a status of also (the server's own,
// ProcessConfig.StopStatus).
func cleanAfterTerm(err error, also []int) bool {
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
	return (ws.Signaled() && ws.Signal() == syscall.SIGTERM) ||
		(ws.Exited() && (ws.ExitStatus() == 128+int(syscall.SIGTERM) || slices.Contains(also, ws.ExitStatus())))
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

// lineWatch finds the first line of a run's output that matches ReadyLine.
// It is written to by the run's drain goroutine only, so its buffer needs
// no lock; what it found is published by closing seen.
type lineWatch struct {
	re      *regexp.Regexp
	capture bool
	buf     []byte // the current line so far, at most maxReadyLine bytes
	full    bool   // the current line has been matched on its first maxReadyLine bytes; the rest is skipped
	found   bool   // a line matched: nothing more is scanned
	seen    chan struct{}

	// line and captured are the matching line and the text of the
	// expression's first group in it; written before seen is closed and
	// read after.
	line, captured string
}

func newLineWatch(re *regexp.Regexp, capture bool) *lineWatch {
	return &lineWatch{re: re, capture: capture, buf: make([]byte, 0, maxReadyLine), seen: make(chan struct{})}
}

// scan splits b into lines, continuing the line of the previous call, and
// matches each as it ends or reaches maxReadyLine bytes. An unterminated
// last line is never matched: the run has exited by the time nothing more
// can follow it, and a run that exited is not ready.
func (w *lineWatch) scan(b []byte) {
	for len(b) > 0 && !w.found {
		chunk, rest, ended := bytes.Cut(b, []byte{'\n'})
		b = rest
		if !w.full {
			chunk = chunk[:min(len(chunk), maxReadyLine-len(w.buf))]
			w.buf = append(w.buf, chunk...)
			if ended || len(w.buf) == maxReadyLine {
				w.match()
				w.full = !ended
			}
		}
		if ended {
			w.buf = w.buf[:0]
			w.full = false
		}
	}
}

// ansiEscape matches a terminal's colour and cursor codes (CSI
// sequences), which a server that colours its log writes into a pipe too
// (openclaw's "[gateway] ready", where TERM says a terminal).
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]`)

// match tries the current line, without its colour codes, and, if it
// matches, publishes it.
func (w *lineWatch) match() {
	line := ansiEscape.ReplaceAll(bytes.TrimSuffix(w.buf, []byte{'\r'}), nil)
	m := w.re.FindSubmatchIndex(line)
	if m == nil {
		return
	}
	w.found = true
	w.line = string(line)
	if w.capture && m[2] >= 0 {
		w.captured = string(line[m[2]:m[3]])
	}
	w.buf = nil // nothing more is scanned: let it go
	close(w.seen)
}

// teeLines writes a run's output to the ring, then scans it for the
// ReadyLine: the line is in Stderr by the time the run is ready.
type teeLines struct {
	ring  *ring
	watch *lineWatch
}

// Write never fails or blocks, like the ring's.
func (t teeLines) Write(b []byte) (int, error) {
	n, _ := t.ring.Write(b)
	t.watch.scan(b)
	return n, nil
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
//
// It names the command as the latest run was started (placeholders
// filled), or as configured before any run; and the address only of a
// server that listens on one: an agent driven over stdio (a Handshake)
// has none.
func (p *Process) String() string {
	p.mu.Lock()
	argv := p.cfg.Command
	if p.last != nil {
		argv = p.last.argv
	}
	p.mu.Unlock()
	s := "server " + strconv.Quote(strings.Join(argv, " "))
	if p.cfg.Handshake != nil {
		return s
	}
	return s + " at " + p.URL()
}
