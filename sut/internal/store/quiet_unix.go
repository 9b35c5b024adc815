//go:build unix

package store

import (
	"errors"
	"net"
	"syscall"
)

// quiet reports whether c is open both ways with nothing waiting to be
// read, as an idle connection to PostgreSQL is: looked at with a peek
// that neither waits nor takes a byte, so without a round trip. A
// connection its peer (or a proxy between) closed reads as its end, one
// reset as an error, and a message the server sent unasked as bytes
// waiting: none of them is quiet.
func quiet(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	// Control, not Read: pgx may leave a read of its own waiting on an
	// idle connection (its background reader), which Read would wait
	// behind for good. A peer's close stays to be seen after that read
	// took it: a socket at its end reads 0 bytes every time.
	still := false
	var b [1]byte
	err = rc.Control(func(fd uintptr) {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		still = errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK)
	})
	return err == nil && still
}
