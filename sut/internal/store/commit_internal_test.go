package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/pgtest"
)

// TestACommitOfManyMessages: a commit writes its messages in batches of
// insertBatch, each one statement; one of more than two batches lands
// whole and in order, on SQLite and on PostgreSQL, and a second one over
// the same places fails whole, leaving the first as it was.
func TestACommitOfManyMessages(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) *Store{
		"sqlite": func(t *testing.T) *Store {
			s, err := OpenStore(t.TempDir())
			require.NoError(t, err)
			return s
		},
		"postgresql": func(t *testing.T) *Store {
			s, err := OpenPostgres(pgtest.Start(t), 4)
			require.NoError(t, err)
			s.CommitWithin = 5 * time.Second
			return s
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() { _ = s.Close() })
			ctx, k := context.Background(), Key{Scope: "s", ID: "c1"}
			n := 2*insertBatch + 7
			change := func(text string) change {
				msgs := make([]Message, n)
				for i := range msgs {
					msgs[i].Message = openai.Message{Role: openai.RoleUser, Content: openai.Content(fmt.Sprintf("%s %d", text, i))}
				}
				return change{msgs: msgs}
			}
			require.NoError(t, s.appendMessages(ctx, k, change("first")))
			assert.Error(t, s.appendMessages(ctx, k, change("second")), "the places are taken")
			got, err := s.loadMessages(ctx, k)
			require.NoError(t, err)
			require.Len(t, got, n)
			for i, m := range got {
				require.Equal(t, fmt.Sprintf("first %d", i), string(m.Content))
			}
		})
	}
}
