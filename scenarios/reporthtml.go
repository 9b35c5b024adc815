package scenarios

import (
	"bytes"
	"html/template"
	"io"

	"github.com/turncheck/turncheck/model"
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
	Op        Op
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
		if err := WriteLinearizability(&b, f.History); err != nil {
			return err
		}
		data.Porcupine = b.String()
	}
	return htmlPage.Execute(w, data)
}
