package store

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/pgtest"
	"github.com/turncheck/turncheck/sut/internal/admission"
)

// TestAConnectionABrokenLinkClosedFailsNoTurn: the link to PostgreSQL
// closes every connection through it (a partition that heals at once);
// the turns that come next, at once, on connections the pool kept, all
// commit: the pool does not lend a connection its socket shows closed.
// Pooled connections are not pinged on every reuse, so it is the socket
// that tells.
func TestAConnectionABrokenLinkClosedFailsNoTurn(t *testing.T) {
	u, err := url.Parse(pgtest.Start(t))
	require.NoError(t, err)
	link := newTCPLink(t, u.Host)
	u.Host = link.addr
	s := openPostgres(t, u.String())
	cs, err := NewConversations(s, 16, &admission.Budget{Max: 1 << 30}, "", nil)
	require.NoError(t, err)
	// Turns at once fill the pool: each conversation's turn holds a
	// connection for its take and load, then another for its commit.
	turns := func(round int) []error {
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Go(func() {
				_, errs[i] = leasedTurn(s, cs, Key{Scope: "s", ID: fmt.Sprint("c", i)}, fmt.Sprint("turn ", round))
			})
		}
		wg.Wait()
		return errs
	}
	for _, err := range turns(1) {
		require.NoError(t, err)
	}
	link.closeAll()
	// The sockets see the close at once; the beat may not yet.
	time.Sleep(50 * time.Millisecond)
	for i, err := range turns(2) {
		assert.NoError(t, err, "conversation %d's turn after the link closed its connections", i)
	}
}

// tcpLink is a TCP proxy on loopback to upstream whose connections the
// test can close, both ways at once.
type tcpLink struct {
	addr  string
	mu    sync.Mutex
	conns []net.Conn
}

func newTCPLink(t *testing.T, upstream string) *tcpLink {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := &tcpLink{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		l.closeAll()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = down.Close()
				continue
			}
			l.mu.Lock()
			l.conns = append(l.conns, down, up)
			l.mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(up, down); _ = up.Close() })
			wg.Go(func() { _, _ = io.Copy(down, up); _ = down.Close() })
		}
	})
	return l
}

// closeAll closes every connection through the link.
func (l *tcpLink) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}
