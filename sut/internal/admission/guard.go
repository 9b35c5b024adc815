package admission

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// A server without keys writes whatever it is sent into its conversations,
// so it must not take requests a web page made a browser send. Two checks
// guard it, before anything else of a request is looked at:
//
//   - Host: a DNS-rebinding page reaches a loopback server under its own
//     name (attacker.example resolving to 127.0.0.1), and the browser sends
//     that name. The server answers only to loopback names, the address the
//     connection came in on, and the names AllowedHosts adds (421 for any
//     other).
//   - Origin: a browser marks every POST with the page's origin. A page
//     that is not on loopback (or an allowed host) is refused (403).
//
// Clients that are not browsers send no Origin, and a Host of the address
// they dialled; the harness's 127.0.0.1:PORT passes both checks.

// normalizeHost returns h without its port and brackets, in lower case and
// without a trailing dot, as hosts are compared.
func normalizeHost(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// ParseAllowedHosts checks and normalizes Config.AllowedHosts: names or IP
// addresses, without a port.
func ParseAllowedHosts(hosts []string) ([]string, error) {
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		if _, _, err := net.SplitHostPort(h); err == nil {
			return nil, fmt.Errorf("allowed host %q: want a host name without a port", h)
		}
		n := normalizeHost(strings.TrimSpace(h))
		if n == "" || strings.ContainsAny(n, " /@?#") {
			return nil, fmt.Errorf("allowed host %q: want a host name", h)
		}
		out = append(out, n)
	}
	return out, nil
}

// isLoopbackName reports whether host (normalized) always means this
// machine.
func isLoopbackName(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckHost refuses a request whose Host names neither this machine's
// loopback, nor the address the request came in on, nor an allowed host.
// A request with no Host (HTTP/1.0) names nothing a browser could have
// been made to resolve, and passes.
func CheckHost(r *http.Request, allowedHosts []string) error {
	if r.Host == "" {
		return nil
	}
	host := normalizeHost(r.Host)
	if isLoopbackName(host) || slices.Contains(allowedHosts, host) {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil {
		// An address is no DNS name a page could rebind: it is fine when it
		// is the one the client dialled.
		if local, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok && local.IP.Equal(ip) {
			return nil
		}
	}
	return fmt.Errorf("this server does not answer to the host %.64q: use a loopback address (127.0.0.1, [::1], localhost), the address it listens on, or start it with --allow-host NAME", r.Host)
}

// CheckOrigin refuses a request a browser sent for a page that is not on
// this machine's loopback or an allowed host. Requests without an Origin
// (every client that is not a browser) pass.
func CheckOrigin(r *http.Request, allowedHosts []string) error {
	vals := r.Header.Values("Origin")
	if len(vals) == 0 {
		return nil
	}
	if len(vals) > 1 {
		return errors.New("more than one Origin header")
	}
	u, err := url.Parse(vals[0])
	if err == nil && u.Host != "" {
		host := normalizeHost(u.Host)
		if isLoopbackName(host) || slices.Contains(allowedHosts, host) {
			return nil
		}
	}
	return fmt.Errorf("cross-origin requests are refused (Origin %.64q): only pages on loopback or an allowed host may call this server", vals[0])
}
