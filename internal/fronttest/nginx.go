package fronttest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/turncheck/turncheck/internal/loopback"
)

// ErrNoNginx is returned by NginxPath where no nginx is installed.
var ErrNoNginx = errors.New("no nginx installed (Debian's nginx-light has it)")

// NginxPath is the nginx binary: on PATH, or where Debian puts it.
func NginxPath() (string, error) {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", nil
	}
	return "", ErrNoNginx
}

// nginxConf is an nginx front for a server's replicas as its operators
// would write one: each request to the upstream with the fewest in flight
// (least_conn), keep-alive connections
// to them, streams passed on unbuffered, the client's Host passed on (a
// server that guards against DNS rebinding answers only to its own,
// loopback names: nginx would send "replicas"), nginx's defaults
// otherwise (an
// upstream that fails is left out for 10 s; a request that could not be
// sent to one goes to the next, one that was sent is never sent again).
// It logs each request's upstream and its status, for Served.
const nginxConf = `%s
daemon off;
master_process on;
worker_processes 1;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 1024; }
http {
	log_format served '$upstream_addr|$upstream_status';
	access_log %[2]s/access.log served;
	client_body_temp_path %[2]s/body;
	proxy_temp_path %[2]s/proxy;
	fastcgi_temp_path %[2]s/fastcgi;
	uwsgi_temp_path %[2]s/uwsgi;
	scgi_temp_path %[2]s/scgi;
	upstream replicas {
		least_conn;
%[3]s		keepalive 16;
	}
	server {
		listen %[4]s;
		location / {
			proxy_pass http://replicas;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_set_header Host $http_host;
			proxy_buffering off;
		}
	}
}
`

// Nginx starts nginx as the front of n upstreams, on loopback, in a
// temporary directory of its own; it stops when t ends. The test skips
// where no nginx is installed.
func Nginx(t testing.TB, n int) *Front {
	t.Helper()
	bin, err := NginxPath()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	f := &Front{}
	var servers strings.Builder
	for range n {
		addr, err := loopback.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		f.Upstreams = append(f.Upstreams, addr)
		fmt.Fprintf(&servers, "\t\tserver %s;\n", addr)
	}
	user := ""
	if os.Geteuid() == 0 {
		// Its worker writes into the test's directory, which is root's.
		user = "user root;"
	}
	f.URL = "http://" + runNginx(t, bin, dir, func(listen string) []byte {
		return fmt.Appendf(nil, nginxConf, user, dir, servers.String(), listen)
	})
	f.log = filepath.Join(dir, "access.log")
	return f
}

// NginxFile starts nginx from an operator's configuration file (such as
// profiles/nginx-front.conf), whose front listens on listen and sends to
// upstreams: each of those addresses is replaced by a free loopback one
// (the upstreams on ports below the range for outgoing connections, as
// the harness requires), so that tests run at once never share a port.
// The file's paths must be relative to nginx's prefix, a temporary
// directory here, and its access log, access.log there, must log
// "$upstream_addr|$upstream_status" for Served. nginx runs in the
// foreground whatever the file says, and stops when t ends; the test
// skips where no nginx is installed.
func NginxFile(t testing.TB, path, listen string, upstreams []string) *Front {
	t.Helper()
	bin, err := NginxPath()
	if err != nil {
		t.Skip(err)
	}
	conf, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(conf)
	f := &Front{}
	pairs := []string{}
	for _, old := range upstreams {
		addr, err := loopback.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		f.Upstreams = append(f.Upstreams, addr)
		pairs = append(pairs, old, addr)
	}
	pairs = append(pairs, "daemon on;", "daemon off;")
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(text, pairs[i]) {
			t.Fatalf("%s: no %q in it", path, pairs[i])
		}
	}
	if !strings.Contains(text, listen) {
		t.Fatalf("%s: no %q in it", path, listen)
	}
	if os.Geteuid() == 0 {
		// Its worker writes into the test's directory, which is root's.
		text = "user root;\n" + text
	}
	dir := t.TempDir()
	f.URL = "http://" + runNginx(t, bin, dir, func(addr string) []byte {
		return []byte(strings.NewReplacer(append(pairs, listen, addr)...).Replace(text))
	})
	f.log = filepath.Join(dir, "access.log")
	return f
}

// nginxTries is how many listen addresses runNginx tries before it
// gives up: another process may take a free one before nginx binds it.
const nginxTries = 5

// runNginx runs nginx, in the foreground with prefix dir, with the
// configuration conf gives for a listen address, until nginx itself
// answers there, and returns that address; nginx stops when t ends.
func runNginx(t testing.TB, bin, dir string, conf func(listen string) []byte) string {
	t.Helper()
	for try := 1; ; try++ {
		listen, err := loopback.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		log, err := startNginx(t, bin, dir, conf(listen), listen)
		switch {
		case err == nil:
			return listen
		case try < nginxTries && strings.Contains(log, "Address already in use"):
			continue
		}
		t.Fatalf("nginx on %s: %v\n%s", listen, err, log)
	}
}

// startNginx starts nginx with conf and waits until it answers on
// listen: with its own Server header, for a port free a moment ago may
// have gone to another process's server, which a mere connection would
// reach as well. On failure nginx is stopped, and log is its error log.
func startNginx(t testing.TB, bin, dir string, conf []byte, listen string) (log string, err error) {
	t.Helper()
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	errorLog := filepath.Join(dir, "error.log")
	args := []string{"-p", dir, "-c", path, "-e", errorLog}
	if out, err := exec.Command(bin, append([]string{"-t"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("nginx -t: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	stop := func() {
		// SIGQUIT: the master lets its worker finish, then both exit.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGQUIT)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	readLog := func() string {
		b, _ := os.ReadFile(errorLog)
		return string(b)
	}
	for start := time.Now(); ; {
		if answersAsNginx(listen) {
			t.Cleanup(stop)
			return "", nil
		}
		select {
		case <-done:
			return readLog(), errors.New("nginx exited at its start")
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(start) > 10*time.Second {
			stop()
			return readLog(), errors.New("nginx did not answer within 10s")
		}
	}
}

// answersAsNginx reports whether nginx itself answers on addr: a request
// with no Host header is one nginx refuses (400) without sending it to an
// upstream, which would count as a failure of that upstream, and its
// answer names nginx in its Server header.
func answersAsNginx(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nConnection: close\r\n\r\n"); err != nil {
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return strings.HasPrefix(resp.Header.Get("Server"), "nginx")
}

// nginxServed counts, from nginx's access log, the requests each
// upstream answered with a status below 500. A request nginx tried on
// several upstreams logs each ("A, B" and "502, 200"): the answer is the
// last one's.
func (f *Front) nginxServed() []int64 {
	out := make([]int64, len(f.Upstreams))
	file, err := os.Open(f.log)
	if err != nil {
		return out
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		addrs, statuses, ok := strings.Cut(sc.Text(), "|")
		status, err := strconv.Atoi(lastOf(statuses))
		if !ok || err != nil || status >= 500 {
			continue
		}
		if i := slices.Index(f.Upstreams, lastOf(addrs)); i >= 0 {
			out[i]++
		}
	}
	return out
}

// lastOf is the last of nginx's comma-separated values.
func lastOf(list string) string {
	parts := strings.Split(list, ",")
	return strings.TrimSpace(parts[len(parts)-1])
}
