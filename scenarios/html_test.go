//go:build unix

package scenarios_test

import (
	"bytes"
	"fmt"
	"html"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/browser"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/validate"
	"github.com/turncheck/turncheck/sut"
)

var (
	// violatingStep is the op that broke the invariant, as Chromium
	// serializes it: an op holds no nested div.
	violatingStep = regexp.MustCompile(`(?s)<div[^>]*\bid="violating-step"[^>]*>(.*?)</div>`)
	violationText = regexp.MustCompile(`(?s)<pre[^>]*\bid="violation"[^>]*>(.*?)</pre>`)
	tags          = regexp.MustCompile(`<[^>]*>`)
	sizeText      = regexp.MustCompile(`<span id="size">([^<]*)</span>`)
	// chart is an inline frame of porcupine's, as fit left it.
	chart = regexp.MustCompile(`<iframe class="chart"[^>]*>`)
	px    = regexp.MustCompile(`style="height: (\d+)px;?"`)
	fitAt = regexp.MustCompile(`data-content-height="(\d+)"`)
)

// assertChartsWhole: the DOM holds n charts, each in a frame at least as
// tall as the whole chart it holds, as measured in the browser: no box
// cuts it off.
func assertChartsWhole(t *testing.T, dom string, n int) {
	t.Helper()
	frames := chart.FindAllString(dom, -1)
	require.Len(t, frames, n, "charts in the page")
	for _, f := range frames {
		content, height := fitAt.FindStringSubmatch(f), px.FindStringSubmatch(f)
		require.NotNil(t, content, "the chart's frame was not sized to its content")
		require.NotNil(t, height, "the chart's frame has no height of its own")
		c, _ := strconv.Atoi(content[1])
		h, _ := strconv.Atoi(height[1])
		assert.Positive(t, c, "the chart has a height")
		assert.GreaterOrEqual(t, h, c, "the frame is as tall as its chart")
	}
	assert.Equal(t, n, strings.Count(dom, "<iframe"), "a frame that is not a chart: the failure is inline")
}

// TestHTMLReportInBrowser loads the HTML report and porcupine's page in
// headless Chromium and checks the DOM the browser built: the report shows
// the violating step and the violation, and porcupine's inline script ran
// (offline, from a file) and drew its SVG.
func TestHTMLReportInBrowser(t *testing.T) {
	t.Parallel()
	chromium := browser.Find(t)

	// Unshrunk, here and below: the pages show a failure as it was
	// found as they show one shrunk.
	res, err := scenarios.Check(reference.Target{Mutant: sut.NoConversationLock},
		scenarios.Options{Checks: 50, Seed: 1, ShrinkTime: time.Millisecond})
	require.NoError(t, err)
	require.NotNil(t, res.Failure, "no-conversation-lock not caught (seed %d)", res.Seed)
	v := res.Failure.Violation
	require.NotNil(t, v, "the failure has no violation")
	rep := report.NewReport(res, scenarios.ServerSpec{Kind: "reference", Mutant: "no-conversation-lock", Concurrency: "serialize"})

	t.Run("report", func(t *testing.T) {
		var page bytes.Buffer
		require.NoError(t, rep.WriteHTML(&page))
		dom := browser.DumpDOM(t, chromium, "report.html", page.Bytes())

		steps := violatingStep.FindAllStringSubmatch(dom, -1)
		require.Len(t, steps, 1, "one element with id violating-step in the DOM")
		assert.Contains(t, text(steps[0][1]), string(v.Turn), "the violating step names the violating turn")

		pre := violationText.FindStringSubmatch(dom)
		require.NotNil(t, pre, "no <pre id=violation> in the DOM")
		assert.Equal(t, v.Error(), text(pre[1]))

		// It counts what the text counts, by the same names.
		size := sizeText.FindStringSubmatch(dom)
		require.NotNil(t, size, "no size of the failing run in the DOM")
		assert.Contains(t, res.Failure.Report, "\n"+text(size[1])+":\n", "the text report's count of steps and requests")
		assert.Contains(t, runLine(dom), fmt.Sprintf("the run: %d check(s), %d request(s)", res.Stats.Checks, res.Stats.Steps))
		assert.Contains(t, res.Stats.Summary(), fmt.Sprintf("checks: %d, requests: %d ", res.Stats.Checks, res.Stats.Steps))
		assertChartsWhole(t, dom, 1)
	})

	t.Run("conformance page", func(t *testing.T) {
		c, err := scenarios.Conform(reference.Target{Mutant: sut.NoConversationLock},
			scenarios.Options{Checks: 3, Seed: 1, ShrinkTime: time.Millisecond})
		require.NoError(t, err)
		failures := c.Failures()
		require.NotEmpty(t, failures, "no-conversation-lock not caught")
		var page bytes.Buffer
		require.NoError(t, c.WriteHTML(&page, scenarios.ServerSpec{Kind: "reference", Mutant: "no-conversation-lock"}))
		dom := browser.DumpDOM(t, chromium, "index.html", page.Bytes())

		assert.Contains(t, runLine(dom), fmt.Sprintf("%d of %d check(s) ran, %d request(s)", c.Stats.Checks, c.Asked, c.Stats.Steps))
		assert.Contains(t, c.Text(scenarios.Profile{}), fmt.Sprintf("checks: %d, requests: %d ", c.Stats.Checks, c.Stats.Steps))
		// Each failure is inline, whole: its violation and its steps as
		// the text gives them, and its chart in a frame its own size.
		for _, f := range failures {
			section := regexp.MustCompile(`(?s)<section class="failure" id="failure-` + string(f.Violation.Invariant) + `">(.*?)</section>`).FindStringSubmatch(dom)
			require.NotNil(t, section, "no section of the %s failure", f.Violation.Invariant)
			pre := violationText.FindStringSubmatch(section[1])
			require.NotNil(t, pre)
			assert.Equal(t, f.Violation.Error(), text(pre[1]))
			size := sizeText.FindStringSubmatch(section[1])
			require.NotNil(t, size)
			assert.Contains(t, f.Report, "\n"+text(size[1])+":\n")
		}
		assertChartsWhole(t, dom, len(failures))
	})

	t.Run("linearizability", func(t *testing.T) {
		var page bytes.Buffer
		require.NoError(t, validate.WriteLinearizability(&page, res.Failure.History))
		const drawn = `class="history-rect"`
		require.NotContains(t, page.String(), drawn, "the page as written must not hold the SVG already")
		dom := browser.DumpDOM(t, chromium, "linearizability.html", page.Bytes())
		// As written, the page holds only the legend's <svg> and an empty
		// canvas; its script draws the history into the canvas.
		assert.True(t, strings.Contains(dom, drawn),
			"no %s in the DOM (%d bytes): porcupine's script did not draw the history", drawn, len(dom))
	})
}

// runLine is the text of the page's line about the run.
func runLine(dom string) string {
	m := regexp.MustCompile(`<p[^>]*\bid="run"[^>]*>(.*?)</p>`).FindStringSubmatch(dom)
	if m == nil {
		return ""
	}
	return text(m[1])
}

// text is an HTML fragment's text: tags dropped, entities decoded.
func text(fragment string) string { return html.UnescapeString(tags.ReplaceAllString(fragment, "")) }
