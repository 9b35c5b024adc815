//go:build !linux

package pgtest

import (
	"errors"
	"syscall"
)

// procAttr refuses: pgtest runs PostgreSQL on Linux alone, where it can
// make sure the server dies with the tests.
func procAttr() (*syscall.SysProcAttr, error) {
	return nil, errors.New("pgtest runs PostgreSQL on Linux only")
}

func prepareDirs(string, string, *syscall.SysProcAttr) error { return nil }
