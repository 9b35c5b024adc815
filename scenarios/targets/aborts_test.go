package targets

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// pythonAbort is what Python's http.server printed when a client reset
// its connection mid-answer, as captured from one.
const pythonAbort = `127.0.0.1 - - [27/Nov/2026 03:23:10] "GET / HTTP/1.1" 200 -
----------------------------------------
Exception occurred during processing of request from ('127.0.0.1', 46050)
Traceback (most recent call last):
  File "/usr/lib/python3.11/socketserver.py", line 691, in process_request_thread
    self.finish_request(request, client_address)
  File "/usr/lib/python3.11/http/server.py", line 424, in handle_one_request
    method()
  File "/tmp/server.py", line 5, in do_GET
    self.send_response(200); self.end_headers()
                             ^^^^^^^^^^^^^^^^^^
  File "/usr/lib/python3.11/socketserver.py", line 834, in write
    self._sock.sendall(b)
ConnectionResetError: [Errno 104] Connection reset by peer
----------------------------------------
127.0.0.1 - - [27/Nov/2026 03:23:11] "POST /v1/chat/completions HTTP/1.1" 200 -
Traceback (most recent call last):
  File "/tmp/server.py", line 40, in do_POST
    self.wfile.write(body)
ConnectionResetError: [Errno 104] Connection reset by peer

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/tmp/server.py", line 44, in do_POST
    self.send_error(500)
BrokenPipeError: [Errno 32] Broken pipe
2026/11/27 03:23:12 http: write tcp 127.0.0.1:8080->127.0.0.1:5555: write: broken pipe`

// pythonCrash is a server's own failure: it stays as it is.
const pythonCrash = `Traceback (most recent call last):
  File "/tmp/server.py", line 12, in do_POST
    turn = history[conv]
KeyError: 'conv-1'`

// TestMarkAborts: what the harness's client aborts make a server print is
// marked as such, a Python traceback for one folded into a line; the
// server's own failures, and the lines around, are left as they are.
func TestMarkAborts(t *testing.T) {
	out := markAborts(pythonAbort + "\n" + pythonCrash)
	lines := strings.Split(out, "\n")
	assert.Equal(t, []string{
		`127.0.0.1 - - [27/Nov/2026 03:23:10] "GET / HTTP/1.1" 200 -`,
		"[ConnectionResetError traceback, 11 line(s), folded] " + abortNote,
		`127.0.0.1 - - [27/Nov/2026 03:23:11] "POST /v1/chat/completions HTTP/1.1" 200 -`,
		"[BrokenPipeError traceback, 11 line(s), folded] " + abortNote,
		"2026/11/27 03:23:12 http: write tcp 127.0.0.1:8080->127.0.0.1:5555: write: broken pipe  " + abortNote,
	}, lines[:5])
	assert.Equal(t, pythonCrash, strings.Join(lines[5:], "\n"), "a crash's traceback is the server's own")
	assert.Equal(t, pythonCrash, markAborts(pythonCrash))

	// Where the output's start was cut off, the traceback's last line is
	// marked still; lastLines keeps the last lines after folding.
	assert.Equal(t, "  x\n  BrokenPipeError: [Errno 32] Broken pipe  "+abortNote, lastLines("    self.wfile.write(b)\nx\nBrokenPipeError: [Errno 32] Broken pipe\n", 2))
}

// TestRepeatedLinesFolded: the lines each start of a server writes (the
// address it listens on) fold into one, with how many they were, so that
// a run's restarts do not push what came before them out of view.
func TestRepeatedLinesFolded(t *testing.T) {
	out := "panic: send on closed channel\ngoroutine 7 [running]:\n"
	for port := 40000; port < 40019; port++ {
		out += fmt.Sprintf("Listening on 127.0.0.1:%d\n", port)
	}
	got := lastLines(out, 20)
	assert.Contains(t, got, "panic: send on closed channel", "the traceback stays in view")
	assert.Contains(t, got, "Listening on 127.0.0.1:40018  [turncheck: 19 such lines, one after another, folded into the last]")
	assert.Equal(t, 3, strings.Count(got, "\n")+1)
	assert.Equal(t, "  a\n  b", lastLines("a\nb\n", 20), "lines that differ in more than numbers stay")
}
