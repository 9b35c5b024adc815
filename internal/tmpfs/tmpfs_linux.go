package tmpfs

import (
	"os"
	"syscall"
)

// tmpfsMagic is a tmpfs's f_type in statfs(2); wOK and xOK are
// access(2)'s W_OK and X_OK, which package syscall does not name.
const (
	tmpfsMagic = 0x01021994
	wOK, xOK   = 2, 1
)

func use() {
	if os.Getenv("TMPDIR") != "" {
		return
	}
	var fs syscall.Statfs_t
	if syscall.Statfs(dir, &fs) != nil || fs.Type != tmpfsMagic || fs.Bavail*uint64(fs.Bsize) < room {
		return
	}
	// A directory this user may make its own in, as in /tmp.
	if syscall.Access(dir, wOK|xOK) != nil {
		return
	}
	os.Setenv("TMPDIR", dir)
}
