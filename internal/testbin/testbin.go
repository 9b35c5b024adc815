// Package testbin gives tests the turncheck command, for tests that run
// the reference server as a subprocess, as any server in another language
// is.
package testbin

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The binary of this test binary's tests: found once, as linking
// cmd/turncheck costs seconds of CPU.
var shared struct {
	once sync.Once
	bin  string
	err  error
}

// Turncheck returns the path of the turncheck command built from this
// module's source, in a directory that holds nothing else (a test may put
// it first on PATH). It is the go tool's own cached build (go.mod names
// cmd/turncheck a tool), linked statically (CGO_ENABLED=0): the test
// binaries of one 'go test ./...' share one link, and a later run none at
// all.
// It skips tb when the go tool is missing: such tests need a real server
// to run.
func Turncheck(tb testing.TB) string {
	tb.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		tb.Skip("building cmd/turncheck needs the go tool on PATH: ", err)
	}
	shared.once.Do(func() { shared.bin, shared.err = build(goTool) })
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	return shared.bin
}

// build builds cmd/turncheck into the go tool's cache, or finds it there,
// and returns its path. The test binaries of one 'go test' start at once:
// a lock on the module's directory lets one of them link while the others
// wait, then find its build. (Not on go.mod: the go tool locks that
// itself.)
func build(goTool string) (string, error) {
	out, err := exec.Command(goTool, "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("go env GOMOD names no module: %v", err)
	}
	root := filepath.Dir(gomod)
	unlock, err := lock(root)
	if err != nil {
		return "", fmt.Errorf("locking %s for the build of cmd/turncheck: %w", root, err)
	}
	defer unlock()
	var stderr strings.Builder
	find := exec.Command(goTool, "tool", "-n", "turncheck")
	find.Dir, find.Stderr = root, &stderr
	// Linked statically, without cgo: the suite starts the server
	// hundreds of times, and each start of a cgo build runs the dynamic
	// loader and libc's own start first. Nothing in the module needs
	// cgo; net and os/user have Go's own.
	find.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err = find.Output()
	if err != nil {
		return "", fmt.Errorf("go tool -n turncheck: %v\n%s", err, stderr.String())
	}
	bin := strings.TrimSpace(string(out))
	if filepath.Base(bin) != "turncheck" {
		return "", fmt.Errorf("go tool -n turncheck named %q, not a turncheck binary", bin)
	}
	if _, err := os.Stat(bin); err != nil {
		return "", errors.Join(errors.New("go tool -n turncheck named a binary that is not there"), err)
	}
	return bin, nil
}
