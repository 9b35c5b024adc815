// Package fronttest runs a front for tests: a round-robin HTTP reverse
// proxy on loopback, as a load balancer in front of a server's replicas
// is, sending request i to upstream i mod n. A profile names it
// (server.front) the way it names the nginx or HAProxy a user runs.
package fronttest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/turncheck/turncheck/internal/loopback"
)

// Front is a running front.
type Front struct {
	// URL is where clients send requests; Upstreams are where it sends
	// them on, in turn: loopback addresses it picked, free when it
	// started, that the harness is to listen on.
	URL       string
	Upstreams []string
	srv       *http.Server
	transport *http.Transport
	next      atomic.Uint64
	served    []atomic.Int64
	// log is nginx's access log, for a front that is nginx.
	log string
}

// Start starts a front for n upstreams; it stops when t ends.
func Start(t testing.TB, n int) *Front {
	t.Helper()
	f := &Front{served: make([]atomic.Int64, n),
		transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 5 * time.Second}}
	for range n {
		addr, err := loopback.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		f.Upstreams = append(f.Upstreams, addr)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.URL = "http://" + ln.Addr().String()
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			i := int((f.next.Add(1) - 1) % uint64(n))
			r.SetURL(&url.URL{Scheme: "http", Host: f.Upstreams[i]})
			r.Out = r.Out.WithContext(context.WithValue(r.Out.Context(), upstreamKey{}, i))
		},
		Transport: f.transport,
		// A stream's chunks go on as they come, as a front configured
		// for server-sent events passes them.
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			if i, ok := resp.Request.Context().Value(upstreamKey{}).(int); ok && resp.StatusCode < 500 {
				f.served[i].Add(1)
			}
			return nil
		},
	}
	f.srv = &http.Server{Handler: proxy, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = f.srv.Serve(ln) }()
	t.Cleanup(f.Close)
	return f
}

type upstreamKey struct{}

// Served is how many requests each upstream answered with a status below
// 500, in order.
func (f *Front) Served() []int64 {
	if f.log != "" {
		return f.nginxServed()
	}
	out := make([]int64, len(f.served))
	for i := range f.served {
		out[i] = f.served[i].Load()
	}
	return out
}

// Close stops the front and closes its connections; nginx stops when its
// test ends.
func (f *Front) Close() {
	if f.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := f.srv.Shutdown(ctx); errors.Is(err, context.DeadlineExceeded) {
		_ = f.srv.Close()
	}
	f.transport.CloseIdleConnections()
}
