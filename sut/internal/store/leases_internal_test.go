package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/pgtest"
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
)

// TestATakenLeaseFencesTheCommit: process A holds a conversation's lease
// when its beats stop (A hangs, or is cut off) and its latest one grows
// takeAfter old; process B takes the lease then, and commits. A's commit,
// coming late, commits nothing (ErrLeaseLost): only the last holder of a
// conversation commits to it. A lease whose holder beats is never taken.
func TestATakenLeaseFencesTheCommit(t *testing.T) {
	url := pgtest.Start(t)
	a, b := openPostgres(t, url), openPostgres(t, url)
	ctx, k := context.Background(), Key{Scope: "s", ID: "c1"}
	lock := func(s *Store) (*Lease, func(), error) {
		return s.Shared.Lock(ctx, k, config.Reject, time.Second, &admission.Gauge{})
	}
	commit := func(s *Store, l *Lease, seq int, text string) error {
		msg := Message{Message: openai.Message{Role: openai.RoleUser, Content: openai.Content(text)}}
		return s.appendMessages(WithLease(ctx, l), k, change{seq: seq, msgs: []Message{msg}})
	}

	leaseA, unlockA, err := lock(a)
	require.NoError(t, err)
	leaseA.Rest()
	_, _, err = lock(b)
	require.ErrorIs(t, err, ErrConversationBusy, "A beats: its lease is A's")

	// A's beats stop, and its latest is made takeAfter old.
	a.Shared.stop()
	<-a.Shared.done
	_, err = a.db.Exec(`UPDATE lease_holders SET seen = now() - $2 * interval '1 millisecond' WHERE holder = $1`,
		a.Shared.number(), 2*takeAfter.Milliseconds())
	require.NoError(t, err)
	leaseB, unlockB, err := lock(b)
	require.NoError(t, err, "A's beats stopped takeAfter ago: B takes its lease")
	leaseB.Rest()

	assert.ErrorIs(t, commit(a, leaseA, 0, "A's turn"), ErrLeaseLost)
	unlockA()
	require.NoError(t, commit(b, leaseB, 0, "B's turn"))
	unlockB()
	c, err := b.load(ctx, k)
	require.NoError(t, err)
	require.Len(t, c.Messages, 1)
	assert.Equal(t, "B's turn", string(c.Messages[0].Content))
}

// TestACachedCopyIsCheckedWhenAnotherHeldTheLease: replica A's cached copy
// of a conversation is served unchecked only under the lease taken right
// after A's own (its epoch the next): nobody held the conversation in
// between. Once replica B has taken the lease and committed, A's next
// turn sees B's turn.
func TestACachedCopyIsCheckedWhenAnotherHeldTheLease(t *testing.T) {
	url := pgtest.Start(t)
	replica := func() (*Store, *Conversations) {
		s := openPostgres(t, url)
		cs, err := NewConversations(s, 16, &admission.Budget{Max: 1 << 30}, "", nil)
		require.NoError(t, err)
		return s, cs
	}
	k := Key{Scope: "s", ID: "c1"}
	turn := func(s *Store, cs *Conversations, text string) []string {
		seen, err := leasedTurn(s, cs, k, text)
		require.NoError(t, err)
		return seen
	}
	a, aConvs := replica()
	b, bConvs := replica()
	assert.Empty(t, turn(a, aConvs, "a1"))
	assert.Equal(t, []string{"a1"}, turn(a, aConvs, "a2"), "A's own copy, the lease's next epoch")
	assert.Equal(t, []string{"a1", "a2"}, turn(b, bConvs, "b1"))
	assert.Equal(t, []string{"a1", "a2", "b1"}, turn(a, aConvs, "a3"), "B held the lease since A's copy: A checks it")
}
