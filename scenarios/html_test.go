//go:build unix

package scenarios_test

import (
	"bytes"
	"context"
	"errors"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/sut"
)

// browserTimeout bounds each page load in the browser.
const browserTimeout = 60 * time.Second

var (
	// violatingStep is the op that broke the invariant, as Chromium
	// serializes it: an op holds no nested div.
	violatingStep = regexp.MustCompile(`(?s)<div[^>]*\bid="violating-step"[^>]*>(.*?)</div>`)
	violationText = regexp.MustCompile(`(?s)<pre[^>]*\bid="violation"[^>]*>(.*?)</pre>`)
	tags          = regexp.MustCompile(`<[^>]*>`)
)

// TestHTMLReportInBrowser loads the HTML report and porcupine's page in
// headless Chromium and checks the DOM the browser built: the report shows
// the violating step and the violation, and porcupine's inline script ran
// (offline, from a file) and drew its SVG.
func TestHTMLReportInBrowser(t *testing.T) {
	browser := findChromium(t)

	res, err := scenarios.Check(scenarios.Reference{Mutant: sut.NoConversationLock},
		scenarios.Options{Checks: 50, Seed: 1, ShrinkTime: 2 * time.Second})
	require.NoError(t, err)
	require.NotNil(t, res.Failure, "no-conversation-lock not caught (seed %d)", res.Seed)
	v := res.Failure.Violation
	require.NotNil(t, v, "the failure has no violation")
	rep := scenarios.NewReport(res, scenarios.ServerSpec{Kind: "reference", Mutant: "no-conversation-lock", Concurrency: "serialize"})

	t.Run("report", func(t *testing.T) {
		var page bytes.Buffer
		require.NoError(t, rep.WriteHTML(&page))
		dom := dumpDOM(t, browser, "report.html", page.Bytes())

		steps := violatingStep.FindAllStringSubmatch(dom, -1)
		require.Len(t, steps, 1, "one element with id violating-step in the DOM")
		assert.Contains(t, text(steps[0][1]), string(v.Turn), "the violating step names the violating turn")

		pre := violationText.FindStringSubmatch(dom)
		require.NotNil(t, pre, "no <pre id=violation> in the DOM")
		assert.Equal(t, v.Error(), text(pre[1]))
	})

	t.Run("linearizability", func(t *testing.T) {
		var page bytes.Buffer
		require.NoError(t, scenarios.WriteLinearizability(&page, res.Failure.History))
		const drawn = `class="history-rect"`
		require.NotContains(t, page.String(), drawn, "the page as written must not hold the SVG already")
		dom := dumpDOM(t, browser, "linearizability.html", page.Bytes())
		// As written, the page holds only the legend's <svg> and an empty
		// canvas; its script draws the history into the canvas.
		assert.True(t, strings.Contains(dom, drawn),
			"no %s in the DOM (%d bytes): porcupine's script did not draw the history", drawn, len(dom))
	})
}

// text is an HTML fragment's text: tags dropped, entities decoded.
func text(fragment string) string { return html.UnescapeString(tags.ReplaceAllString(fragment, "")) }

// findChromium returns the path of a Chromium binary, or skips the test.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Skip("headless Chromium not found (apt-get install chromium); the HTML report was not loaded in a browser")
	return ""
}

// dumpDOM writes page to a file, loads it in headless Chromium, and returns
// the DOM after the page has loaded and its scripts have run. Chromium runs
// in its own process group, which is killed when the load ends or times
// out; its crash handler leaves the group (it starts its own session), so
// it is found by the temporary home it was given. None of Chromium's
// processes outlive the call.
func dumpDOM(t *testing.T, browser, name string, page []byte) string {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(file, page, 0o644))

	ctx, cancel := context.WithTimeout(t.Context(), browserTimeout)
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
	require.NoError(t, ctx.Err(), "Chromium did not load %s within %s; stderr:\n%s", name, browserTimeout, stderr.String())
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
