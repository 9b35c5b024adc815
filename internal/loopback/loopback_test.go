package loopback_test

import (
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/loopback"
)

// TestServerCloseResets: a connection the server closes resets the client,
// which is what keeps the server's port free of TIME_WAIT entries.
func TestServerCloseResets(t *testing.T) {
	ln, err := loopback.Listen("")
	require.NoError(t, err)
	defer ln.Close()
	assert.Equal(t, "127.0.0.1", ln.Addr().(*net.TCPAddr).IP.String(), "loopback by default")

	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer client.Close()
	server := <-accepted
	require.NotNil(t, server)
	require.NoError(t, server.Close())

	_, err = client.Read(make([]byte, 1))
	require.Error(t, err)
	assert.False(t, errors.Is(err, io.EOF), "a FIN, not a reset: %v", err)
	assert.True(t, errors.Is(err, syscall.ECONNRESET), "want connection reset, got %v", err)
}

func TestListenError(t *testing.T) {
	_, err := loopback.Listen("not an address")
	assert.Error(t, err)
}

// TestFreeAddr: the addresses picked are loopback ones, on ports below the
// machine's range for outgoing connections (where no listener on port 0
// can be given them), free when picked, and never picked twice by one
// process, though each was let go at once.
func TestFreeAddr(t *testing.T) {
	lo, _, known := loopback.EphemeralPorts()
	seen := map[string]bool{}
	for range 50 {
		addr, err := loopback.FreeAddr()
		require.NoError(t, err)
		host, port, err := net.SplitHostPort(addr)
		require.NoError(t, err)
		assert.Equal(t, "127.0.0.1", host)
		if known {
			n, err := strconv.Atoi(port)
			require.NoError(t, err)
			assert.Less(t, n, lo, "a port in the range for outgoing connections")
		}
		assert.False(t, seen[addr], "%s picked twice", addr)
		seen[addr] = true
		ln, err := net.Listen("tcp", addr)
		require.NoError(t, err, "free when picked")
		require.NoError(t, ln.Close())
	}
}
