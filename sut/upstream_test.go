package sut_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/openai"
	"github.com/turncheck/turncheck/internal/sse"
	"github.com/turncheck/turncheck/sut"
)

// ---------------------------------------------------------------------------
// The model client's pool (upstream.go).

// waveModel answers a model call only once wave calls are in at once, so
// that every wave of turns is truly concurrent, and counts the connections
// the server opened to it.
type waveModel struct {
	srv   *httptest.Server
	wave  int
	conns atomic.Int64

	mu      sync.Mutex
	arrived int
	next    chan struct{}
}

func startWaveModel(t *testing.T, wave int) *waveModel {
	m := &waveModel{wave: wave, next: make(chan struct{})}
	m.srv = httptest.NewUnstartedServer(m)
	m.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			m.conns.Add(1)
		}
	}
	m.srv.Start()
	t.Cleanup(m.srv.Close)
	return m
}

func (m *waveModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	m.arrived++
	release := m.next
	if m.arrived == m.wave {
		close(m.next)
		m.arrived, m.next = 0, make(chan struct{})
	}
	m.mu.Unlock()
	select {
	case <-release:
	case <-r.Context().Done():
		return
	case <-time.After(requestDeadline):
	}
	out := sse.NewWriter(w)
	w.WriteHeader(http.StatusOK)
	_ = out.Data(openai.Encode(openai.Completion{Object: openai.ObjectChunk,
		Choices: []openai.Choice{{Delta: &openai.Delta{Content: "tc-a1"}, FinishReason: openai.Ptr(openai.FinishStop)}}}))
	_ = out.Data(openai.DoneSentinel)
}

// TestModelConnectionsAreReused: a second wave of as many concurrent turns
// as the first reuses the first wave's model connections; a pool of 2
// idle connections (the net/http default) would open one for nearly every
// turn of it, some 3 waves' worth in all. A connection of one wave may go
// back to the pool only after the next wave's call that could have taken
// it dialled (the answer to the turn can come before the model client
// puts its connection back): how many such races a busy machine has is
// the scheduler's, so the bound leaves half a wave for them, far from
// what the bug opens.
func TestModelConnectionsAreReused(t *testing.T) {
	const wave = 24
	m := startWaveModel(t, wave)
	e := newEnv(t, sut.Config{ModelURL: m.srv.URL + "/v1"})
	e.client.Transport.(*http.Transport).MaxIdleConnsPerHost = wave
	for round := range 3 {
		var wg sync.WaitGroup
		for i := range wave {
			wg.Go(func() {
				r := e.post(t, chatBody(t, false, user(fmt.Sprintf("tc-u%d", 100*round+i))), nil)
				assert.Equal(t, http.StatusOK, r.status, "%s", r.body)
			})
		}
		wg.Wait()
	}
	opened := m.conns.Load()
	t.Logf("%d model connections for 3 waves of %d concurrent turns", opened, wave)
	require.LessOrEqual(t, opened, int64(wave+wave/2), "the model client did not keep its connections")
}
