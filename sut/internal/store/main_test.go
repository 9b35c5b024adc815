package store

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/pgtest"
	"github.com/turncheck/turncheck/internal/tmpfs"
	"github.com/turncheck/turncheck/sut/internal/admission"
	"github.com/turncheck/turncheck/sut/internal/config"
)

// TestMain runs the package's tests beside one PostgreSQL (pgtest), and
// fails them on a leaked goroutine.
func TestMain(m *testing.M) {
	tmpfs.Use()
	goleak.VerifyTestMain(pgtest.Main(m))
}

// openPostgres opens a store in the PostgreSQL schema at url, as a
// replica does (four connections, commits tried for 5 s), closed when t
// ends.
func openPostgres(t *testing.T, url string) *Store {
	t.Helper()
	s, err := OpenPostgres(url, 4)
	if err != nil {
		t.Fatal(err)
	}
	s.CommitWithin = 5 * time.Second
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// leasedTurn runs a turn on conversation k as a replica does on
// PostgreSQL: it takes k's lease (Reject), loads k through cs, gives the
// connection back while the turn would be at its model, then commits the
// user message text. It returns the messages the turn was run on.
func leasedTurn(s *Store, cs *Conversations, k Key, text string) (seen []string, err error) {
	ctx := context.Background()
	l, unlock, err := s.Shared.Lock(ctx, k, config.Reject, time.Second, &admission.Gauge{})
	if err != nil {
		return nil, err
	}
	defer unlock()
	lctx := WithLease(ctx, l)
	base, err := cs.Get(lctx, k)
	if err != nil {
		return nil, err
	}
	l.Rest()
	for _, m := range base.Messages {
		seen = append(seen, string(m.Content))
	}
	next := base.Clone()
	next.Messages = append(next.Messages, &Message{Message: openai.Message{Role: openai.RoleUser, Content: openai.Content(text)}})
	return seen, cs.Commit(lctx, k, len(base.Messages), nil, next, false)
}
