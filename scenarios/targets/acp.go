//go:build unix

package targets

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	acp "github.com/coder/acp-go-sdk"

	"github.com/turncheck/turncheck/faults"
)

// ACPCapabilities are what the harness, as an ACP client, advertises in
// initialize (clientCapabilities): the agent may call back only these
// (PROTOCOL.md, "The Agent Client Protocol").
type ACPCapabilities struct {
	// ReadTextFile and WriteTextFile advertise fs/read_text_file and
	// fs/write_text_file, answered from the check's working directory.
	ReadTextFile  bool `yaml:"read_text_file"`
	WriteTextFile bool `yaml:"write_text_file"`
}

// ACPServer is a Server that speaks the Agent Client Protocol over its
// stdin and stdout: the harness talks to it through ACP, its connection of
// the current run (a restart makes a new one).
type ACPServer interface {
	Server
	// ACP is the connection to the current run of the agent.
	ACP() *ACPConn
}

// maxACPLine bounds one line the agent writes on stdout: a longer one is
// no JSON-RPC message the harness reads.
const maxACPLine = 8 << 20

// ACPConn is the harness's side of one run of an ACP agent: a JSON-RPC
// connection over the run's stdin and stdout (the acp-go-sdk's), the
// capabilities both sides advertised, and what the agent did that the
// protocol does not allow it (Breaches). Writes to the agent never block
// the harness: they are queued. Lines on stdout that are not JSON-RPC (an
// agent's logs) are kept in its output and said, never read as messages.
// It is safe for concurrent use.
type ACPConn struct {
	conn *acp.ClientSideConnection
	// Agent is what the agent answered to initialize.
	Agent acp.InitializeResponse
	// Caps are what the harness advertised.
	Caps ACPCapabilities
	// Dir is the working directory the harness gives each session
	// (session/new's cwd), and answers file calls from.
	Dir string

	mu       sync.Mutex
	watches  map[string]*ACPWatch
	breaches map[string][]string
	noise    []string
	queue    *lineQueue
	exited   <-chan struct{}
}

// ACPWatch is what a client of one session's turn wants of its agent's
// calls: each session/update of the session, and whether to grant a
// permission request.
type ACPWatch struct {
	// Update is called with each session/update of the session, in order.
	Update func(acp.SessionUpdate)
	// Deny, if not nil, is asked at each permission request: true answers
	// it with its reject option (or cancelled, without one) rather than
	// its allow option.
	Deny func() bool
}

// Conn is the SDK's connection, to send requests and notifications.
func (c *ACPConn) Conn() *acp.ClientSideConnection { return c.conn }

// Exited is closed once the agent's run has ended.
func (c *ACPConn) Exited() <-chan struct{} { return c.exited }

// Watch routes session's updates and calls to w until the returned stop.
func (c *ACPConn) Watch(session string, w *ACPWatch) (stop func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watches[session] = w
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.watches[session] == w {
			delete(c.watches, session)
		}
	}
}

// Breaches returns and forgets what the agent did in session that the
// protocol does not allow it: a call back the harness did not advertise.
func (c *ACPConn) Breaches(session string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.breaches[session]
	delete(c.breaches, session)
	return out
}

// Noise returns and forgets the lines the agent wrote on stdout that were
// not JSON-RPC messages (logs, a malformed message).
func (c *ACPConn) Noise() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.noise
	c.noise = nil
	return out
}

// LoadSession reports whether the agent advertised session/load.
func (c *ACPConn) LoadSession() bool { return c.Agent.AgentCapabilities.LoadSession }

func (c *ACPConn) watch(session string) *ACPWatch {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.watches[session]
}

// breach notes a call back of session's that the protocol does not allow.
func (c *ACPConn) breach(session, what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.breaches[session] = append(c.breaches[session], what)
}

// notAdvertised answers a call back the harness did not advertise: an
// error, and a breach said.
func (c *ACPConn) notAdvertised(session acp.SessionId, method string) error {
	c.breach(string(session), fmt.Sprintf("the agent called %s, which the client did not advertise", method))
	return acp.NewMethodNotFound(method)
}

// acpClient is the harness's answers to the agent's calls back: the SDK's
// acp.Client.
type acpClient struct{ c *ACPConn }

func (a acpClient) SessionUpdate(_ context.Context, n acp.SessionNotification) error {
	if w := a.c.watch(string(n.SessionId)); w != nil && w.Update != nil {
		w.Update(n.Update)
	}
	return nil
}

func (a acpClient) RequestPermission(_ context.Context, p acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	deny := false
	if w := a.c.watch(string(p.SessionId)); w != nil && w.Deny != nil {
		deny = w.Deny()
	}
	want := []acp.PermissionOptionKind{acp.PermissionOptionKindAllowOnce, acp.PermissionOptionKindAllowAlways}
	if deny {
		want = []acp.PermissionOptionKind{acp.PermissionOptionKindRejectOnce, acp.PermissionOptionKindRejectAlways}
	}
	for _, kind := range want {
		for _, o := range p.Options {
			if o.Kind == kind {
				return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeSelected(o.OptionId)}, nil
			}
		}
	}
	// No option of the kind drawn: the prompt turn's permission is not
	// given, which ACP spells cancelled.
	return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeCancelled()}, nil
}

func (a acpClient) ReadTextFile(_ context.Context, p acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	if !a.c.Caps.ReadTextFile {
		return acp.ReadTextFileResponse{}, a.c.notAdvertised(p.SessionId, acp.ClientMethodFsReadTextFile)
	}
	path, err := a.c.inDir(p.Path)
	if err != nil {
		return acp.ReadTextFileResponse{}, acp.NewInvalidParams(map[string]any{"path": p.Path, "error": err.Error()})
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return acp.ReadTextFileResponse{}, &acp.RequestError{Code: -32002, Message: "Resource not found", Data: map[string]any{"uri": p.Path}}
	}
	text := string(data)
	if p.Line != nil || p.Limit != nil {
		lines := strings.SplitAfter(text, "\n")
		from := 0
		if p.Line != nil && *p.Line > 1 {
			from = min(*p.Line-1, len(lines))
		}
		to := len(lines)
		if p.Limit != nil && *p.Limit >= 0 {
			to = min(from+*p.Limit, to)
		}
		text = strings.Join(lines[from:to], "")
	}
	return acp.ReadTextFileResponse{Content: text}, nil
}

func (a acpClient) WriteTextFile(_ context.Context, p acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	if !a.c.Caps.WriteTextFile {
		return acp.WriteTextFileResponse{}, a.c.notAdvertised(p.SessionId, acp.ClientMethodFsWriteTextFile)
	}
	path, err := a.c.inDir(p.Path)
	if err != nil {
		return acp.WriteTextFileResponse{}, acp.NewInvalidParams(map[string]any{"path": p.Path, "error": err.Error()})
	}
	if err := os.WriteFile(path, []byte(p.Content), 0o600); err != nil {
		return acp.WriteTextFileResponse{}, acp.NewInternalError(map[string]any{"error": err.Error()})
	}
	return acp.WriteTextFileResponse{}, nil
}

// The harness advertises no terminal: each terminal call is a breach.

func (a acpClient) CreateTerminal(_ context.Context, p acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	return acp.CreateTerminalResponse{}, a.c.notAdvertised(p.SessionId, acp.ClientMethodTerminalCreate)
}

func (a acpClient) KillTerminal(_ context.Context, p acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	return acp.KillTerminalResponse{}, a.c.notAdvertised(p.SessionId, acp.ClientMethodTerminalKill)
}

func (a acpClient) TerminalOutput(_ context.Context, p acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	return acp.TerminalOutputResponse{}, a.c.notAdvertised(p.SessionId, acp.ClientMethodTerminalOutput)
}

func (a acpClient) ReleaseTerminal(_ context.Context, p acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, a.c.notAdvertised(p.SessionId, acp.ClientMethodTerminalRelease)
}

func (a acpClient) WaitForTerminalExit(_ context.Context, p acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	return acp.WaitForTerminalExitResponse{}, a.c.notAdvertised(p.SessionId, acp.ClientMethodTerminalWaitForExit)
}

// inDir is path, which ACP gives absolute, if it lies in the working
// directory.
func (c *ACPConn) inDir(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", errors.New("not an absolute path")
	}
	rel, err := filepath.Rel(c.Dir, filepath.Clean(path))
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", errors.New("outside the session's working directory")
	}
	return filepath.Join(c.Dir, rel), nil
}

// DialACP runs the harness's side of ACP over run: it sends initialize,
// advertising caps, and returns once the agent answered it (ready), or
// ctx ended, or the agent exited first. dir is the sessions' working
// directory.
func DialACP(ctx context.Context, run faults.StdioRun, caps ACPCapabilities, dir string) (*ACPConn, error) {
	c := &ACPConn{Caps: caps, Dir: dir, watches: map[string]*ACPWatch{}, breaches: map[string][]string{},
		queue: newLineQueue(run.In, run.Exited), exited: run.Exited}
	pr, pw := io.Pipe()
	go c.filter(run.Out, pw, run.Log)
	c.conn = acp.NewClientSideConnection(acpClient{c}, c.queue, pr)
	// The SDK says what it drops on the default logger; the harness says
	// it itself (Noise, Breaches).
	c.conn.SetLogger(slog.New(slog.DiscardHandler))
	init, err := c.conn.Initialize(ctx, acp.InitializeRequest{
		ProtocolVersion: acp.ProtocolVersionNumber,
		ClientInfo:      &acp.Implementation{Name: "turncheck", Version: "1"},
		ClientCapabilities: acp.ClientCapabilities{
			Fs: acp.FileSystemCapabilities{ReadTextFile: caps.ReadTextFile, WriteTextFile: caps.WriteTextFile},
		},
	})
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("the agent did not answer initialize: %w", context.Cause(ctx))
		} else {
			err = fmt.Errorf("initialize: %w", err)
		}
		if noise := c.Noise(); len(noise) > 0 {
			err = fmt.Errorf("%w; its stdout had %d line(s) that are no JSON-RPC message, the first: %q", err, len(noise), noise[0])
		}
		return nil, err
	}
	c.Agent = init
	return c, nil
}

// filter copies the JSON-RPC messages among the lines of out to w, for the
// SDK, and keeps the others in log and in Noise: an agent's logs on
// stdout, a malformed message. It closes w once out ends.
func (c *ACPConn) filter(out io.Reader, w *io.PipeWriter, log io.Writer) {
	defer w.Close()
	rd := bufio.NewReaderSize(out, 64<<10)
	for {
		line, err := readLine(rd)
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			if jsonRPC(trimmed) {
				if _, werr := w.Write(append(trimmed, '\n')); werr != nil {
					return
				}
			} else {
				_, _ = fmt.Fprintf(log, "[stdout, no JSON-RPC] %s\n", clipLine(trimmed))
				c.mu.Lock()
				if len(c.noise) < 100 {
					c.noise = append(c.noise, clipLine(trimmed))
				}
				c.mu.Unlock()
			}
		}
		if err != nil {
			// The pipe ends (or its read deadline passes once the run
			// has ended): whatever was left was read.
			_, _ = io.Copy(io.Discard, out)
			return
		}
	}
}

// readLine reads one line of rd, at most maxACPLine bytes of it kept.
func readLine(rd *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		part, err := rd.ReadSlice('\n')
		if len(line) < maxACPLine {
			line = append(line, part[:min(len(part), maxACPLine-len(line))]...)
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, err
		}
	}
}

// jsonRPC reports whether line is a JSON-RPC 2.0 message: an object with
// "jsonrpc": "2.0".
func jsonRPC(line []byte) bool {
	var m struct {
		Version string `json:"jsonrpc"`
	}
	return line[0] == '{' && json.Unmarshal(line, &m) == nil && m.Version == "2.0"
}

func clipLine(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

// lineQueue is a writer that never blocks: what is written is queued and
// written to the agent's stdin by a goroutine of its own, until a write
// fails (the agent exited).
type lineQueue struct {
	mu    sync.Mutex
	cond  *sync.Cond
	queue [][]byte
	err   error
	w     io.Writer
}

// newLineQueue writes to w until a write fails or exited is closed.
func newLineQueue(w io.Writer, exited <-chan struct{}) *lineQueue {
	q := &lineQueue{w: w}
	q.cond = sync.NewCond(&q.mu)
	go q.run()
	go func() {
		<-exited
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.err == nil {
			q.err = errors.New("the agent exited")
		}
		q.queue = nil
		q.cond.Broadcast()
	}()
	return q
}

// Write queues b; it fails only once a write to the agent failed.
func (q *lineQueue) Write(b []byte) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return 0, q.err
	}
	q.queue = append(q.queue, bytes.Clone(b))
	q.cond.Signal()
	return len(b), nil
}

func (q *lineQueue) run() {
	for {
		q.mu.Lock()
		for len(q.queue) == 0 && q.err == nil {
			q.cond.Wait()
		}
		if q.err != nil {
			q.mu.Unlock()
			return
		}
		b := q.queue[0]
		q.queue = q.queue[1:]
		q.mu.Unlock()
		if _, err := q.w.Write(b); err != nil {
			q.mu.Lock()
			q.err, q.queue = fmt.Errorf("the agent's stdin: %w", err), nil
			q.mu.Unlock()
			return
		}
	}
}

// acpServer is an ACP agent the harness runs as a subprocess: one process
// serves every session, and each of its runs (a restart, a crash) is
// reached through the connection its handshake made.
type acpServer struct {
	*subprocessServer
	mu   sync.Mutex
	conn *ACPConn
}

// ACP is the connection to the agent's current run.
func (s *acpServer) ACP() *ACPConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn
}

// URL names the agent for reports: it listens on no address.
func (s *acpServer) URL() string { return "acp:stdio" }

// startACP starts s's agent on a fresh data dir, ready once it answers
// initialize: the sessions' working directory is the data dir's "work".
func (s Subprocess) startACP(ctx context.Context, modelURL string, refs []string) (Server, error) {
	dir, err := os.MkdirTemp("", "turncheck-acp-*")
	if err != nil {
		return nil, err
	}
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	srv := &acpServer{}
	handshake := func(ctx context.Context, run faults.StdioRun) error {
		c, err := DialACP(ctx, run, s.Reaches.ACPCaps, work)
		if err != nil {
			return err
		}
		srv.mu.Lock()
		srv.conn = c
		srv.mu.Unlock()
		return nil
	}
	p, err := faults.StartProcess(faults.ProcessConfig{Command: s.Command, ModelURL: modelURL, DataDir: dir,
		Env: s.Env, Files: s.Files, Agents: refs, Handshake: handshake,
		StartTimeout: s.StartTimeout, StopGrace: s.StopGrace, StopStatus: s.StopStatus, Context: ctx, Started: s.Started})
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	srv.subprocessServer = &subprocessServer{p: p, dir: dir}
	return srv, nil
}
