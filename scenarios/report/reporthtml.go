package report

import (
	"bytes"
	"html/template"
	"io"
	"strings"
	"time"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/scenarios/validate"
)

// htmlPage is the HTML report: the verdict, the failing run as a timeline
// of steps (each request, its injected fault, its outcome, what the model
// saw), and porcupine's visualisation of the history. Everything is inline:
// it opens offline.
var htmlPage = template.Must(template.New("report").Funcs(template.FuncMap{
	"tokens": model.FormatTokens,
	"letter": func(i int) string { return string(rune('a' + i)) },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>turncheck: {{.Verdict}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:72em}
.verdict{font-size:1.4em;font-weight:bold}.fail{color:#b00}.pass{color:#070}
.step{border-left:4px solid #ccc;margin:1em 0;padding:.2em 1em}
.op{margin:.4em 0 .4em 1em}.op.violating{background:#fee;border-left:4px solid #b00;padding-left:.5em}
code,pre{font-family:ui-monospace,monospace;font-size:.9em}pre{white-space:pre-wrap}.muted{color:#666}
iframe{width:100%;height:32em;border:1px solid #ccc}
</style></head><body>
<h1>turncheck report</h1>
<p class="verdict {{if .Failure}}fail{{else}}pass{{end}}">{{.Verdict}}{{with .Failure}}{{with .Violation}}: {{.Invariant}} ({{.Invariant.Title}}) broken{{end}}{{end}}</p>
<p class="muted">server {{.Server.Kind}}{{with .Server.Mutant}}, mutant {{.}}{{end}}{{with .Server.Concurrency}}, concurrency {{.}}{{end}}{{with .Server.Interruption}}, interruption {{.}}{{end}}; seed {{.Seed}}; {{.Stats.Checks}} check(s), {{.Stats.Steps}} request(s)</p>
{{with .Failure}}
{{with .Violation}}<pre id="violation">{{.Error}}</pre>{{end}}
{{if .Flaky}}<p class="fail">The failure did not reproduce when its steps were replayed: this is the run that failed.</p>{{end}}
{{if .Violation}}<p class="muted" id="shrink">{{.ShrinkStats}}</p>{{end}}
<h2>Timeline</h2>
{{range $.Steps}}<div class="step"><b>{{.N}}. {{.Action}}</b>
{{range .Ops}}{{if .Op.Restart}}<div class="op">server: {{.Op.Restart}}{{with .Op.Response.Detail}}: {{.}}{{end}}</div>{{else}}<div class="op{{if .Violating}} violating{{end}}"{{if .Violating}} id="violating-step"{{end}}>
<b>{{letter .Op.Index}})</b> {{.Op.Send.Conv}}{{with .Op.Send.Token}}, message <code>{{.}}</code>{{end}}{{if .Op.Send.Stream}}, streamed{{end}}<br>
fault: {{.Op.Send}}<br>
outcome: {{.Op.Response.Outcome}}{{with .Op.Response.Status}} (status {{.}}){{end}}{{with .Op.Response.Detail}}: {{.}}{{end}}<br>
{{range .Op.Turn.Calls}}model saw: <code>{{tokens .History}}</code><br>{{else}}model saw: no call<br>{{end}}
</div>{{end}}{{end}}</div>{{end}}
<h2>Linearizability</h2>
<p class="muted">Each conversation's turns as intervals per client, and how far they linearize (porcupine).</p>
<iframe title="linearizability" srcdoc="{{$.Porcupine}}"></iframe>
{{end}}
</body></html>
`))

type htmlStep struct {
	N      int
	Action string
	Ops    []htmlOp
}

type htmlOp struct {
	Op        history.Op
	Violating bool
}

// WriteHTML writes the report as one self-contained HTML page.
func (r *Report) WriteHTML(w io.Writer) error {
	data := struct {
		*Report
		Steps     []htmlStep
		Porcupine string
	}{Report: r}
	if f := r.Failure; f != nil {
		var v *model.Violation = f.Violation
		for _, op := range f.History {
			if len(data.Steps) == 0 || data.Steps[len(data.Steps)-1].N != op.Step {
				data.Steps = append(data.Steps, htmlStep{N: op.Step, Action: op.Action})
			}
			s := &data.Steps[len(data.Steps)-1]
			violating := v != nil && op.Send.Conv == v.Conv && op.Send.Token == v.Turn &&
				op.Step == f.History[len(f.History)-1].Step
			s.Ops = append(s.Ops, htmlOp{Op: op, Violating: violating})
		}
		var b bytes.Buffer
		if err := validate.WriteLinearizability(&b, f.History); err != nil {
			return err
		}
		data.Porcupine = b.String()
	}
	return htmlPage.Execute(w, data)
}

// runPage is the HTML page of a whole conformance run: the outcome, a
// verdict per invariant with what it rests on, each failure's own report
// (timeline and linearizability) inline, and what the run did: counts,
// warnings, the time spent, the server's last output. It opens offline.
var runPage = template.Must(template.New("run").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>turncheck conform: {{.Outcome}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}
.verdict{font-size:1.4em;font-weight:bold}.fail{color:#b00}.pass{color:#070}.other{color:#666}
table{border-collapse:collapse}td,th{padding:.3em .8em;text-align:left;vertical-align:top;border-bottom:1px solid #ddd}
pre{font-family:ui-monospace,monospace;font-size:.9em;white-space:pre-wrap}.muted{color:#666}
iframe{width:100%;height:40em;border:1px solid #ccc}
</style></head><body>
<h1>turncheck conform</h1>
<p class="verdict {{.Class}}" id="outcome">{{.Outcome}}</p>
<p class="muted">server: {{.Server}}; seed {{.Seed}}; {{.Stats.Checks}} of {{.Asked}} check(s) ran, {{.Stats.Steps}} step(s); elapsed {{.Elapsed}}</p>
<table id="verdicts"><tr><th>invariant</th><th></th><th>verdict</th><th>what it rests on</th></tr>
{{range .Rows}}<tr id="verdict-{{.Invariant}}" class="{{.Class}}"><td>{{.Invariant}}</td><td>{{.Title}}</td><td class="status">{{.Status}}</td><td>{{.Rests}}</td></tr>
{{end}}</table>
{{range .Failures}}<h2 id="failure-{{.Invariant}}">{{.Invariant}} ({{.Title}}): {{.Shrink}}</h2>
<iframe title="the {{.Invariant}} failure" srcdoc="{{.Page}}"></iframe>
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
		Page          string
	}
	data := struct {
		*Conformance
		Outcome, Class, Server, Elapsed, Closing string
		Rows                                     []row
		Failures                                 []failure
	}{Conformance: c, Outcome: c.Outcome(), Class: "fail", Server: server.String(),
		Elapsed: c.Elapsed.Round(time.Millisecond).String(), Closing: c.Closing()}
	if c.Passed() {
		data.Class = "pass"
	}
	for _, v := range c.Verdicts {
		class := "other"
		switch v.Status {
		case Pass:
			class = "pass"
		case Fail, NotExercised:
			class = "fail"
		}
		data.Rows = append(data.Rows, row{v.Invariant, v.Invariant.Title(), strings.ToUpper(string(v.Status)), v.rests(), class})
	}
	for _, f := range c.Failures() {
		var b bytes.Buffer
		rep := NewReport(&Result{Stats: c.Stats, Seed: f.Seed, Elapsed: f.FoundIn + f.ShrunkIn, Failure: f}, server)
		if err := rep.WriteHTML(&b); err != nil {
			return err
		}
		inv := f.Violation.Invariant
		data.Failures = append(data.Failures, failure{inv, inv.Title(), f.ShrinkStats(), b.String()})
	}
	return runPage.Execute(w, data)
}
