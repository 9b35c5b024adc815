package tmpfs

import (
	"os"
	"syscall"
)

// tmpfsMagic is a tmpfs's f_type in statfs(2).
const tmpfsMagic = 0x01021994

func use() {
	if os.Getenv("TMPDIR") != "" {
		return
	}
	var fs syscall.Statfs_t
	if syscall.Statfs(dir, &fs) != nil || fs.Type != tmpfsMagic || fs.Bavail*uint64(fs.Bsize) < room {
		return
	}
	// Writable by this user, and its files kept from others (the sticky
	// bit /dev/shm has, as /tmp does).
	if syscall.Access(dir, 2|1) != nil {
		return
	}
	os.Setenv("TMPDIR", dir)
}
