package report_test

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/protocol"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// statuses are every status a verdict can have.
var statuses = []report.Status{report.Pass, report.Fail, report.NotApplicable, report.NotExercised, report.Skipped, report.SameCause, report.Known, report.Fixed, report.Aside}

// drawText is a short text, empty at times, with what a report must
// escape in XML and HTML now and then.
func drawText(t *rapid.T, label string) string {
	return rapid.SampledFrom([]string{"", "why", "a reason\nover two lines", `<b>&"quoted"</b>`, "crash between two checks: see the notes"}).Draw(t, label)
}

// drawViolation is a violation of inv, nil at times: a harness failure
// names none.
func drawViolation(t *rapid.T, inv model.Invariant) *model.Violation {
	if rapid.Bool().Draw(t, "no violation") {
		return nil
	}
	v := &model.Violation{Invariant: inv, Reason: drawText(t, "violation reason")}
	if rapid.Bool().Draw(t, "on a conversation") {
		v.Conv, v.Turn = model.ConversationRef{Key: "key-a", ID: "c1"}, model.UserToken(rapid.IntRange(1, 9).Draw(t, "turn"))
	}
	if rapid.Bool().Draw(t, "expected") {
		v.Expected, v.Observed = []model.Token{model.UserToken(1)}, []model.Token{}
	}
	v.Kind = rapid.SampledFrom([]model.Kind{"", model.Lost, model.LeftoverFailed}).Draw(t, "kind")
	return v
}

// drawHistory is the steps of a failing run and what their requests came
// to, as the executor records them: turns one after another, a burst,
// a restart; none at times.
func drawHistory(t *rapid.T) ([]plan.Plan, []history.Op) {
	var plans []plan.Plan
	var ops []history.Op
	conv := model.ConversationRef{Key: "key-a", ID: "c1"}
	tick := int64(0)
	for step := range rapid.IntRange(0, 4).Draw(t, "steps") {
		step++
		switch rapid.IntRange(0, 2).Draw(t, "step kind") {
		case 0:
			tok := model.UserToken(step)
			s := plan.TurnSend(conv, tok, rapid.Bool().Draw(t, "stream"))
			plans = append(plans, plan.Single("turn", s))
			op := history.Op{Step: step, Action: "turn", Send: s,
				Request:  protocol.Request{Conv: conv, Body: json.RawMessage(`{"messages":[]}`), Stream: s.Stream},
				Response: protocol.Response{Outcome: rapid.SampledFrom([]model.Outcome{model.OK, model.Fail, model.Unknown}).Draw(t, "outcome")},
				Turn:     model.Turn{Conv: conv, User: tok, Usable: true, Invoke: tick + 1, Return: tick + 3}}
			op.Turn.Outcome = op.Response.Outcome
			if rapid.Bool().Draw(t, "reached the model") {
				op.Turn.Calls = []model.Call{{History: []model.Token{tok}, Turn: tok, At: tick + 2}}
			}
			if rapid.Bool().Draw(t, "not sent") {
				op.Request.Unsent = "the protocol's call before it failed"
			}
			ops = append(ops, op)
			tick += 3
		case 1:
			p := plan.Burst(conv, step*10, 2, 1, 0)
			plans = append(plans, p)
			for i, s := range p.Sends {
				ops = append(ops, history.Op{Step: step, Index: i, Action: p.Action, Send: s,
					Request:  protocol.Request{Conv: conv, Body: json.RawMessage(`{}`)},
					Response: protocol.Response{Outcome: model.OK, Status: 200},
					Turn:     model.Turn{Conv: conv, User: s.Token, Usable: true, Invoke: tick + 1 + int64(i), Return: tick + 5 - int64(i)}})
			}
			tick += 5
		default:
			r := &plan.Restart{Crash: rapid.Bool().Draw(t, "crash")}
			plans = append(plans, plan.Plan{Action: "restart", Restart: r})
			ops = append(ops, history.Op{Step: step, Action: "restart", Restart: r, Response: protocol.Response{Detail: drawText(t, "restart detail")}})
		}
	}
	return plans, ops
}

// drawFailure is a failure found of inv, in any shape a report may meet:
// with or without a violation, steps, history or report text.
func drawFailure(t *rapid.T, inv model.Invariant) *report.Failure {
	f := &report.Failure{Violation: drawViolation(t, inv), Seed: rapid.Uint64().Draw(t, "seed"),
		Check: rapid.IntRange(0, 50).Draw(t, "check"), FoundAfter: rapid.IntRange(0, 50).Draw(t, "found after"),
		FoundIn:    time.Duration(rapid.IntRange(0, 5000).Draw(t, "found in")) * time.Millisecond,
		ShrinkRuns: rapid.IntRange(0, 20).Draw(t, "shrink runs"),
		Shrink:     rapid.SampledFrom([]report.ShrinkState{"", report.Shrunk, report.PartlyShrunk, report.NotShrunk}).Draw(t, "shrink"),
		ShrinkNote: drawText(t, "shrink note"), Report: drawText(t, "report"), Flaky: rapid.Bool().Draw(t, "flaky")}
	f.Plans, f.History = drawHistory(t)
	return f
}

// drawStats is what a run counted, its maps made or left nil.
func drawStats(t *rapid.T) report.Stats {
	s := report.Stats{}
	if rapid.Bool().Draw(t, "made") {
		s = *report.NewStats()
	}
	s.Checks, s.Steps = rapid.IntRange(0, 100).Draw(t, "checks"), rapid.IntRange(0, 1000).Draw(t, "requests")
	if s.Steps > 0 {
		s.Outcomes = map[string]int{"ok": rapid.IntRange(0, s.Steps).Draw(t, "ok"), "fail": 1}
		s.Causes = map[string]int{protocol.CauseTimedOut: rapid.IntRange(0, s.Steps).Draw(t, "timed out")}
	}
	if rapid.Bool().Draw(t, "evaluated") {
		s.Invariants = map[model.Invariant]int{model.T1: 3, model.Crash: 1}
	}
	return s
}

// drawConformance is a conformance run's verdicts in any shape: any
// status on any invariant, a FAIL with or without its failure (a crash
// between two checks has none), none at all, notes, a run stopped early.
func drawConformance(t *rapid.T) *report.Conformance {
	c := &report.Conformance{Seed: rapid.Uint64().Draw(t, "seed"), Stats: drawStats(t),
		Elapsed: time.Duration(rapid.IntRange(0, 100000).Draw(t, "elapsed")) * time.Millisecond,
		Asked:   rapid.IntRange(0, 100).Draw(t, "asked"),
		Stopped: rapid.SampledFrom([]string{"", "interrupted", "the time bound was reached"}).Draw(t, "stopped"),
		Shard:   rapid.SampledFrom([]string{"", "1/2"}).Draw(t, "shard"), ServerOutput: drawText(t, "server output")}
	for i := range rapid.IntRange(0, 2).Draw(t, "notes") {
		c.Notes = append(c.Notes, fmt.Sprintf("note %d", i))
	}
	if rapid.Bool().Draw(t, "no verdicts") {
		return c
	}
	all := rapid.SampledFrom([]report.Status{"", report.NotExercised, report.Fail}).Draw(t, "every verdict")
	for _, inv := range report.Judged() {
		v := report.Verdict{Invariant: inv, Status: all, Reason: drawText(t, "reason"), Evaluations: rapid.IntRange(0, 9).Draw(t, "evaluations")}
		if v.Status == "" {
			v.Status = rapid.SampledFrom(statuses).Draw(t, "status")
		}
		if v.Status == report.Fail && rapid.Bool().Draw(t, "with its failure") {
			v.Failure = drawFailure(t, inv)
		}
		c.Verdicts = append(c.Verdicts, v)
	}
	return c
}

// drawReport is a Check's report: a pass, a failure, a harness failure.
func drawReport(t *rapid.T) *report.Report {
	r := &report.Report{Schema: report.ReportSchema, Server: targets.ServerSpec{Kind: rapid.SampledFrom([]string{"reference", "profile", ""}).Draw(t, "kind")},
		Seed: rapid.Uint64().Draw(t, "seed"), Verdict: "pass", Stats: drawStats(t), ElapsedMS: int64(rapid.IntRange(0, 9999).Draw(t, "elapsed"))}
	if rapid.Bool().Draw(t, "failed") {
		r.Failure, r.Verdict = drawFailure(t, rapid.SampledFrom(report.Judged()).Draw(t, "invariant")), "fail"
	}
	return r
}

// junitSuite is what a dashboard reads of the JUnit XML.
type junitSuite struct {
	Tests    int `xml:"tests,attr"`
	Failures int `xml:"failures,attr"`
	Skipped  int `xml:"skipped,attr"`
	Cases    []struct {
		Name    string `xml:"name,attr"`
		Failure *struct {
			Message string `xml:"message,attr"`
		} `xml:"failure"`
	} `xml:"testcase"`
}

// TestConformanceWritersNeverFail: whatever verdicts a run ends with,
// every rendering of them is written, without a panic or an error: the
// text, the table, JSON (which reads back as it was written), JUnit
// (whose failures are the FAIL verdicts, each with a message that says
// why: NOT EXERCISED is not proven, a skipped case) and HTML.
func TestConformanceWritersNeverFail(t *testing.T) {
	dir := t.TempDir()
	rapid.Check(t, func(t *rapid.T) {
		c := drawConformance(t)
		p := targets.Profile{Protocol: rapid.SampledFrom([]targets.Protocol{"", targets.ACP}).Draw(t, "protocol")}
		_ = c.Text(p)
		_ = c.Table()
		_ = c.Outcome()

		var js bytes.Buffer
		require.NoError(t, c.WriteJSON(&js))
		path := filepath.Join(dir, "verdicts.json")
		require.NoError(t, os.WriteFile(path, js.Bytes(), 0o644))
		back, err := report.ReadConformance(path)
		require.NoError(t, err)
		var again bytes.Buffer
		require.NoError(t, back.WriteJSON(&again))
		assert.JSONEq(t, js.String(), again.String(), "the verdicts read back are not those written")
		require.Len(t, back.Verdicts, len(c.Verdicts))
		for i, v := range c.Verdicts {
			assert.Equal(t, v.Status, back.Verdicts[i].Status)
			assert.Equal(t, v.Failure == nil, back.Verdicts[i].Failure == nil)
		}

		var junit bytes.Buffer
		require.NoError(t, c.WriteJUnit(&junit))
		var s junitSuite
		require.NoError(t, xml.Unmarshal(junit.Bytes(), &s), junit.String())
		failures := 0
		for _, v := range c.Verdicts {
			if v.Status == report.Fail {
				failures++
			}
		}
		assert.Equal(t, failures, s.Failures)
		assert.Equal(t, len(c.Verdicts), s.Tests)
		require.Len(t, s.Cases, len(c.Verdicts))
		for i, v := range c.Verdicts {
			if v.Status != report.Fail {
				continue
			}
			require.NotNil(t, s.Cases[i].Failure, "%s failed, and its test case did not", v.Invariant)
			assert.NotEmpty(t, s.Cases[i].Failure.Message, "%s failed, and its test case says nothing of why", v.Invariant)
			if v.Failure == nil && v.Reason != "" {
				assert.Equal(t, v.Reason, s.Cases[i].Failure.Message, "a FAIL with no failure (a crash between two checks) says its reason")
			}
		}

		var page bytes.Buffer
		require.NoError(t, c.WriteHTML(&page, targets.ServerSpec{Kind: "profile"}))

		// Its baseline lists every FAIL and KNOWN, and reads back.
		var b bytes.Buffer
		require.NoError(t, c.Baseline().Write(&b))
		bpath := filepath.Join(dir, report.BaselineFile)
		require.NoError(t, os.WriteFile(bpath, b.Bytes(), 0o644))
		known, err := report.ReadBaseline(bpath)
		require.NoError(t, err, b.String())
		want := 0
		for _, v := range c.Verdicts {
			if v.Status == report.Fail || v.Status == report.Known {
				want++
			}
		}
		assert.Len(t, known.Findings, want)
	})
}

// TestReportWritersNeverFail: a Check's report, a pass, a failure or a
// harness failure in any shape, is written as text, JSON, JUnit (one
// failure where it failed, none where it passed) and HTML without a
// panic or an error.
func TestReportWritersNeverFail(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		r := drawReport(t)
		_ = r.Text(targets.Profile{})
		var js, junit, page bytes.Buffer
		require.NoError(t, r.WriteJSON(&js))
		var back report.Report
		require.NoError(t, json.Unmarshal(js.Bytes(), &back))
		require.NoError(t, r.WriteJUnit(&junit))
		var s junitSuite
		require.NoError(t, xml.Unmarshal(junit.Bytes(), &s), junit.String())
		want := 0
		if r.Failure != nil {
			want = 1
		}
		assert.Equal(t, want, s.Failures)
		require.NoError(t, r.WriteHTML(&page))
		if f := r.Failure; f != nil {
			_ = report.FindingText(f)
			_ = f.ShrinkStats()
		}
	})
}

// TestJUnitCrashBetweenChecks: the crash verdict of a server that exited
// between two checks is a FAIL with no failure (no step shows it): its
// JUnit test case fails with the verdict's reason, and the other writers
// show it too, where they once panicked on its nil failure and lost every
// verdict of the run.
func TestJUnitCrashBetweenChecks(t *testing.T) {
	reason := "the server exited without being told to 1 time(s) between two checks, where no step shows the cause: see the notes"
	c := &report.Conformance{Seed: 1, Stats: *report.NewStats(), Verdicts: []report.Verdict{
		{Invariant: model.T1, Status: report.Pass, Evaluations: 3},
		{Invariant: model.Crash, Status: report.Fail, Reason: reason},
	}, Notes: []string{"the server exited without being told to between two checks"}}
	var junit bytes.Buffer
	require.NoError(t, c.WriteJUnit(&junit))
	var s junitSuite
	require.NoError(t, xml.Unmarshal(junit.Bytes(), &s))
	assert.Equal(t, 1, s.Failures)
	require.Len(t, s.Cases, 2)
	require.NotNil(t, s.Cases[1].Failure)
	assert.Equal(t, reason, s.Cases[1].Failure.Message)

	assert.Contains(t, c.Text(targets.Profile{}), reason)
	var page bytes.Buffer
	require.NoError(t, c.WriteHTML(&page, targets.ServerSpec{Kind: "profile"}))
	assert.Contains(t, page.String(), "between two checks")
}

// TestA2AReportSpeaksOfTasks: a failure of an A2A agent names contexts and
// tasks by the turns they came from, and shows the tasks/cancel the
// client sent beside the message it cancelled, as a command that sends it
// again.
func TestA2AReportSpeaksOfTasks(t *testing.T) {
	p := targets.Profile{Protocol: targets.A2A, A2AAPI: &targets.A2AAPI{}}
	conv := model.ConversationRef{Key: "key-a", ID: "conv-1"}
	body := func(method string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":1,"method":"` + method + `","params":{"message":{"contextId":"ctx-9f"}}}`)
	}
	ops := []history.Op{{Step: 1, Index: 0, Send: plan.Send{Conv: conv, Token: "tc-u1", Abort: true, TaskAbort: plan.AbortCancel, Stream: true},
		Request:  protocol.Request{Conv: conv, Path: "/a2a", Body: body("message/stream"), Session: "ctx-9f"},
		Response: protocol.Response{Outcome: model.Unknown, ID: "task-77", Cancelled: true}}}
	ops[0].Turn.Interrupted = true
	text := report.FormatFailure(&model.Violation{Invariant: model.T10, Conv: conv, Turn: "tc-u1"}, ops, p)
	assert.Contains(t, text, `"contextId":"<context of conv-1, key key-a>"`)
	assert.Contains(t, text, `then curl -sS -N "$TURNCHECK_URL/a2a"`)
	assert.Contains(t, text, `"method":"tasks/cancel","params":{"id":"<task of 1a>"}`)
	assert.Contains(t, text, "the client cancelled the task (tasks/cancel)")
	assert.NotContains(t, text, "task-77", "a server's id is named by its turn")
}

// TestACPReportSpeaksACP: an ACP client's abort is its session/cancel, and
// an ACP answer has no status to print.
func TestACPReportSpeaksACP(t *testing.T) {
	p := targets.Profile{Protocol: targets.ACP}
	conv := model.ConversationRef{ID: "conv-1"}
	ops := []history.Op{
		{Step: 1, Index: 0, Send: plan.Send{Conv: conv, Token: "tc-u1", Abort: true},
			Request:  protocol.Request{Conv: conv, Method: "session/prompt"},
			Response: protocol.Response{Outcome: model.Unknown, StopReason: "cancelled", Cancelled: true}},
		{Step: 2, Index: 0, Send: plan.Send{Conv: conv, Token: "tc-u2"},
			Request:  protocol.Request{Conv: conv, Method: "session/prompt"},
			Response: protocol.Response{Outcome: model.Fail, Status: 502, Detail: "end_turn, and the reply is not the model's"}},
	}
	text := report.FormatFailure(&model.Violation{Invariant: model.T10, Conv: conv, Turn: "tc-u2"}, ops, p)
	assert.Contains(t, text, "client-abort: the client sends session/cancel while the model holds the turn")
	assert.NotContains(t, text, "drops the connection")
	assert.Contains(t, text, "outcome: fail: end_turn")
	assert.NotContains(t, text, "status 502")
}

// TestReportNamesEarlierChecksSteps: a failure that holds the steps of an
// earlier check whose messages leaked into the failing one says which
// steps are that check's, and how a replay runs them, in text and in
// HTML; the run as it failed, which holds its own steps only, says that
// the steps before them are such steps.
func TestReportNamesEarlierChecksSteps(t *testing.T) {
	conv := model.ConversationRef{ID: "conv-1"}
	op := func(step int, tok model.Token, o plan.Origin) history.Op {
		return history.Op{Step: step, Action: "continue", Earlier: o, Send: plan.Send{Conv: conv, Token: tok},
			Request: protocol.Request{Conv: conv}, Response: protocol.Response{Outcome: model.OK, Status: 200}}
	}
	earlier := plan.Origin{Check: 2, Session: 2}
	ops := []history.Op{op(1, "tc-u4", earlier), op(2, "tc-u5", earlier), op(3, "tc-u1", plan.Origin{})}
	v := &model.Violation{Invariant: model.T5, Conv: conv, Turn: "tc-u1"}
	text := report.FormatFailure(v, ops, targets.Profile{})
	assert.Contains(t, text, "3 step(s), 3 request(s):\n  Steps 1-2 (check 2): earlier checks' steps on the same server, whose messages the failing check met")
	assert.Contains(t, text, "A replay runs them first, each check's in a session of its own on one server")
	assert.Contains(t, text, "  1. new conversation (a step of check 2)\n", "titled by its own check's steps")
	assert.Contains(t, text, "  3. new conversation\n", "the earlier check's conv-1 is another conversation")

	var page bytes.Buffer
	r := report.NewReport(&report.Result{Seed: 1, Failure: &report.Failure{Violation: v, History: ops}}, targets.ServerSpec{Kind: "go"})
	require.NoError(t, r.WriteHTML(&page))
	assert.Contains(t, page.String(), "(a step of check 2, an earlier check on the same server whose messages the failing check met)")

	text = report.FormatFailure(v, ops[2:], targets.Profile{})
	assert.Contains(t, text, "1 step(s), 1 request(s):\n  Steps 1-2 (not shown): earlier checks' steps on the same server")
	assert.Contains(t, report.FormatFailure(v, ops[1:], targets.Profile{}), "\n  Step 1 (not shown): earlier checks' steps")
	assert.NotContains(t, report.FormatFailure(v, ops[:1], targets.Profile{}), "not shown")
}

// TestStoppedEarlySaysWhatAFullRunNeeds: a run its time bound ended says
// how long all the checks asked would take at the pace of those that ran,
// their shrinks apart: the --timeout a full run needs.
func TestStoppedEarlySaysWhatAFullRunNeeds(t *testing.T) {
	s := *report.NewStats()
	s.Checks = 20
	s.TimeMS["shrinking"] = time.Minute.Milliseconds()
	c := report.Conformance{Stats: s, Asked: 100, Stopped: report.TimeBound, Elapsed: 10 * time.Minute}
	// 9 minutes of checks, 27 s each: 100 take 45 minutes, and the
	// shrink one more.
	assert.Contains(t, c.Closing(), "stopped early: the time bound was reached after 20 of the 100 checks asked; "+
		"at the 27s a check took here (shrinks apart), all 100 would need about 46m0s: --timeout 46m0s\n")
	c.Stopped = "interrupted"
	assert.Contains(t, c.Closing(), "stopped early: interrupted\n")
}
