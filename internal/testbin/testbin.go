// Package testbin builds the turncheck command for tests that run the
// reference server as a subprocess, as any server in another language is.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The binary shared by a test binary's tests, when its TestMain wraps m
// with Main: linking cmd/turncheck costs seconds of CPU, and a package's
// tests would otherwise link it once each.
var (
	wrapped bool
	shared  struct {
		once sync.Once
		dir  string
		bin  string
		err  error
	}
)

// Main wraps a test binary's m (a *testing.M, or a wrapper of one): its
// tests then share one build of cmd/turncheck, removed after they have
// run. Use it as procs.Checked(testbin.Main(m)).
func Main(m interface{ Run() int }) interface{ Run() int } {
	wrapped = true
	return mainRunner{m}
}

type mainRunner struct{ m interface{ Run() int } }

func (r mainRunner) Run() int {
	code := r.m.Run()
	if shared.dir != "" {
		if err := os.RemoveAll(shared.dir); err != nil {
			fmt.Fprintf(os.Stderr, "testbin: %v\n", err)
			return 1
		}
	}
	return code
}

// Turncheck builds cmd/turncheck and returns the binary's path: once for
// the test binary where its TestMain uses Main, else into a temporary
// directory of tb's. It skips tb when the go tool is missing: such tests
// need a real server to run.
func Turncheck(tb testing.TB) string {
	tb.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		tb.Skip("building cmd/turncheck needs the go tool on PATH: ", err)
	}
	if !wrapped {
		bin, err := build(goTool, tb.TempDir())
		if err != nil {
			tb.Fatal(err)
		}
		return bin
	}
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "turncheck-bin-*"); shared.err == nil {
			shared.bin, shared.err = build(goTool, shared.dir)
		}
	})
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	return shared.bin
}

// build builds cmd/turncheck into dir.
func build(goTool, dir string) (string, error) {
	out, err := exec.Command(goTool, "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || gomod == "" {
		return "", fmt.Errorf("go env GOMOD names no module: %v", err)
	}
	bin := filepath.Join(dir, "turncheck")
	build := exec.Command(goTool, "build", "-o", bin, "./cmd/turncheck")
	build.Dir = filepath.Dir(gomod)
	if msgs, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/turncheck: %v\n%s", err, msgs)
	}
	return bin, nil
}
