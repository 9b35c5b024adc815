//go:build !linux

package pgserver

import (
	"errors"
	"syscall"
)

// procAttr refuses: PostgreSQL is run on Linux alone, where it can be made
// sure to die with the process that started it.
func procAttr() (*syscall.SysProcAttr, error) {
	return nil, errors.New("PostgreSQL is run on Linux only")
}

func prepareDirs(string, string, *syscall.SysProcAttr) error { return nil }
