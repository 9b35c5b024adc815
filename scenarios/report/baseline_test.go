package report

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/protocol"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// failed is a FAIL verdict of inv whose violation says reason.
func failed(inv model.Invariant, kind model.Kind, reason string) Verdict {
	return Verdict{Invariant: inv, Status: Fail, Failure: &Failure{Violation: &model.Violation{Invariant: inv, Kind: kind, Reason: reason,
		Conv: model.ConversationRef{Key: "key-a", ID: "conv-3"}}}}
}

// TestSignature: one finding has one signature whatever the run's own
// names (tokens, tool calls, conversations, ticks, counts, a server's
// quoted text); an HTTP status, a kind or an invariant makes another.
func TestSignature(t *testing.T) {
	same := []Verdict{
		failed(model.T3, "", "a request without a usable new user message reached the model, replaying tc-u3 as the new message; it must be refused with 400"),
		failed(model.T3, "", "a request without a usable new user message reached the model, replaying tc-u17 as the new message; it must be refused with 400"),
	}
	assert.Equal(t, Signature(same[0]), Signature(same[1]))
	assert.Equal(t, "T3: a request without a usable new user message reached the model, replaying tc-uN as the new message; it must be refused with 400", Signature(same[0]))
	assert.Equal(t,
		Signature(failed(model.T8, "", `the resume got 500 "agent not found: http://127.0.0.1:41665/agents/helper.yaml?tag=v1" at tick 12 on conv-2`)),
		Signature(failed(model.T8, "", `the resume got 500 "agent not found: http://127.0.0.1:39001/agents/helper.yaml?tag=v1" at tick 230 on conv-9`)))
	// One root cause, said two ways at two seeds: a kind of wrong state
	// names it, whatever the text.
	assert.Equal(t,
		Signature(failed(model.T1, model.LeftoverFailed, "tc-u3, of a turn that failed, reached the model in a later turn: a failed turn must leave the conversation as it was")),
		Signature(failed(model.T1, model.LeftoverFailed, "tc-u5, of a turn that failed, appears 2 times: a retry must see the last committed history, with no duplicate")))
	assert.Equal(t, "T1 [leftover of a failed turn]", Signature(failed(model.T1, model.LeftoverFailed, "anything")))
	apart := []Verdict{
		failed(model.T4, "", "refused with 409 while another turn ran"),
		failed(model.T4, "", "refused with 500 while another turn ran"),
		failed(model.T1, "", "refused with 500 while another turn ran"),
		failed(model.T1, model.LeftoverFailed, "refused with 500 while another turn ran"),
		failed(model.T1, model.LeftoverUnknown, "refused with 500 while another turn ran"),
		failed(model.T9, model.LeftoverFailed, "refused with 500 while another turn ran"),
	}
	seen := map[string]bool{}
	for _, v := range apart {
		seen[Signature(v)] = true
	}
	assert.Len(t, seen, len(apart), "%v", seen)
	// A FAIL with no failure (a crash between two checks) is signed by
	// its reason.
	assert.Equal(t, "crash: the server exited by the end of step N", Signature(Verdict{Invariant: model.Crash, Status: Fail, Reason: "the server exited by the end of step 4"}))
}

// TestApplyBaseline: a listed finding is KNOWN, an unlisted one FAILs, a
// listed one whose trigger the run drew and whose invariant passed is
// FIXED, one whose trigger it did not draw is not seen, and one the run
// could not look for is a note; an invariant left unexercised beside a
// known finding is SET ASIDE; the run passes with known findings only.
func TestApplyBaseline(t *testing.T) {
	t3 := failed(model.T3, "", "replaying tc-u3 as the new message")
	t1 := failed(model.T1, model.LeftoverFailed, "tc-u2, of a turn that failed, reached the model in a later turn")
	c := &Conformance{Verdicts: []Verdict{t1, t3, {Invariant: model.T4, Status: Pass, Evaluations: 5}, {Invariant: model.T7, Status: NotApplicable},
		{Invariant: model.T2, Status: Pass, Evaluations: 9}, {Invariant: model.T11, Status: NotExercised, Reason: "no turn failed between two tool turns"}},
		Stats: Stats{Drawn: map[string]int{"action: burst of N": 3, "action: continue": 9}}}
	b := Baseline{Schema: BaselineSchema, Findings: []KnownFinding{
		{Invariant: model.T3, Signature: Signature(failed(model.T3, "", "replaying tc-u9 as the new message"))},
		{Invariant: model.T4, Signature: "T4: refused with 409", Trigger: []string{"action: burst of N", "action: continue"}},
		{Invariant: model.T7, Signature: "T7: lost"},
		{Invariant: model.T1, Signature: "T1: another way"},
		{Invariant: model.T2, Signature: "T2: a blank body stores the reply as the user's", Trigger: []string{"action: continue", "action: invalid continuation: blank last user message", "fault: client-abort"}},
	}}
	c.ApplyBaseline(b, "b.json")
	assert.Equal(t, Fail, c.Verdicts[0].Status, "T1 broken another way: new")
	assert.Equal(t, Known, c.Verdicts[1].Status)
	assert.Equal(t, Fixed, c.Verdicts[2].Status, "its trigger drawn, and T4 held")
	assert.Contains(t, c.Verdicts[2].Reason, "its trigger drawn (action: burst of N, action: continue): T4: refused with 409")
	assert.Equal(t, NotApplicable, c.Verdicts[3].Status)
	assert.Equal(t, Pass, c.Verdicts[4].Status, "T2 passed, but the finding's trigger was not drawn: not FIXED")
	assert.Equal(t, Aside, c.Verdicts[5].Status, "not exercised beside a known finding")
	assert.Contains(t, c.Verdicts[5].Reason, "no turn failed between two tool turns; the known findings' conversations were set aside")
	assert.Len(t, c.Notes, 3, "%v", c.Notes)
	assert.Contains(t, strings.Join(c.Notes, "\n"), `the baseline's finding "T2: a blank body stores the reply as the user's" was not seen: this run never drew action: invalid continuation: blank last user message, fault: client-abort, which set it off; it stays known`)
	assert.False(t, c.Passed())
	assert.True(t, c.Broken())

	c.Verdicts = c.Verdicts[1:]
	assert.True(t, c.Passed(), "known findings, and what they set aside, fail nothing")
	assert.False(t, c.NotProven())
	assert.Equal(t, "CONFORMS, BUT FOR 1 KNOWN FINDING(S)", c.Outcome())
	got := c.Baseline()
	require.Len(t, got.Findings, 1, "a known finding stays in the run's baseline")
	assert.Equal(t, b.Findings[0].Signature, got.Findings[0].Signature)

	// Written, and read back.
	var buf bytes.Buffer
	require.NoError(t, got.Write(&buf))
	path := filepath.Join(t.TempDir(), BaselineFile)
	require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
	back, err := ReadBaseline(path)
	require.NoError(t, err)
	assert.Equal(t, got, back)
	require.NoError(t, os.WriteFile(path, []byte(`{"schema":"turncheck/baseline/v1","findings":[{"invariant":"T99","signature":"x"}]}`), 0o644))
	_, err = ReadBaseline(path)
	assert.ErrorContains(t, err, "findings[0]")

	// A v1 baseline named a finding with a kind by its text as well: read,
	// it is named by its root cause.
	require.NoError(t, os.WriteFile(path, []byte(`{"schema":"turncheck/baseline/v1","findings":[`+
		`{"invariant":"T1","signature":"T1 [leftover of a failed turn]: tc-uN, of a turn that failed, appears N times: a retry must see it"},`+
		`{"invariant":"T3","signature":"T3: replaying tc-uN: [x]: y"}]}`), 0o644))
	v1, err := ReadBaseline(path)
	require.NoError(t, err)
	assert.Equal(t, BaselineSchema, v1.Schema)
	assert.Equal(t, "T1 [leftover of a failed turn]", v1.Findings[0].Signature)
	assert.Equal(t, "T3: replaying tc-uN: [x]: y", v1.Findings[1].Signature, "no kind: the text stays")
}

// TestMergeBaselines: the baseline of several runs holds every finding
// any of them found, once, with the runs that found it counted and the
// smallest trigger kept.
func TestMergeBaselines(t *testing.T) {
	one := Baseline{Schema: BaselineSchema, Findings: []KnownFinding{
		{Invariant: model.T3, Signature: "T3: x", Runs: 1, Trigger: []string{"a", "b", "c"}},
	}}
	two := Baseline{Schema: BaselineSchema, Findings: []KnownFinding{
		{Invariant: model.Crash, Signature: "crash: panic", Runs: 1, Trigger: []string{"a"}},
		{Invariant: model.T3, Signature: "T3: x", Trigger: []string{"b", "c"}},
	}}
	got := MergeBaselines(one, two, Baseline{})
	require.Len(t, got.Findings, 2)
	assert.Equal(t, KnownFinding{Invariant: model.T3, Signature: "T3: x", Runs: 2, Trigger: []string{"b", "c"}}, got.Findings[0])
	assert.Equal(t, "crash: panic", got.Findings[1].Signature, "a race one run missed is known all the same")
	assert.Equal(t, 1, got.Findings[1].Runs)
	assert.Equal(t, BaselineSchema, got.Schema)
}

// TestWarningsNameWhatFailedTurns: a cause the harness did not inject that
// failed a tenth of the turns or more is named, with what the server said
// and the profile field that would change it; a rarer one is not.
func TestWarningsNameWhatFailedTurns(t *testing.T) {
	s := NewStats()
	s.Steps = 100
	for range 25 {
		s.CountUninjected("status 400", `Unrecognized key(s) in object: 'conversation'`)
	}
	for range 12 {
		s.CountUninjected("stopReason cancelled", "stopReason cancelled, which the client did not ask for, once another prompt of the session was sent")
	}
	for range 9 {
		s.CountUninjected("status 502", "bad gateway")
	}
	w := strings.Join(s.Warnings(), "\n")
	assert.Contains(t, w, "25 of 100 turns did not end ok for a cause the harness did not inject: status 400 (\"Unrecognized key(s) in object: 'conversation'\"); a server that does not take the conversation parameter declares no responses.named_by: conversation")
	assert.Contains(t, w, "12 of 100 turns did not end ok for a cause the harness did not inject: stopReason cancelled")
	assert.Contains(t, w, "policies.concurrency: supersede")
	assert.NotContains(t, w, "status 502", "under a tenth of the turns")

	// Counts of shards add up, the first detail kept.
	all := NewStats()
	all.Add(*s)
	all.Add(*s)
	assert.Equal(t, 50, all.Uninjected["status 400"])
	assert.Equal(t, s.UninjectedSaid["status 400"], all.UninjectedSaid["status 400"])
}

// TestNoCallSaysWhatWasSeen: a turn with no call of the check's recorded
// says so, and where its reply is the model's own text says that a call
// was made all the same, one that carried none of the check's messages.
func TestNoCallSaysWhatWasSeen(t *testing.T) {
	op := history.Op{}
	assert.Equal(t, "no call", noCall(op))
	op.Response.Reply = model.NoTokenReply + "."
	assert.Contains(t, noCall(op), "one was made")
	op.Response.Reply = "tc-a1 acknowledges your message [call 4]."
	assert.Contains(t, noCall(op), "the reply names a call of the model's")
}

// TestCurlSendsTheNamingHeader: the curl of a Responses API request that
// named the server's conversation by a header (openclaw's session key)
// sends that header, as the request went, so that it reaches the same
// conversation.
func TestCurlSendsTheNamingHeader(t *testing.T) {
	r := protocol.Request{Conv: model.ConversationRef{Key: "k", ID: "conv-3"}, Path: "/v1/responses", Body: []byte(`{"input":"x"}`),
		Named: map[string]string{"x-openclaw-session-key": "tcab12-1-conv-3"}}
	got := curlCommand(r, targets.Profile{Protocol: targets.Responses})
	assert.Contains(t, got, `-H 'x-openclaw-session-key: tcab12-1-conv-3'`)
	assert.Contains(t, got, `-H 'Authorization: Bearer k'`)

	// Chat's conversation header, on a server shared by the checks: the
	// id with the check's namespace on it, as it went.
	p := targets.Profile{Header: "x-openclaw-session-key"}
	c := protocol.NewClient([]string{"http://127.0.0.1:1"}, p, "tcab12-2-")
	req := c.NewRequest(context.Background(), plan.TurnSend(model.ConversationRef{ID: "conv-1"}, model.UserToken(1), false))
	got = curlCommand(req, p)
	assert.Contains(t, got, `-H 'x-openclaw-session-key: tcab12-2-conv-1'`)
	assert.NotContains(t, got, `-H 'x-openclaw-session-key: conv-1'`)
}
