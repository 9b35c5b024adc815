package report

import (
	"bytes"
	"html/template"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/scenarios/validate"
)

// fitScript sizes an inline frame (porcupine's chart) to its whole
// content once it has loaded, so that no fixed box cuts the chart off;
// it notes the height it found (data-content-height). A frame whose
// content it cannot read keeps the height its style gives it.
const fitScript = `<script>
function fit(f) {
	var d = f.contentDocument;
	if (!d || !d.documentElement) return;
	var h = Math.max(d.documentElement.scrollHeight, d.body ? d.body.scrollHeight : 0);
	f.style.height = (h + 24) + 'px';
	f.dataset.contentHeight = h;
}
</script>`

// failureTemplate renders a failure as the text report shows it: the
// violation, how far it was shrunk, its steps and requests counted as
// the text counts them, the timeline of the steps (each request, its
// injected fault, its outcome, what the model saw) with the violating one
// marked, and porcupine's visualisation of the history, each shown whole.
// Both the failure's own page and a conformance run's page show it.
const failureTemplate = `{{define "failure"}}
{{with .Failure}}{{with .Violation}}<pre id="violation">{{.Error}}</pre>{{end}}
{{if .Flaky}}<p class="fail">The failure did not reproduce when its steps were replayed.</p><p class="fail">This is the run that failed:</p>{{end}}
{{if .Violation}}<p class="muted" id="shrink">{{.ShrinkStats}}</p>{{end}}{{end}}
<h3>Timeline: <span id="size">{{.Size}}</span></h3>
{{range .Steps}}<div class="step"><b>{{.N}}. {{.Action}}</b>{{with .Earlier}} (a step of {{.}}, an earlier check on the same server whose messages the failing check met){{end}}
{{range .Ops}}{{if .Op.Restart}}<div class="op">server: {{.Op.Restart}}{{with .Op.Response.Detail}}: {{.}}{{end}}</div>{{else}}<div class="op{{if .Violating}} violating{{end}}"{{if .Violating}} id="violating-step"{{end}}>
<b>{{letter .Op.Index}})</b> {{.Op.Send.Conv}}{{with .Op.Send.Token}}, message <code>{{.}}</code>{{end}}{{if .Op.Request.ACP}}, a prompt{{else if .Op.Send.Stream}}, streamed{{end}}<br>
fault: {{.Op.Send}}<br>
outcome: {{.Op.Response.Outcome}}{{with .Op.Response.Status}} (status {{.}}){{end}}{{with .Op.Response.Detail}}: {{.}}{{end}}<br>
{{range .Op.Turn.Calls}}model saw: <code>{{tokens .History}}</code><br>{{end}}{{range .Op.Turn.Aux}}model saw, beside the turn: <code>{{tokens .History}}</code><br>{{end}}{{if not (or .Op.Turn.Calls .Op.Turn.Aux)}}model saw: {{noCall .Op}}<br>{{end}}
</div>{{end}}{{end}}</div>{{end}}
<h3>Linearizability</h3>
<p class="muted">Each conversation's turns as intervals per client, and how far they linearize (porcupine).</p>
<iframe class="chart" title="linearizability" onload="fit(this)" srcdoc="{{.Porcupine}}"></iframe>
{{end}}`

// failureStyle is the failure's styles, on either page.
const failureStyle = `.step{border-left:4px solid #ccc;margin:1em 0;padding:.2em 1em}
.op{margin:.4em 0 .4em 1em}.op.violating{background:#fee;border-left:4px solid #b00;padding-left:.5em}
code,pre{font-family:ui-monospace,monospace;font-size:.9em}pre{white-space:pre-wrap}.muted{color:#666}
iframe.chart{width:100%;height:32em;border:1px solid #ccc}`

var htmlFuncs = template.FuncMap{
	"tokens": model.FormatTokens,
	"letter": func(i int) string { return string(rune('a' + i)) },
	"noCall": noCall,
}

// htmlPage is the HTML report: the verdict, what the run counted (as the
// text summary counts it), and the failing run (failureTemplate).
// Everything is inline: it opens offline.
var htmlPage = template.Must(template.Must(template.New("report").Funcs(htmlFuncs).Parse(failureTemplate)).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>turncheck: {{.Verdict}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:72em}
.verdict{font-size:1.4em;font-weight:bold}.fail{color:#b00}.pass{color:#070}
` + failureStyle + `
</style>` + fitScript + `</head><body>
<h1>turncheck report</h1>
<p class="verdict {{if .Failure}}fail{{else}}pass{{end}}">{{.Verdict}}{{with .Failure}}{{with .Violation}}: {{.Invariant}} ({{.Invariant.Title}}) broken{{end}}{{end}}</p>
<p class="muted" id="run">server {{.Server.Kind}}{{with .Server.Mutant}}, mutant {{.}}{{end}}{{with .Server.Concurrency}}, concurrency {{.}}{{end}}{{with .Server.Interruption}}, interruption {{.}}{{end}}; seed {{.Seed}}; the run: {{.Stats.Checks}} check(s), {{.Stats.Steps}} request(s)</p>
{{if .Failure}}{{template "failure" .View}}{{end}}
</body></html>
`))

type htmlStep struct {
	N      int
	Action string
	// Earlier names the earlier check the step is of, "" for the failing
	// check's own.
	Earlier string
	Ops     []htmlOp
}

type htmlOp struct {
	Op        history.Op
	Violating bool
}

// failureView is what failureTemplate shows of a failure.
type failureView struct {
	Failure   *Failure
	Size      string
	Steps     []htmlStep
	Porcupine string
}

// view is what failureTemplate shows of f.
func view(f *Failure) (failureView, error) {
	data := failureView{Failure: f, Size: historySize(f.History)}
	var v *model.Violation = f.Violation
	for i, op := range f.History {
		if len(data.Steps) == 0 || data.Steps[len(data.Steps)-1].N != op.Step {
			data.Steps = append(data.Steps, htmlStep{N: op.Step, Action: history.Title(f.History, i)})
			if op.Earlier != (plan.Origin{}) {
				data.Steps[len(data.Steps)-1].Earlier = op.Earlier.String()
			}
		}
		s := &data.Steps[len(data.Steps)-1]
		violating := v != nil && op.Send.Conv == v.Conv && op.Send.Token == v.Turn &&
			op.Step == f.History[len(f.History)-1].Step
		s.Ops = append(s.Ops, htmlOp{Op: op, Violating: violating})
	}
	var b bytes.Buffer
	// The failing session's own: an earlier check's conversations are
	// others, whatever their names.
	own := f.History
	if n := len(own); n > 0 {
		own = slices.DeleteFunc(slices.Clone(own), func(op history.Op) bool { return op.Earlier != f.History[n-1].Earlier })
	}
	if err := validate.WriteLinearizability(&b, own); err != nil {
		return data, err
	}
	data.Porcupine = b.String()
	return data, nil
}

// WriteHTML writes the report as one self-contained HTML page.
func (r *Report) WriteHTML(w io.Writer) error {
	data := struct {
		*Report
		View failureView
	}{Report: r}
	if f := r.Failure; f != nil {
		v, err := view(f)
		if err != nil {
			return err
		}
		data.View = v
	}
	return htmlPage.Execute(w, data)
}

// runPage is the HTML page of a whole conformance run: the outcome, a
// verdict per invariant with what it rests on, each failure shown whole
// inline (failureTemplate), and what the run did: counts,
// warnings, the time spent, the server's last output. It opens offline.
var runPage = template.Must(template.Must(template.New("run").Funcs(htmlFuncs).Parse(failureTemplate)).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>turncheck conform: {{.Outcome}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}
.verdict{font-size:1.4em;font-weight:bold}.fail{color:#b00}.pass{color:#070}.other{color:#666}
table{border-collapse:collapse}td,th{padding:.3em .8em;text-align:left;vertical-align:top;border-bottom:1px solid #ddd}
` + failureStyle + `
section.failure{border-top:2px solid #ccc;margin-top:1.5em}
</style>` + fitScript + `</head><body>
<h1>turncheck conform</h1>
<p class="verdict {{.Class}}" id="outcome">{{.Outcome}}</p>
<p class="muted" id="run">server: {{.Server}}; seed {{.Seed}}; {{.Stats.Checks}} of {{.Asked}} check(s) ran, {{.Stats.Steps}} request(s); elapsed {{.Elapsed}}</p>
<table id="verdicts"><tr><th>invariant</th><th></th><th>verdict</th><th>what it rests on</th></tr>
{{range .Rows}}<tr id="verdict-{{.Invariant}}" class="{{.Class}}"><td>{{.Invariant}}</td><td>{{.Title}}</td><td class="status">{{.Status}}</td><td>{{.Rests}}</td></tr>
{{end}}</table>
{{range .Failures}}<section class="failure" id="failure-{{.Invariant}}"><h2>{{.Invariant}} ({{.Title}}): {{.Shrink}}</h2>
{{template "failure" .View}}</section>
{{end}}
<h2>What the run did</h2>
<pre id="summary">{{.Closing}}</pre>
</body></html>
`))

// WriteHTML writes the conformance run as one self-contained HTML page
// about server: the page a results directory opens with.
func (c *Conformance) WriteHTML(w io.Writer, server targets.ServerSpec) error {
	type row struct {
		Invariant            model.Invariant
		Title, Status, Rests string
		Class                string
	}
	type failure struct {
		Invariant     model.Invariant
		Title, Shrink string
		View          failureView
	}
	data := struct {
		*Conformance
		Outcome, Class, Server, Elapsed, Closing string
		Rows                                     []row
		Failures                                 []failure
	}{Conformance: c, Outcome: c.Outcome(), Class: "fail", Server: server.String(),
		Elapsed: c.Elapsed.Round(time.Millisecond).String(), Closing: c.Closing()}
	switch {
	case c.Passed():
		data.Class = "pass"
	case c.NotProven():
		data.Class = "other"
	}
	for _, v := range c.Verdicts {
		class := "other"
		switch v.Status {
		case Pass, Fixed:
			class = "pass"
		case Fail:
			class = "fail"
		}
		data.Rows = append(data.Rows, row{v.Invariant, v.Invariant.Title(), strings.ToUpper(string(v.Status)), v.rests(), class})
	}
	for _, vd := range c.Verdicts {
		f := vd.Failure
		if f == nil {
			// A FAIL with no failure (a crash between two checks) is said
			// by its row and the notes.
			continue
		}
		// Shown inline, whole, as its own page shows it.
		v, err := view(f)
		if err != nil {
			return err
		}
		data.Failures = append(data.Failures, failure{vd.Invariant, vd.Invariant.Title(), f.ShrinkStats(), v})
	}
	return runPage.Execute(w, data)
}
