//go:build unix

package faults

import (
	"net"
	"syscall"
)

// peerClosed reports whether the peer of c has closed its end: a peek
// that does not wait reads the end of the stream (or a reset). Data
// waiting, or nothing yet, is an open connection.
func peerClosed(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = err == nil && n == 0 || err == syscall.ECONNRESET
	})
	return closed
}
