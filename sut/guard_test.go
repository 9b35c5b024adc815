package sut_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// Who may call the server: Host and Origin (guard.go).

// postAs sends a turn of conv naming host in the Host header, with the
// given extra headers.
func (e *env) postAs(t *testing.T, host, body string, hdr map[string]string) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL()+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Host = host
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// TestHostMustBeThisServer: a DNS-rebinding page reaches the server under
// its own name; the server answers 421 to any Host that is not a loopback
// name, the address it listens on, or an allowed host, and nothing lands.
func TestHostMustBeThisServer(t *testing.T) {
	e := newEnv(t, sut.Config{AllowedHosts: []string{"Gateway.Example.", "10.1.2.3"}})
	_, port, err := net.SplitHostPort(addrOf(e.srv.URL()))
	require.NoError(t, err)
	body := chatBody(t, false, user("tc-u9 from a rebinding page"))
	for _, host := range []string{"attacker.example:" + port, "attacker.example", "localhost.attacker.example",
		"127.0.0.1.nip.io:" + port, "10.9.9.9:" + port, "gateway.example.attacker"} {
		t.Run(host, func(t *testing.T) {
			n := e.model.CallCount()
			r := e.postAs(t, host, body, headers("", "c1"))
			e.requireRefusal(t, r, http.StatusMisdirectedRequest, n)
		})
	}
	var want []string
	for i, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST.", "127.0.0.2", "[::1]:" + port,
		"gateway.example:" + port, "GATEWAY.EXAMPLE", "10.1.2.3:8080"} {
		tok := "u" + string(rune('1'+i))
		r := e.postAs(t, host, chatBody(t, false, user("tc-"+tok)), headers("", "c1"))
		assert.Equal(t, http.StatusOK, r.status, "Host %q: %s", host, r.body)
		want = append(want, tok, strings.Replace(tok, "u", "a", 1))
	}
	assert.Equal(t, toks(append(want, "u9")...), e.ok(t, "", "c1", "tc-u9"), "no refused turn landed")
}

// TestHostMayBeTheListenAddress: a server listening on an address that is
// not loopback answers to that address.
func TestHostMayBeTheListenAddress(t *testing.T) {
	var ip net.IP
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			ip = n.IP
			break
		}
	}
	if ip == nil {
		t.Skip("no non-loopback IPv4 address on this machine")
	}
	m := startModel(t)
	run, err := sut.Start(sut.Config{ModelURL: m.URL(), DataDir: t.TempDir()}, net.JoinHostPort(ip.String(), "0"))
	require.NoError(t, err)
	s := &server{Running: run}
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	e := &env{model: m, srv: s, client: newClient(t)}
	r := e.postAs(t, addrOf(run.URL()), chatBody(t, false, user("tc-u1")), nil)
	assert.Equal(t, http.StatusOK, r.status, "%s", r.body)
	n := m.CallCount()
	e.requireRefusal(t, e.postAs(t, "192.0.2.1", chatBody(t, false, user("tc-u2")), nil), http.StatusMisdirectedRequest, n)
}

// TestCrossOriginIsRefused: a page not on loopback gets 403, whatever it
// sends; nothing lands.
func TestCrossOriginIsRefused(t *testing.T) {
	e := newEnv(t, sut.Config{AllowedHosts: []string{"app.example"}})
	body := chatBody(t, false, user("tc-u9 from a web page"))
	for _, origin := range []string{"https://evil.example", "null", "http://localhost.evil.example", "file://", "http://127.0.0.1.evil.example:8080", "garbage"} {
		t.Run(origin, func(t *testing.T) {
			n := e.model.CallCount()
			hdr := headers("", "c1")
			hdr["Origin"] = origin
			e.requireRefusal(t, e.post(t, body, hdr), http.StatusForbidden, n)
			// Even with a Content-Type the page may not send without a
			// preflight: the Origin decides.
			hdr["Content-Type"] = "text/plain"
			r := e.post(t, body, hdr)
			assert.GreaterOrEqual(t, r.status, 400)
		})
	}
	var want []string
	for i, origin := range []string{"http://localhost:3000", "http://127.0.0.1:8080", "http://[::1]", "https://app.example"} {
		tok := "u" + string(rune('1'+i))
		hdr := headers("", "c1")
		hdr["Origin"] = origin
		r := e.post(t, chatBody(t, false, user("tc-"+tok)), hdr)
		assert.Equal(t, http.StatusOK, r.status, "Origin %q: %s", origin, r.body)
		want = append(want, tok, strings.Replace(tok, "u", "a", 1))
	}
	assert.Equal(t, toks(append(want, "u9")...), e.ok(t, "", "c1", "tc-u9"), "no refused turn landed")
}

func TestAllowedHostsAreChecked(t *testing.T) {
	m := startModel(t)
	for _, h := range []string{"", "host:8080", "http://host", "a b"} {
		s, err := sut.New(sut.Config{ModelURL: m.URL(), DataDir: t.TempDir(), AllowedHosts: []string{h}})
		if s != nil {
			_ = s.Close()
		}
		assert.Error(t, err, "allowed host %q", h)
	}
}
