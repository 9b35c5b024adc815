package store

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
)

// TestWriteBehindCarriesToolRoundsAndMarks: the ack-before-durable queue
// holds what a commit holds, tool calls, their ids and hidden marks, and a
// load sees them on top of the store before a flush and in it after.
func TestWriteBehindCarriesToolRoundsAndMarks(t *testing.T) {
	defer func(old time.Duration) { FlushInterval = old }(FlushInterval)
	FlushInterval = time.Hour
	st, err := OpenStore(t.TempDir())
	require.NoError(t, err)
	defer func() { assert.NoError(t, st.Close()) }()
	w := newWriteBehind(st, slog.New(slog.DiscardHandler))
	k := Key{ID: "conv"}
	calls := []openai.ToolCall{{ID: "c1", Type: openai.TypeFunction, Function: openai.FunctionCall{Name: "echo", Arguments: `{"text":"a"}`}}}
	first := []*Message{
		{Message: openai.Message{Role: openai.RoleUser, Content: "tc-u1"}},
		{Message: openai.Message{Role: openai.RoleAssistant, ToolCalls: calls}},
		{Message: openai.Message{Role: openai.RoleTool, ToolCallID: "c1", Content: "a"}},
		{Message: openai.Message{Role: openai.RoleAssistant, Content: "tc-a1"}},
	}
	w.enqueue(k, change{seq: 0, msgs: snapshot(first)})
	// The next commit hides the round, and must not change the first
	// commit's queued messages by marking its own.
	second := (&Conversation{Messages: first}).Clone().Messages
	second[1].Hidden, second[2].Hidden = true, true
	second = append(second, &Message{Message: openai.Message{Role: openai.RoleUser, Content: "tc-u2"}})
	w.enqueue(k, change{seq: 4, msgs: snapshot(second[4:]), hide: []int{1, 2}})

	want := []bool{false, true, true, false, false}
	check := func(when string) {
		c, err := w.load(context.Background(), k)
		require.NoError(t, err)
		require.Len(t, c.Messages, 5, when)
		for i, m := range c.Messages {
			assert.Equal(t, want[i], m.Hidden, "%s: message %d", when, i)
		}
		assert.Equal(t, calls, c.Messages[1].ToolCalls, when)
		assert.Equal(t, "c1", c.Messages[2].ToolCallID, when)
	}
	check("queued")
	w.mu.Lock()
	w.flush()
	w.mu.Unlock()
	check("flushed")
	w.Crash()
}
