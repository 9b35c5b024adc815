// Package tmpfs puts a test binary's temporary files in memory where the
// machine has a tmpfs with room for them.
//
// The tests start servers by the thousand, each on a new data dir: a
// SQLite store made there, a PostgreSQL cluster copied there. On a disk,
// each costs the kernel file creations, fsyncs and discards, about four
// times the CPU it costs on a tmpfs, and the suite is CPU-bound. What the
// tests hold the stores to is unchanged: their crashes are kill -9 of a
// process, whose writes the page cache keeps on a disk and on a tmpfs
// alike; no test crashes the machine.
package tmpfs

// dir is the tmpfs tried, and room the space it must have free: a
// PostgreSQL cluster is about 40 MB, and a test binary runs a few at once.
const (
	dir  = "/dev/shm"
	room = 2 << 30
)

// Use points TMPDIR (os.TempDir, and every server the test binary
// starts) at /dev/shm, where it is a tmpfs with 2 GiB free, unless TMPDIR
// is set already: a user's choice stands. Call it first in TestMain.
func Use() { use() }
