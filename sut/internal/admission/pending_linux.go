package admission

import (
	"net"
	"syscall"
	"unsafe"
)

// pendingInput reports whether c has bytes its kernel received that
// nobody has read yet: a request that came on an idle connection while
// the server had no CPU to read it.
func pendingInput(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var n int32
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	}); err != nil || errno != 0 {
		return false
	}
	return n > 0
}
