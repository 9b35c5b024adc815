package fleet

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/scenarios/targets"
)

// echoServer answers each line on a connection with the same line, on
// loopback, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// echo sends a line on c and reads the answer, within a bound.
func echo(c net.Conn) error {
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && line != "ping\n" {
		err = errors.New("echoed " + line)
	}
	return err
}

// TestLinkFaults: each network fault breaks a proxied link as it says,
// on a connection open when it comes and on one opened while it holds;
// once healed, the link carries a new connection again, on the same
// port; the proxies leave no goroutine behind (TestMain).
func TestLinkFaults(t *testing.T) {
	up := echoServer(t)
	ps := newProxies()
	defer ps.Close()
	require.NoError(t, ps.AddClient(0, "127.0.0.1:0", "http://"+up))
	addr := ps.client[0].Listen
	host, _, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", host)
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		return c
	}
	healthy := func(when string) {
		t.Helper()
		c := dial()
		defer c.Close()
		require.NoError(t, echo(c), when)
	}
	healthy("before any fault")
	for _, f := range []targets.NetFault{
		{Link: targets.ClientLink, Kind: targets.Latency, Millis: 50},
		{Link: targets.ClientLink, Kind: targets.Reset},
		{Link: targets.ClientLink, Kind: targets.Cut, Millis: 100},
		{Link: targets.ClientLink, Kind: targets.Partition},
	} {
		open := dial()
		require.NoError(t, echo(open))
		// From before the fault: a cut's dark spell starts as it is
		// put in place, inside Break.
		start := time.Now()
		heal, err := ps.Break(0, f)
		require.NoError(t, err, "%s", f)
		err = echo(open)
		took := time.Since(start)
		switch f.Kind {
		case targets.Latency:
			assert.NoError(t, err, "%s", f)
			assert.GreaterOrEqual(t, took, 2*50*time.Millisecond, "a round trip through %s", f)
		case targets.Reset, targets.Partition:
			assert.Error(t, err, "%s: the open connection is closed", f)
		case targets.Cut:
			assert.Error(t, err, "%s: nothing comes back, then the connection closes", f)
			assert.GreaterOrEqual(t, took, 100*time.Millisecond, "%s: dark first", f)
		}
		// A connection opened while the fault holds.
		c, err := net.Dial("tcp", addr)
		switch {
		case f.Kind == targets.Latency:
			require.NoError(t, err)
			assert.NoError(t, echo(c), "%s", f)
		default:
			require.NoError(t, err)
			assert.Error(t, echo(c), "%s: a new connection breaks too", f)
		}
		for _, c := range []net.Conn{c, open} {
			if c != nil {
				// More comes after the fault closed it: a proxy that
				// stopped reading there leaves a goroutine behind.
				_, _ = c.Write([]byte("more\n"))
				_ = c.Close()
			}
		}
		require.NoError(t, heal(), "%s", f)
		healthy("after " + f.String())
	}
	_, err = ps.Break(0, targets.NetFault{Link: targets.StoreLink, Kind: targets.Reset})
	assert.Error(t, err, "no store link through the harness")
	_, err = ps.Break(0, targets.NetFault{Link: targets.ClientLink, Kind: targets.Cut})
	assert.Error(t, err, "a cut of no duration")
}
