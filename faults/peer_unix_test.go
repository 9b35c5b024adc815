//go:build unix

package faults

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPeerClosed: a connection whose peer closed its end reads as closed
// at once, with no wait; one open, even with data waiting, does not.
func TestPeerClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server, err := ln.Accept()
	require.NoError(t, err)
	defer server.Close()

	assert.False(t, peerClosed(server), "open, nothing sent")
	_, err = client.Write([]byte("x"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var b [1]byte
		return peek(server, b[:]) == 1
	}, guardPeer, time.Millisecond, "the byte arrives")
	assert.False(t, peerClosed(server), "open, a byte waiting")
	var b [1]byte
	_, err = server.Read(b[:])
	require.NoError(t, err)
	require.NoError(t, client.Close())
	// On loopback the peer's FIN is in before its close returns.
	assert.True(t, peerClosed(server), "the peer closed its end")
}

// guardPeer bounds a test's wait for a byte to arrive on loopback.
const guardPeer = 10 * time.Second

// peek is how many bytes a read of c that does not wait or consume would
// give: 0 at the end of the stream, -1 when none is waiting.
func peek(c net.Conn, b []byte) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	n := -1
	_ = raw.Control(func(fd uintptr) {
		if m, _, err := syscall.Recvfrom(int(fd), b, syscall.MSG_PEEK|syscall.MSG_DONTWAIT); err == nil {
			n = m
		}
	})
	return n
}
