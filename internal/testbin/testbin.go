// Package testbin builds the turncheck command for tests that run the
// reference server as a subprocess, as any server in another language is.
package testbin

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Turncheck builds cmd/turncheck into a temporary directory of tb's and
// returns the binary's path. It skips tb when the go tool is missing: such
// tests need a real server to run.
func Turncheck(tb testing.TB) string {
	tb.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		tb.Skip("building cmd/turncheck needs the go tool on PATH: ", err)
	}
	out, err := exec.Command(goTool, "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || gomod == "" {
		tb.Fatalf("go env GOMOD names no module: %v", err)
	}
	bin := filepath.Join(tb.TempDir(), "turncheck")
	build := exec.Command(goTool, "build", "-o", bin, "./cmd/turncheck")
	build.Dir = filepath.Dir(gomod)
	if msgs, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("go build ./cmd/turncheck: %v\n%s", err, msgs)
	}
	return bin
}
