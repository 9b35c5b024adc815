package pgserver

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// procAttr returns how initdb and postgres run: as another user when we
// are root, as both refuse to run as root (postgres, else nobody), and
// killed with this process if it dies without stopping them.
func procAttr() (*syscall.SysProcAttr, error) {
	// SIGQUIT is PostgreSQL's immediate shutdown: its own children go too.
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGQUIT}
	if os.Geteuid() != 0 {
		return attr, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		if u, err = user.Lookup("nobody"); err != nil {
			return nil, fmt.Errorf("running as root, and neither a postgres nor a nobody user to run PostgreSQL as: %w", err)
		}
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	attr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
	return attr, nil
}

// prepareDirs makes dir traversable by all (the server's user may not be
// ours) and data, the cluster's directory, owned by the user attr runs as.
func prepareDirs(dir, data string, attr *syscall.SysProcAttr) error {
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(data, 0o700); err != nil {
		return err
	}
	if c := attr.Credential; c != nil {
		return os.Chown(data, int(c.Uid), int(c.Gid))
	}
	return nil
}
