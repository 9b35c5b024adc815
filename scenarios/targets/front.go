package targets

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/turncheck/turncheck/internal/loopback"
)

// Front is a load balancer someone else runs in front of a server's
// replicas (nginx, HAProxy, a cloud's): the client sends every request to
// URL, and the front decides which replica serves it. The front reaches
// replica i at Upstreams[i], a loopback address where the harness
// listens and passes what comes on to the replica, wherever the replica
// listens since its last start: a replica restarts on a port of its own,
// and the front's configuration never changes. The harness starts the
// replicas, never the front.
type Front struct {
	URL       string
	Upstreams []string
}

// Check says what is wrong with f for a server of n replicas, nil if
// nothing.
func (f Front) Check(n int) error {
	if err := checkLoopbackURL(f.URL); err != nil {
		return fmt.Errorf("url: %w", err)
	}
	if n < 2 {
		return errors.New("a front serves two replicas or more: set server.replicas")
	}
	if len(f.Upstreams) != n {
		return fmt.Errorf("upstreams: %d address(es) for %d replicas: want one per replica, in order", len(f.Upstreams), n)
	}
	seen := map[string]bool{}
	lo, hi, known := loopback.EphemeralPorts()
	for _, a := range f.Upstreams {
		if err := checkLoopbackAddr(a); err != nil {
			return fmt.Errorf("upstreams: %w", err)
		}
		_, port, _ := net.SplitHostPort(a)
		if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
			return fmt.Errorf("upstreams: %s: want a port from 1 to 65535", a)
		} else if known && p >= lo && p <= hi {
			// The harness listens there anew each time the replica
			// restarts: in the moment it is free, an outgoing connection
			// may take it.
			return fmt.Errorf("upstreams: %s: the port is in this machine's range for outgoing connections (%d-%d, net.ipv4.ip_local_port_range), any of which may take it while a replica restarts; pick ports below %d", a, lo, hi, lo)
		}
		if seen[a] {
			return fmt.Errorf("upstreams: %s twice: each replica needs an address of its own", a)
		}
		seen[a] = true
	}
	return nil
}

// wait waits, up to timeout, for the front to answer GET path below 500:
// it runs, and reaches a replica. The harness cannot start it, so the
// error says what to start, and where it must send.
func (f Front) wait(ctx context.Context, timeout time.Duration, path string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(f.URL, "/")+path, nil)
		if err != nil {
			return fmt.Errorf("front: %w", err)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return nil
			}
			last = fmt.Sprintf("it answers GET %s with %s", path, resp.Status)
		} else {
			last = "it does not answer: " + err.Error()
		}
		select {
		case <-ctx.Done():
			sends := make([]string, len(f.Upstreams))
			for i, a := range f.Upstreams {
				sends[i] = fmt.Sprintf("replica %d to %s", i, a)
			}
			return fmt.Errorf("the front at %s is not ready after %s (%s): turncheck starts the replicas, not the front; start it, sending %s (server.front.upstreams)",
				f.URL, timeout, last, strings.Join(sends, ", "))
		case <-time.After(50 * time.Millisecond):
		}
	}
}
