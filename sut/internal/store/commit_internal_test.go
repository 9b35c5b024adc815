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
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
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
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		"postgresql": func(t *testing.T) *Store { return openPostgres(t, pgtest.Start(t)) },
	} {
		t.Run(name, func(t *testing.T) {
			s := open(t)
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
			c, err := s.load(ctx, k)
			require.NoError(t, err)
			require.Len(t, c.Messages, n)
			for i, m := range c.Messages {
				require.Equal(t, fmt.Sprintf("first %d", i), string(m.Content))
			}
		})
	}
}

// TestALeasedCommitLandsWholeOrNotAtAll: on PostgreSQL, a commit under a
// lease is one statement (commitLeased): its messages, the marks it
// hides earlier ones by and the conversation's source key land together;
// one whose messages take places already taken lands nothing, its marks
// included, and gives the lease back to nobody (it is still the turn's,
// to be given back by its release).
func TestALeasedCommitLandsWholeOrNotAtAll(t *testing.T) {
	s := openPostgres(t, pgtest.Start(t))
	ctx, k := context.Background(), Key{Scope: "s", ID: "c1"}
	msg := func(text string) Message {
		return Message{Message: openai.Message{Role: openai.RoleUser, Content: openai.Content(text)}}
	}
	commit := func(ch change) error {
		l, unlock, err := s.Shared.Lock(ctx, k, config.Reject, time.Second, &admission.Gauge{})
		require.NoError(t, err)
		l.Rest()
		defer unlock()
		return s.appendMessages(WithLease(ctx, l), k, ch)
	}
	require.NoError(t, commit(change{msgs: []Message{msg("u1"), msg("a1")}, source: "agent@v1"}))
	assert.Error(t, commit(change{seq: 1, msgs: []Message{msg("again")}, hide: []int{0}}), "place 1 is taken")
	require.NoError(t, commit(change{seq: 2, msgs: []Message{msg("u2")}, hide: []int{0}}))

	c, err := s.load(ctx, k)
	require.NoError(t, err)
	require.Len(t, c.Messages, 3)
	assert.Equal(t, "agent@v1", c.Source)
	for i, want := range []struct {
		text   string
		hidden bool
	}{{"u1", true}, {"a1", false}, {"u2", false}} {
		assert.Equal(t, want.text, string(c.Messages[i].Content), i)
		assert.Equal(t, want.hidden, c.Messages[i].Hidden, i)
	}
	_, _, err = s.Shared.Lock(ctx, k, config.Reject, time.Second, &admission.Gauge{})
	require.NoError(t, err, "every lease was given back")
}
