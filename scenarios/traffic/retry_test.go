package traffic_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/history"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/scenarios/traffic"
)

// check is what one check of the machine came to: its history, its
// violation if any, and how often it judged each invariant.
type check struct {
	ops     []history.Op
	failed  string
	checked map[model.Invariant]int
}

// runCheck runs one check of the machine from seed in l, as a run's
// checks are run (rapid draws its steps from the seed alone).
func runCheck(t *testing.T, l *execute.Lab, seed int) check {
	t.Helper()
	var c check
	rapid.Custom(func(rt *rapid.T) struct{} {
		// A property that draws nothing is run again by rapid: one whose
		// server did not start would be.
		_ = rapid.Bool().Draw(rt, "check")
		sess, err := l.Session(t.Context())
		require.NoError(t, err)
		m := traffic.New(sess, report.NewStats(), func(v *model.Violation, _ []plan.Plan, _ []history.Op) {
			c.failed = v.Error()
		}, func(err error) { c.failed = "the server stopped answering: " + err.Error() })
		defer func() {
			if p := recover(); p != nil && c.failed == "" {
				c.failed = fmt.Sprint(p) // the harness broke: no pass either
			}
			if c.failed == "" {
				// A server that died once it answered the last step.
				if v := sess.End(); v != nil {
					c.failed = v.Error()
				}
			}
			c.ops, c.checked = slices.Clone(sess.History), m.Ref.Checked()
			assert.NoError(t, sess.Close())
		}()
		rt.Repeat(m.Actions())
		return struct{}{}
	}).Example(seed)
	return c
}

// askedIn are the ids of the tool calls of its own turn that an op's
// model requests carry: what the fake model asked for in that attempt of
// the turn, as the server sent it back.
func askedIn(op history.Op) []string {
	var ids []string
	for _, c := range op.Turn.Calls {
		for _, e := range c.Tools {
			if user, _, ok := model.ToolTurn(e.ID); ok && e.Kind == model.ToolCalled && user == op.Send.Token && !slices.Contains(ids, e.ID) {
				ids = append(ids, e.ID)
			}
		}
	}
	return ids
}

// TestToolTurnsRetriedOnTheCleanServer: the machine retries failed turns
// with tools on the clean reference server, and nothing fails. A retry
// sends its turn's user token again, and the fake model asks for its
// rounds under ids of their own, never one of an earlier attempt's: a
// request that showed both attempts' calls would otherwise ask for one
// call twice (T9). The retries are counted from the histories (a turn
// whose token reached the model, and had tool calls asked for, in more
// than one attempt), so that the test cannot pass without one. Nothing in
// it depends on how fast the machine is: a correct server passes however
// slow, and the checks run until enough retries were seen.
func TestToolTurnsRetriedOnTheCleanServer(t *testing.T) {
	const (
		enough    = 2  // retries of tool turns to see
		maxChecks = 60 // about a dozen suffice: at most that many to find them
	)
	l, err := execute.Open(reference.Target{}, nil)
	require.NoError(t, err)
	defer func() { assert.NoError(t, l.Close()) }()

	retried, judged, seed := 0, 0, 1
	for ; seed <= maxChecks && retried < enough; seed++ {
		c := runCheck(t, l, seed)
		require.Empty(t, c.failed, "check from seed %d on the clean server", seed)
		judged += c.checked[model.T9]
		attempts := map[model.Token][][]string{} // by turn, the ids each attempt asked for
		for _, op := range c.ops {
			if ids := askedIn(op); len(ids) > 0 {
				attempts[op.Send.Token] = append(attempts[op.Send.Token], ids)
			}
		}
		for tok, asked := range attempts {
			if len(asked) < 2 {
				continue
			}
			retried++
			for i, ids := range asked {
				for _, earlier := range asked[:i] {
					for _, id := range ids {
						assert.NotContains(t, earlier, id, "seed %d: attempt %d of %s asked for a tool call an earlier attempt asked for", seed, i+1, tok)
					}
				}
			}
		}
	}
	t.Logf("%d retries of tool turns in %d checks", retried, seed-1)
	assert.Positive(t, judged, "no model request carried tool calls: T9 was never judged")
	assert.GreaterOrEqual(t, retried, enough, "no retry of a tool turn in %d checks: the test shows nothing", maxChecks)
}
