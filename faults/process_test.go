//go:build unix

package faults_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/testbin"
	"github.com/turncheck/turncheck/model"
)

// procServe is the command template that runs the reference server.
func procServe(bin string) []string {
	return []string{bin, "serve", "--listen", "{addr}", "--model-url", "{model_url}", "--data-dir", "{data_dir}"}
}

// procModel starts a fake model of the test's own, closed when it ends.
func procModel(t *testing.T) *faults.Model {
	t.Helper()
	m, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, m.Close()) })
	return m
}

// procStart starts a process that is killed when the test ends, whatever
// it did.
func procStart(t *testing.T, cfg faults.ProcessConfig) *faults.Process {
	t.Helper()
	p, err := faults.StartProcess(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Kill()) })
	return p
}

// procTurn sends one user message on conversation conv and returns the
// status and body.
func procTurn(t *testing.T, client *http.Client, url, conv, content string) (int, string) {
	t.Helper()
	b := `{"model":"m","messages":[{"role":"user","content":` + strconv.Quote(content) + `}]}`
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Conversation-Id", conv)
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(got)
}

// procClient is an HTTP client whose connections are closed when the test
// ends, so that goleak finds none of them.
func procClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: guard}
}

// procGone reports whether pid is no longer a live process: gone, or a
// zombie waiting for a parent (init, in a container, may be slow to reap).
func procGone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return errors.Is(err, os.ErrNotExist) && runtimeHasProc()
	}
	// The state follows the parenthesized command name.
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

func runtimeHasProc() bool {
	_, err := os.Stat("/proc/self/stat")
	return err == nil
}

// readPID reads a pid a test command wrote to a file.
func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	return pid
}

// TestProcess runs the reference server, built once for all its subtests,
// through the subprocess lifecycle.
func TestProcess(t *testing.T) {
	bin := testbin.Turncheck(t)

	t.Run("a started server is ready and answers a turn", func(t *testing.T) {
		t.Parallel()
		m := procModel(t)
		p := procStart(t, faults.ProcessConfig{Command: procServe(bin), ModelURL: m.URL(), DataDir: t.TempDir()})
		assert.True(t, strings.HasPrefix(p.URL(), "http://127.0.0.1:"), "loopback only: %s", p.URL())
		status, got := procTurn(t, procClient(t), p.URL(), "c1", "hi tc-u1")
		require.Equal(t, http.StatusOK, status, got)
		assert.Contains(t, got, "tc-a1")
		// Its output is read from a pipe as it comes: once stopped, all of
		// it has been (Exited), and a loaded machine may read it late.
		url := p.URL()
		require.NoError(t, p.Stop())
		assert.Contains(t, p.Stderr(), "listening on "+url, "the server's output is kept")
	})

	t.Run("stop is graceful, idempotent and leaves no process", func(t *testing.T) {
		t.Parallel()
		m := procModel(t)
		p := procStart(t, faults.ProcessConfig{Command: procServe(bin), ModelURL: m.URL(), DataDir: t.TempDir()})
		pid := p.PID()
		require.Positive(t, pid)
		require.NoError(t, syscall.Kill(pid, 0), "the server runs before Stop")
		began := time.Now()
		require.NoError(t, p.Stop(), "the reference server exits cleanly on SIGTERM")
		assert.Less(t, time.Since(began), 5*time.Second, "it stopped on SIGTERM, not after the SIGKILL grace")
		assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "no process is left after Stop")
		assert.NoError(t, p.Stop(), "a second Stop does nothing")
		assert.NoError(t, p.Kill(), "a Kill after Stop does nothing")
	})

	t.Run("stop kills a server that ignores SIGTERM after the grace", func(t *testing.T) {
		t.Parallel()
		m := procModel(t)
		// The shell and the sleep after the server ignore SIGTERM; the
		// server itself stops on it.
		script := `trap "" TERM; "$0" serve --listen "$1" --model-url "$2" --data-dir "$3"; echo served; sleep 60`
		p := procStart(t, faults.ProcessConfig{
			Command:   []string{"sh", "-c", script, bin, "{addr}", "{model_url}", "{data_dir}"},
			ModelURL:  m.URL(),
			DataDir:   t.TempDir(),
			StopGrace: 300 * time.Millisecond,
		})
		pid := p.PID()
		began := time.Now()
		err := p.Stop()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "did not exit within 300ms of SIGTERM; killed")
		var stopErr *faults.StopError
		assert.ErrorAs(t, err, &stopErr, "killed, it is down all the same: an untidy stop, which a harness notes beside its verdicts")
		assert.Contains(t, err.Error(), "served", "the error quotes the output")
		assert.GreaterOrEqual(t, time.Since(began), 300*time.Millisecond)
		assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH)
		assert.NoError(t, p.Stop(), "a second Stop has nothing more to say")
	})

	t.Run("an exit status on SIGTERM the server declares is a tidy stop", func(t *testing.T) {
		t.Parallel()
		m := procModel(t)
		// As docker-agent does: status 1 after SIGTERM, its ordinary stop.
		script := `trap "" TERM; "$0" serve --listen "$1" --model-url "$2" --data-dir "$3"; exit 1`
		for _, declared := range []bool{false, true} {
			cfg := faults.ProcessConfig{
				Command:  []string{"sh", "-c", script, bin, "{addr}", "{model_url}", "{data_dir}"},
				ModelURL: m.URL(),
				DataDir:  t.TempDir(),
			}
			if declared {
				cfg.StopStatus = []int{1}
			}
			err := procStart(t, cfg).Stop()
			if !declared {
				var stopErr *faults.StopError
				require.ErrorAs(t, err, &stopErr)
				assert.Contains(t, err.Error(), "exited with status 1 after SIGTERM")
				continue
			}
			assert.NoError(t, err, "declared: no note")
		}
	})

	t.Run("a restart after kill -9 keeps the conversation", func(t *testing.T) {
		t.Parallel()
		m := procModel(t)
		client := procClient(t)
		p := procStart(t, faults.ProcessConfig{Command: procServe(bin), ModelURL: m.URL(), DataDir: t.TempDir()})
		status, got := procTurn(t, client, p.URL(), "c1", "hi tc-u1")
		require.Equal(t, http.StatusOK, status, got)
		require.Contains(t, got, "tc-a1")

		pid := p.PID()
		require.NoError(t, p.Kill())
		assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "kill -9 leaves no process")
		client.Transport.(*http.Transport).CloseIdleConnections()
		require.NoError(t, p.Restart())
		assert.NotEqual(t, pid, p.PID(), "a new process")

		status, got = procTurn(t, client, p.URL(), "c1", "and tc-u2")
		require.Equal(t, http.StatusOK, status, got)
		assert.Contains(t, got, "tc-a2")
		calls := m.CallsAfter(0)
		require.NotEmpty(t, calls)
		assert.Equal(t, []model.Token{"tc-u1", "tc-a1", "tc-u2"}, calls[len(calls)-1].History,
			"the restarted server sent the model the history it had before the kill")

		// A restart of a running server stops it first.
		pid = p.PID()
		require.NoError(t, p.Restart())
		assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "the old run is gone")
		require.NoError(t, p.Stop())
	})

	t.Run("a command that exits at once fails with its output", func(t *testing.T) {
		t.Parallel()
		began := time.Now()
		p, err := faults.StartProcess(faults.ProcessConfig{Command: []string{bin, "serve"}})
		require.Error(t, err)
		assert.Nil(t, p)
		assert.Less(t, time.Since(began), 5*time.Second)
		assert.Contains(t, err.Error(), "exited with status")
		assert.Contains(t, err.Error(), "before it was ready")
		assert.Contains(t, err.Error(), "--model-url is required", "the error quotes the server's output")
		var se *faults.StartError
		require.ErrorAs(t, err, &se, "a server that exits before it is ready did not start")
		assert.Contains(t, se.Output, "--model-url is required", "its last words")

		_, err = faults.StartProcess(faults.ProcessConfig{Command: []string{"false"}})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "exited with status 1 before it was ready (no output)")
		assert.ErrorAs(t, err, &se)

		_, err = faults.StartProcess(faults.ProcessConfig{Command: []string{filepath.Join(t.TempDir(), "missing")}})
		require.Error(t, err, "a command that cannot run")
		assert.False(t, errors.As(err, &se), "a command that cannot run is no server that did not start: %v", err)
	})

	t.Run("a command that is never ready times out and leaves no process", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		began := time.Now()
		_, err := faults.StartProcess(faults.ProcessConfig{
			// The shell's child shows that the whole group goes, not only
			// the process started.
			Command:      []string{"sh", "-c", `sleep 60 & echo $! > "$1/child"; echo $$ > "$1/pid"; echo waiting; wait`, "sh", "{data_dir}"},
			DataDir:      dir,
			StartTimeout: time.Second,
		})
		took := time.Since(began)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "not ready within 1s")
		assert.Contains(t, err.Error(), "waiting", "the error quotes the output")
		var se *faults.StartError
		assert.ErrorAs(t, err, &se, "a server not ready in time did not start")
		assert.GreaterOrEqual(t, took, time.Second)
		assert.Less(t, took, 4*time.Second)
		assert.True(t, procGone(readPID(t, filepath.Join(dir, "pid"))), "the shell is gone")
		child := readPID(t, filepath.Join(dir, "child"))
		// SIGKILL has been sent to the child's group; the kernel ends it
		// on its own time.
		assert.Eventually(t, func() bool { return procGone(child) }, guard, 10*time.Millisecond, "the shell's child is gone")
	})

	t.Run("a start or restart waiting to be ready ends with its context, and leaves no process", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Ready on its first start; a restart never is, as a server that
		// takes minutes to start again.
		p := procStart(t, faults.ProcessConfig{
			Command: []string{"sh", "-c", `if [ -e "$1/pid" ]; then echo $$ > "$1/tmp"; mv "$1/tmp" "$1/again"; echo waiting; ` +
				`else echo $$ > "$1/tmp"; mv "$1/tmp" "$1/pid"; echo ready; fi; exec sleep 60`, "sh", "{data_dir}"},
			DataDir: dir, ReadyLine: "^ready$", StartTimeout: time.Minute, Context: ctx,
		})
		first := readPID(t, filepath.Join(dir, "pid"))
		restarted := make(chan error, 1)
		go func() { restarted <- p.Restart() }()
		require.Eventually(t, func() bool { _, err := os.Stat(filepath.Join(dir, "again")); return err == nil }, guard, 10*time.Millisecond,
			"the restart runs the command again")
		// Its "waiting" is read from the pipe on the harness's own time:
		// the cut comes after it, as the cut of a server's start does.
		require.Eventually(t, func() bool { return strings.Contains(p.Stderr(), "waiting") }, guard, 10*time.Millisecond,
			"the restart says it waits")
		cancel()
		select {
		case err := <-restarted:
			require.ErrorIs(t, err, context.Canceled, "the restart says it was cut short")
		case <-time.After(guard):
			t.Fatal("the restart went on waiting after its context ended")
		}
		second := readPID(t, filepath.Join(dir, "again"))
		assert.Eventually(t, func() bool { return procGone(first) && procGone(second) }, guard, 10*time.Millisecond,
			"no run is left")
		assert.Contains(t, p.Stderr(), "waiting\n[turncheck: the start above was cut short by the harness (context canceled)",
			"the output of a start the harness cut short says so")
		_, err := faults.StartProcess(faults.ProcessConfig{Command: []string{"sleep", "60"}, StartTimeout: time.Minute, Context: ctx})
		require.ErrorIs(t, err, context.Canceled, "a start under an ended context does not wait")
		var se *faults.StartError
		assert.False(t, errors.As(err, &se), "a start the harness cut short is no server that did not start")
	})

	t.Run("output is drained and bounded", func(t *testing.T) {
		t.Parallel()
		m := procModel(t)
		// The server starts only once 5 MB of output are written: if the
		// pipe were not drained, it would never become ready.
		script := `yes | head -c 5000000; exec "$0" serve --listen "$1" --model-url "$2" --data-dir "$3"`
		p := procStart(t, faults.ProcessConfig{
			Command:      []string{"sh", "-c", script, bin, "{addr}", "{model_url}", "{data_dir}"},
			ModelURL:     m.URL(),
			DataDir:      t.TempDir(),
			StartTimeout: 5 * time.Second,
		})
		out := p.Stderr()
		assert.LessOrEqual(t, len(out), faults.MaxProcessOutput)
		assert.Greater(t, len(out), faults.MaxProcessOutput/2, "the tail is kept")
		assert.Contains(t, out, "y\ny\n")
		assert.Eventually(t, func() bool { return strings.Contains(p.Stderr(), "listening on") },
			5*time.Second, 10*time.Millisecond, "the server's own line is kept after the flood")
		require.NoError(t, p.Stop())
	})

	t.Run("{port} is the port of {addr}", func(t *testing.T) {
		t.Parallel()
		m := procModel(t)
		p := procStart(t, faults.ProcessConfig{
			Command:  []string{bin, "serve", "--listen", "127.0.0.1:{port}", "--model-url", "{model_url}", "--data-dir", "{data_dir}"},
			ModelURL: m.URL(),
			DataDir:  t.TempDir(),
		})
		// Ready by the HTTP probe at URL: the server listens where {addr} says.
		assert.Eventually(t, func() bool { return strings.Contains(p.Stderr(), "listening on "+p.URL()) },
			guard, 10*time.Millisecond, "the server listens on the port of {addr}: %s", p.Stderr())
	})

	t.Run("a ReadyLine with a group reads the address the server picked", func(t *testing.T) {
		t.Parallel()
		m := procModel(t)
		client := procClient(t)
		p := procStart(t, faults.ProcessConfig{
			Command:   procServe(bin), // --listen {addr}: 127.0.0.1:0
			ReadyLine: `listening on (http://\S+)`,
			ModelURL:  m.URL(),
			DataDir:   t.TempDir(),
		})
		assert.True(t, strings.HasPrefix(p.URL(), "http://127.0.0.1:"), p.URL())
		assert.NotEqual(t, "http://127.0.0.1:0", p.URL(), "the bound port, not the one asked for")
		assert.Contains(t, p.Stderr(), "listening on "+p.URL(), "the line is kept by the time the server is ready")
		status, got := procTurn(t, client, p.URL(), "c1", "hi tc-u1")
		require.Equal(t, http.StatusOK, status, got)

		// A restart reads the new run's line, not the old one still kept.
		exited := p.Exited()
		client.Transport.(*http.Transport).CloseIdleConnections()
		require.NoError(t, p.Restart())
		assertClosed(t, exited, "the old run's channel")
		status, got = procTurn(t, client, p.URL(), "c1", "and tc-u2")
		require.Equal(t, http.StatusOK, status, got)
		assert.Contains(t, got, "tc-a2", "the restarted server kept the conversation")
		require.NoError(t, p.Stop())
	})

	t.Run("an address in use is retried on another port", func(t *testing.T) {
		t.Parallel()
		m := procModel(t)
		script := `if [ ! -e "$3/once" ]; then : > "$3/once"; echo "listen tcp $1: bind: address already in use" >&2; exit 1; fi
exec "$0" serve --listen "$1" --model-url "$2" --data-dir "$3"`
		p := procStart(t, faults.ProcessConfig{
			Command:  []string{"sh", "-c", script, bin, "{addr}", "{model_url}", "{data_dir}"},
			ModelURL: m.URL(),
			DataDir:  t.TempDir(),
		})
		assert.Contains(t, p.Stderr(), "address already in use", "the first run failed")
		// The server may answer before its first line has been drained.
		assert.Eventually(t, func() bool { return strings.Contains(p.Stderr(), "listening on "+p.URL()) },
			5*time.Second, 10*time.Millisecond, "the second run listens on the port the Process reports: %s", p.Stderr())
	})
}

// shCommand is a command template that runs script with sh, its $1, $2...
// the args (after expansion).
func shCommand(script string, args ...string) []string {
	return append([]string{"sh", "-c", script, "sh"}, args...)
}

// assertClosed asserts that ch is closed, or closes within guard.
func assertClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(guard):
		t.Errorf("%s is not closed", what)
	}
}

// assertOpen asserts that ch is not closed now.
func assertOpen(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Errorf("%s is closed", what)
	default:
	}
}

// TestProcessTemplate checks the command template and the readiness by a
// line of output on small shell scripts, which need no server: each prints
// what it was given, then a line, then sleeps until it is killed.
func TestProcessTemplate(t *testing.T) {
	t.Run("{addr} and {port} with a ReadyLine without a group", func(t *testing.T) {
		t.Parallel()
		p := procStart(t, faults.ProcessConfig{
			Command:   shCommand(`echo "addr=$1 port=$2"; echo ready; exec sleep 60`, "{addr}", "{port}"),
			ReadyLine: `^ready$`,
		})
		// The line only signals readiness: the port is still picked.
		hostport := strings.TrimPrefix(p.URL(), "http://")
		host, port, ok := strings.Cut(hostport, ":")
		require.True(t, ok, p.URL())
		assert.Equal(t, "127.0.0.1", host)
		assert.NotEqual(t, "0", port)
		assert.Equal(t, "addr="+hostport+" port="+port+"\nready\n", p.Stderr())
	})

	t.Run("a ReadyLine matches a line whose words are coloured", func(t *testing.T) {
		t.Parallel()
		// openclaw colours its log where TERM names a terminal, pipe or
		// not: the codes are not the line's words.
		p := procStart(t, faults.ProcessConfig{
			Command:   shCommand(`printf '\033[36m[gateway]\033[39m \033[1mready\033[0m\n'; exec sleep 60`, "{addr}"),
			ReadyLine: `^\[gateway\] ready$`,
		})
		assert.Contains(t, p.Stderr(), "ready")
	})

	t.Run("Started is told each run's command line, placeholders filled", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		var started [][]string
		p := procStart(t, faults.ProcessConfig{
			Command:   shCommand(`echo ready; exec sleep 60`, "{addr}", "{model_url}", "{data_dir}", "--agent={agents}"),
			ModelURL:  "http://127.0.0.1:9/v1",
			DataDir:   "/tmp/d",
			Agents:    []string{"a1"},
			ReadyLine: `^ready$`,
			Started: func(argv []string) {
				mu.Lock()
				defer mu.Unlock()
				started = append(started, argv)
			},
		})
		first := strings.TrimPrefix(p.URL(), "http://")
		require.NoError(t, p.Restart())
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, started, 2, "the first start and the restart")
		want := shCommand(`echo ready; exec sleep 60`, first, "http://127.0.0.1:9/v1", "/tmp/d", "--agent=a1")
		assert.Equal(t, want, started[0], "what was run, not its template")
		assert.NotContains(t, strings.Join(started[1], " "), "{", "a restart's command is filled too")
	})

	t.Run("placeholders in the environment", func(t *testing.T) {
		t.Parallel()
		p := procStart(t, faults.ProcessConfig{
			Command:   shCommand(`echo "base=$OPENAI_BASE_URL port=$PORT"; echo ready; exec sleep 60`),
			Env:       []string{"OPENAI_BASE_URL={model_url}", "PORT={port}"},
			ModelURL:  "http://127.0.0.1:9/v1",
			ReadyLine: `^ready$`,
		})
		_, port, _ := strings.Cut(strings.TrimPrefix(p.URL(), "http://"), ":")
		assert.Equal(t, "base=http://127.0.0.1:9/v1 port="+port+"\nready\n", p.Stderr())
	})

	t.Run("files written into the data dir before each start", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		p := procStart(t, faults.ProcessConfig{
			Command:   shCommand(`cat "$1/conf/model.json"; echo; echo ready; exec sleep 60`, "{data_dir}"),
			Files:     map[string]string{"conf/model.json": `{"base_url": "{model_url}", "listen": "{addr}", "dir": "{data_dir}"}`},
			ModelURL:  "http://127.0.0.1:9/v1",
			DataDir:   dir,
			ReadyLine: `^ready$`,
		})
		addr := strings.TrimPrefix(p.URL(), "http://")
		want := `{"base_url": "http://127.0.0.1:9/v1", "listen": "` + addr + `", "dir": "` + dir + `"}` + "\nready\n"
		assert.Equal(t, want, p.Stderr())
		// A restart writes them again, for its own address.
		require.NoError(t, os.WriteFile(filepath.Join(dir, "conf", "model.json"), []byte("stale"), 0o600))
		require.NoError(t, p.Restart())
		assert.NotContains(t, p.Stderr(), "stale")
	})

	t.Run("a file outside the data dir is refused", func(t *testing.T) {
		t.Parallel()
		for _, name := range []string{"../x", "/etc/x", "a/../../x", ""} {
			_, err := faults.StartProcess(faults.ProcessConfig{Command: shCommand(`echo ready; exec sleep 60`),
				Files: map[string]string{name: "x"}, DataDir: t.TempDir(), ReadyLine: `^ready$`})
			assert.Error(t, err, name)
		}
	})

	t.Run("{agents} repeats its argument per agent", func(t *testing.T) {
		t.Parallel()
		script := `printf '<%s>\n' "$@"; echo ready; exec sleep 60`
		for _, tc := range []struct {
			name   string
			agents []string
			want   string
		}{
			{"no agents", nil, "<first>\n<last>\n"},
			{"one agent", []string{"http://127.0.0.1:1/agents/a.yaml?tag=v1"},
				"<first>\n<--agent=http://127.0.0.1:1/agents/a.yaml?tag=v1>\n<last>\n"},
			// A reference is taken literally, placeholders and all.
			{"two agents", []string{"a.yaml", "b.yaml?x={addr}"},
				"<first>\n<--agent=a.yaml>\n<--agent=b.yaml?x={addr}>\n<last>\n"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				p := procStart(t, faults.ProcessConfig{
					Command:   shCommand(script, "first", "--agent={agents}", "last"),
					Agents:    tc.agents,
					ReadyLine: `^ready$`,
				})
				assert.Equal(t, tc.want+"ready\n", p.Stderr())
			})
		}
	})

	t.Run("SetAgents changes the agents of the next restart", func(t *testing.T) {
		t.Parallel()
		p := procStart(t, faults.ProcessConfig{
			Command:   shCommand(`printf '<%s>\n' "$@"; echo ready; exec sleep 60`, "--agent={agents}", "{port}"),
			Agents:    []string{"a.yaml?tag=v1"},
			ReadyLine: `^ready$`,
		})
		port := p.URL()[strings.LastIndexByte(p.URL(), ':')+1:]
		refs := []string{"a.yaml?tag=v2", "b.yaml"}
		p.SetAgents(refs)
		refs[0] = "changed"
		assert.Equal(t, "<--agent=a.yaml?tag=v1>\n<"+port+">\nready\n", p.Stderr(), "the running server keeps its agents")
		require.NoError(t, p.Restart())
		port = p.URL()[strings.LastIndexByte(p.URL(), ':')+1:]
		assert.True(t, strings.HasSuffix(p.Stderr(), "ready\n<--agent=a.yaml?tag=v2>\n<--agent=b.yaml>\n<"+port+">\nready\n"),
			"the restart has the new agents, copied when set: %s", p.Stderr())
	})

	t.Run("a ReadyLine with a group takes the address the server prints", func(t *testing.T) {
		t.Parallel()
		script := `echo "addr=$1 port=$2"; echo "up at $3"; exec sleep 60`
		for _, tc := range []struct{ printed, url string }{
			{":41237", "http://127.0.0.1:41237"},
			{"127.0.0.1:41237", "http://127.0.0.1:41237"},
			{"127.0.0.2:41237", "http://127.0.0.2:41237"},
			{"localhost:41237", "http://localhost:41237"},
			{"[::1]:41237", "http://[::1]:41237"},
			{"http://127.0.0.1:41237", "http://127.0.0.1:41237"},
			{"http://127.0.0.1:41237/", "http://127.0.0.1:41237"},
		} {
			t.Run(tc.printed, func(t *testing.T) {
				t.Parallel()
				p := procStart(t, faults.ProcessConfig{
					Command:   shCommand(script, "{addr}", "{port}", tc.printed),
					ReadyLine: `^up at (\S+)$`,
				})
				assert.Equal(t, tc.url, p.URL())
				assert.Contains(t, p.Stderr(), "addr=127.0.0.1:0 port=0\n", "the server is asked to pick its port")
			})
		}
	})

	t.Run("a captured address that is not a loopback one fails the start", func(t *testing.T) {
		t.Parallel()
		script := `echo $$ > "$1/pid"; echo "up at $2"; exec sleep 60`
		for _, tc := range []struct{ printed, why string }{
			{"0.0.0.0:41237", "not a loopback address"},
			{"192.0.2.1:41237", "not a loopback address"},
			{"example.com:41237", "not a loopback address"},
			{"127.0.0.1:0", "has port 0"},
			// A pattern that takes a comma with the address.
			{"127.0.0.1:41237,", "the ready line's pattern must capture the address alone"},
			{"41237", "is not host:port"},
			{"https://127.0.0.1:41237", "is not host:port"},
		} {
			t.Run(tc.printed, func(t *testing.T) {
				t.Parallel()
				dir := t.TempDir()
				p, err := faults.StartProcess(faults.ProcessConfig{
					Command:   shCommand(script, "{data_dir}", tc.printed),
					DataDir:   dir,
					ReadyLine: `^up at (\S+)$`,
				})
				require.Error(t, err)
				assert.Nil(t, p)
				assert.Contains(t, err.Error(), strconv.Quote(tc.printed), "the error names what was seen")
				assert.Contains(t, err.Error(), tc.why)
				assert.Contains(t, err.Error(), "its output ends:\nup at "+tc.printed)
				var se *faults.StartError
				assert.False(t, errors.As(err, &se), "an address the pattern captured is the profile's or the listening's business, not a start that failed")
				pid := readPID(t, filepath.Join(dir, "pid"))
				assert.Eventually(t, func() bool { return procGone(pid) }, guard, 10*time.Millisecond, "the server is killed")
			})
		}
	})

	t.Run("a long line is matched on its first 4 KiB, and a CRLF line without its CR", func(t *testing.T) {
		t.Parallel()
		// 5000 zeros then "late": the first 4 KiB are zeros only.
		p := procStart(t, faults.ProcessConfig{
			Command:   shCommand(`printf '%05000dlate\n' 0; exec sleep 60`),
			ReadyLine: `^0+$`,
		})
		assert.Contains(t, p.Stderr(), "late")
		procStart(t, faults.ProcessConfig{
			Command:   shCommand(`printf 'ready\r\n'; exec sleep 60`),
			ReadyLine: `^ready$`,
		})
	})

	t.Run("a ReadyLine that never appears times out with the output", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		began := time.Now()
		// "ready" comes only past the first 4 KiB of its line: not seen.
		_, err := faults.StartProcess(faults.ProcessConfig{
			Command:      shCommand(`echo $$ > "$1/pid"; printf '%05000dready\n' 0; echo waiting; exec sleep 60`, "{data_dir}"),
			DataDir:      dir,
			ReadyLine:    `ready$`,
			StartTimeout: 300 * time.Millisecond,
		})
		took := time.Since(began)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `no line of output matched "ready$" within 300ms`)
		assert.Contains(t, err.Error(), "waiting", "the error quotes the output")
		assert.GreaterOrEqual(t, took, 300*time.Millisecond)
		assert.Less(t, took, 3*time.Second)
		pid := readPID(t, filepath.Join(dir, "pid"))
		assert.Eventually(t, func() bool { return procGone(pid) }, guard, 10*time.Millisecond, "the server is killed")
	})

	t.Run("a ReadyLine counts only lines of this run", func(t *testing.T) {
		t.Parallel()
		script := `if [ -e "$1/once" ]; then echo again; else : > "$1/once"; echo ready; fi; exec sleep 60`
		p := procStart(t, faults.ProcessConfig{
			Command:      shCommand(script, "{data_dir}"),
			DataDir:      t.TempDir(),
			ReadyLine:    `^ready$`,
			StartTimeout: 300 * time.Millisecond,
		})
		err := p.Restart()
		require.Error(t, err, "the first run's line does not make the second ready")
		assert.Contains(t, err.Error(), "no line of output matched")
		assert.Contains(t, err.Error(), "its output ends:\nagain", "the error quotes this run's output only")
		assert.Equal(t, "ready\nagain\n", p.Stderr())
		assertClosed(t, p.Exited(), "Exited after a failed restart")
	})

	t.Run("a server that exits before its ReadyLine fails with its output", func(t *testing.T) {
		t.Parallel()
		_, err := faults.StartProcess(faults.ProcessConfig{
			Command:   shCommand(`echo starting; exit 3`),
			ReadyLine: `^ready$`,
		})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "exited with status 3 before it was ready; its output ends:\nstarting")
	})

	t.Run("a bad ReadyLine is an error before anything runs", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		p, err := faults.StartProcess(faults.ProcessConfig{
			Command:   shCommand(`: > "$1/ran"`, "{data_dir}"),
			DataDir:   dir,
			ReadyLine: `(`,
		})
		require.Error(t, err)
		assert.Nil(t, p)
		assert.Contains(t, err.Error(), "ReadyLine")
		assert.NoFileExists(t, filepath.Join(dir, "ran"))
	})

	t.Run("Exited closes when the run is killed, and a restart has a new one", func(t *testing.T) {
		t.Parallel()
		p := procStart(t, faults.ProcessConfig{
			Command:   shCommand(`echo ready; exec sleep 60`),
			ReadyLine: `^ready$`,
		})
		first := p.Exited()
		assertOpen(t, first, "Exited of a running server")
		require.NoError(t, p.Kill())
		assertClosed(t, first, "Exited after Kill")
		require.NoError(t, p.Restart())
		second := p.Exited()
		assertOpen(t, second, "Exited of the restarted server")
		require.NoError(t, p.Stop())
		assertClosed(t, second, "Exited after Stop")
	})

	t.Run("Exited closes when the server exits on its own", func(t *testing.T) {
		t.Parallel()
		// Ready by its line, then gone: the line was drained before the
		// exit was noticed, so the start succeeds.
		p := procStart(t, faults.ProcessConfig{
			Command:   shCommand(`echo ready; exit 3`),
			ReadyLine: `^ready$`,
		})
		assertClosed(t, p.Exited(), "Exited of a server that exited")
		err := p.Stop()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "exited with status 3 on its own")
	})
}
