//go:build unix

package scenarios_test

import (
	"bytes"
	"html"
	"regexp"
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
)

// TestHTMLReportInBrowser loads the HTML report and porcupine's page in
// headless Chromium and checks the DOM the browser built: the report shows
// the violating step and the violation, and porcupine's inline script ran
// (offline, from a file) and drew its SVG.
func TestHTMLReportInBrowser(t *testing.T) {
	t.Parallel()
	chromium := browser.Find(t)

	res, err := scenarios.Check(reference.Target{Mutant: sut.NoConversationLock},
		scenarios.Options{Checks: 50, Seed: 1, ShrinkTime: 2 * time.Second})
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

// text is an HTML fragment's text: tags dropped, entities decoded.
func text(fragment string) string { return html.UnescapeString(tags.ReplaceAllString(fragment, "")) }
