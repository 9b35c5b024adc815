//go:build !linux

package admission

import "net"

// pendingInput reports whether c has bytes received and not read yet:
// known on Linux alone; elsewhere an idle connection is judged by its
// reads and writes only.
func pendingInput(net.Conn) bool { return false }
