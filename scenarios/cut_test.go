//go:build unix

package scenarios

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/testbin"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios/execute"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// TestCutRestartLeavesTheSharedServerRunning: a session whose bound ends
// while a restart of the run's shared server waits for it to be ready (a
// shrink replay out of time, say) leaves a server that runs for the next
// session, not one the run then takes for dead.
func TestCutRestartLeavesTheSharedServerRunning(t *testing.T) {
	t.Parallel() // it mostly waits on servers and bounds
	bin := testbin.Turncheck(t)
	// Ready at once on its first start; each later start waits 2 s
	// first, longer than the session's bound below.
	target := targets.Subprocess{
		Command: []string{"sh", "-c", `if [ -e "$0/started" ]; then sleep 2; fi; touch "$0/started"; exec "$@"`, "{data_dir}",
			bin, "serve", "--listen", "{addr}", "--model-url", "{model_url}", "--data-dir", "{data_dir}"},
		ReadyLine: `listening on (http://\S+)`,
		Reaches:   targets.Profile{Model: "m", Durability: targets.Durability{Restart: true}},
	}
	l, err := execute.Open(target, nil)
	require.NoError(t, err)
	defer func() { assert.NoError(t, l.Close()) }()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	s, err := l.Session(ctx)
	require.NoError(t, err)
	ops, v := s.Step(plan.Plan{Action: "restart", Restart: &plan.Restart{}})
	assert.Nil(t, v, "a step the bound cut short decides nothing")
	require.NotEqual(t, model.OK, ops[0].Response.Outcome, "the restart was not cut short: the test proves nothing")
	require.NoError(t, s.Close())

	next, err := l.Session(context.Background())
	require.NoError(t, err, "the next session found no server")
	conv := model.ConversationRef{ID: "conv-1"}
	ops, v = next.Step(plan.Single("new conversation", plan.TurnSend(conv, model.UserToken(1), false)))
	require.Nil(t, v)
	assert.Equal(t, model.OK, ops[0].Response.Outcome, ops[0].Response.Detail)
	require.NoError(t, next.Close())
}
