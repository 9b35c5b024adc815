//go:build unix

// Package browser loads pages in headless Chromium for tests: the HTML a
// person opens is checked in the DOM a browser builds from it, its
// scripts run, not as text. Chromium is found on PATH (.ci/run installs
// it); a test skips without it. No Chromium process outlives a load.
package browser

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// timeout bounds each page load.
const timeout = 60 * time.Second

// Find returns the path of a Chromium binary, or skips the test.
func Find(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Skip("headless Chromium not found (apt-get install chromium); the HTML report was not loaded in a browser")
	return ""
}

// DumpDOM writes page to a file, loads it in headless Chromium, and returns
// the DOM after the page has loaded and its scripts have run. Chromium runs
// in its own process group, which is killed when the load ends or times
// out; its crash handler leaves the group (it starts its own session), so
// it is found by the temporary home it was given. None of Chromium's
// processes outlive the call.
func DumpDOM(t *testing.T, browser, name string, page []byte) string {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(file, page, 0o644))

	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, browser,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir="+filepath.Join(dir, "profile"),
		"--no-first-run", "--no-default-browser-check", "--disable-extensions",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--mute-audio",
		"--dump-dom", "file://"+file)
	cmd.Env = append(os.Environ(), "HOME="+dir) // keep Chromium's caches out of the real home
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second // stop waiting on a helper that still holds stdout
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr

	start := time.Now()
	err := cmd.Run()
	// Whatever Chromium left behind in its group goes too.
	if kerr := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
		t.Logf("killing Chromium's process group: %v", kerr)
	}
	if left := killStragglers(dir); len(left) > 0 {
		t.Errorf("Chromium processes outlived the load of %s: %v", name, left)
	}
	require.NoError(t, ctx.Err(), "Chromium did not load %s within %s; stderr:\n%s", name, timeout, stderr.String())
	require.NoError(t, err, "Chromium failed on %s; stderr:\n%s", name, stderr.String())
	t.Logf("Chromium loaded %s (%d bytes) in %s", name, len(page), time.Since(start).Round(time.Millisecond))
	dom := stdout.String()
	require.True(t, strings.Contains(dom, "<html"), "Chromium dumped no DOM for %s; stderr:\n%s", name, stderr.String())
	return dom
}

// killStragglers kills the processes whose command line names dir (a
// directory only this test's Chromium was given, so only Chromium's helpers
// name it) and waits up to two seconds for them to go; it returns the pids
// still running then. Without /proc (not Linux) it finds nothing.
func killStragglers(dir string) []int {
	deadline := time.Now().Add(2 * time.Second)
	for {
		var left []int
		procs, _ := os.ReadDir("/proc")
		for _, p := range procs {
			pid, err := strconv.Atoi(p.Name())
			if err != nil {
				continue
			}
			// A process that has exited (a zombie) has an empty command line.
			cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
			if err != nil || !bytes.Contains(cmdline, []byte(dir+string(filepath.Separator))) {
				continue
			}
			left = append(left, pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}
