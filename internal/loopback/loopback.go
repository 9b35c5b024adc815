// Package loopback listens on loopback for servers that the harness starts
// and stops by the thousand.
//
// A TCP connection closed first by its server leaves a TIME_WAIT entry on the
// server's port. The harness starts a fresh server on a fresh port for every
// state-machine run, so those entries pile up by the thousand, and once the
// kernel hands a new client the port pair of one of them, its SYN is taken
// for a stray of the old connection and answered only after a one-second
// retransmission. The listener here resets instead: a connection the server
// closes sends RST and leaves nothing behind. It is for harness-run servers
// only; a server meant for clients on a network should linger as usual.
package loopback

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
)

// Listen listens on addr ("127.0.0.1:0" when empty) with connections that
// reset on close.
func Listen(addr string) (net.Listener, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return resetting{ln}, nil
}

type resetting struct{ net.Listener }

// Accept accepts a connection whose Close resets it.
func (l resetting) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	return c, nil
}

// EphemeralPorts is the range of ports this machine gives outgoing
// connections (Linux's net.ipv4.ip_local_port_range); known is false
// where it cannot be read.
func EphemeralPorts() (lo, hi int, known bool) {
	text, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, false
	}
	if _, err := fmt.Sscan(string(text), &lo, &hi); err != nil || lo > hi {
		return 0, 0, false
	}
	return lo, hi, true
}

// FreeAddr is a loopback address ("127.0.0.1:PORT") free a moment ago, for
// a server the harness starts to listen on. Its port lies below the
// machine's range for outgoing connections (EphemeralPorts), where the
// kernel never hands out a port of its own choosing: a port picked in
// that range and closed may be given to any other process's listener on
// port 0 before the server binds it, and a readiness probe then reaches
// that other server and takes it for the one started. Below the range,
// only a process that picks ports itself can take it: this process never
// hands one out twice, and processes start their search at different
// ports.
func FreeAddr() (string, error) {
	lo, _, known := EphemeralPorts()
	if !known {
		lo = 32768
	}
	const first = 10000
	span := lo - first
	if span <= 0 {
		return "", fmt.Errorf("no ports below the range for outgoing connections (it starts at %d)", lo)
	}
	handed.Lock()
	defer handed.Unlock()
	if handed.ports == nil || len(handed.ports) >= span/2 {
		handed.ports = map[int]bool{}
	}
	start := (os.Getpid()*97 + len(handed.ports)*7) % span
	for i := range span {
		port := first + (start+i)%span
		if handed.ports[port] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		_ = ln.Close()
		handed.ports[port] = true
		return ln.Addr().String(), nil
	}
	return "", fmt.Errorf("no free loopback port from %d to %d", first, lo-1)
}

// handed is the ports FreeAddr handed out in this process.
var handed struct {
	sync.Mutex
	ports map[int]bool
}
