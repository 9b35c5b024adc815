// Package procs finds the child processes of the current process, so that
// tests can show that no server they started outlives them.
package procs

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// Children returns the live child processes of this process, each as
// "PID (command)", read from /proc. Where there is no /proc (not Linux),
// it returns none and no error.
func Children() ([]string, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil || len(stats) == 0 {
		return nil, err
	}
	self := os.Getpid()
	var out []string
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue // it exited meanwhile
		}
		if err != nil {
			return nil, err
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses,
		// so the fields after it are read from the last ')'.
		s := string(b)
		end := strings.LastIndexByte(s, ')')
		start := strings.IndexByte(s, '(')
		if end < 0 || start < 0 || start > end {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 || fields[0] == "Z" {
			continue // a zombie is dead already; its parent reaps it
		}
		if ppid, err := strconv.Atoi(fields[1]); err == nil && ppid == self {
			out = append(out, fmt.Sprintf("%s (%s)", strings.TrimSpace(s[:start]), s[start+1:end]))
		}
	}
	return out, nil
}

// Checked wraps a test binary's m: after the tests have run, a child
// process still alive fails the binary, named. Use it as
// goleak.VerifyTestMain(procs.Checked(m)); m may be wrapped itself, as
// pgtest.Main(m) is, whose PostgreSQL stops before the check.
func Checked(m interface{ Run() int }) interface{ Run() int } { return checked{m} }

type checked struct{ m interface{ Run() int } }

func (c checked) Run() int {
	code := c.m.Run()
	kids, err := Children()
	if err != nil {
		fmt.Fprintf(os.Stderr, "procs: cannot list child processes: %v\n", err)
		return 1
	}
	if len(kids) > 0 {
		fmt.Fprintf(os.Stderr, "procs: child processes outlived the tests: %s\n", strings.Join(kids, ", "))
		return 1
	}
	return code
}

// WaitBound lets perCore parallel tests of the binary run at once per
// core, unless the command line says how many (-test.parallel): tests
// that mostly wait on the servers they start (quiet periods, time bounds,
// restarts) leave the cores idle at one a core. Call it from TestMain,
// before m.Run.
func WaitBound(perCore int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", strconv.Itoa(perCore*runtime.GOMAXPROCS(0)))
	}
}
