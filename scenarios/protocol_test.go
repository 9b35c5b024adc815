package scenarios

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// TestProtocolNamesWhatTheCodeNames: the contract document at the root of
// the repository names every invariant and the crash finding (with its
// title), kind of wrong state, policy and verdict the code uses, so the
// two cannot drift apart unnoticed.
func TestProtocolNamesWhatTheCodeNames(t *testing.T) {
	b, err := os.ReadFile("../PROTOCOL.md")
	require.NoError(t, err, "the contract document is missing")
	doc := string(b)
	for _, inv := range report.Judged() {
		assert.True(t, strings.Contains(doc, "**"+string(inv)+" "+inv.Title()+"**"), "invariant %s", inv)
	}
	for _, k := range []model.Kind{model.LeftoverFailed, model.LeftoverRefused, model.LeftoverUnknown, model.LeftoverInterrupted, model.Lost} {
		assert.True(t, strings.Contains(doc, "**"+string(k)+"**"), "kind %s", k)
	}
	for _, policy := range []string{
		model.Serialize.String(), model.Reject.String(),
		string(targets.Durable), string(targets.Forgets), "capacity",
		string(targets.Rollback), string(targets.KeepConsistent), string(targets.Complete),
		"restart", "crash", "tools: true",
		targets.ContextsServer, targets.ContextsClient, targets.DroppedRunsOn, targets.DroppedCancels,
	} {
		assert.True(t, strings.Contains(doc, "`"+policy+"`"), "policy value %s", policy)
	}
	for _, s := range []report.Status{report.Pass, report.Fail, report.NotApplicable, report.NotExercised, report.Skipped, report.SameCause} {
		assert.True(t, strings.Contains(doc, "**"+strings.ToUpper(string(s))+"**"), "verdict %s", s)
	}
	// The tool call ids it shows are the fake model's, a round's first
	// asking and a later one.
	for _, asking := range []int{1, 2} {
		id := model.ToolCallRef{User: model.UserToken(7), Round: 2, Call: 1, Asking: asking}.ID()
		assert.True(t, strings.Contains(doc, "`"+id+"`"), "tool call id %s", id)
	}
}
