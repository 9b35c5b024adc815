package execute

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/goroutines"
)

// TestParkedGoOneAtATime: requests the client held back (an A2A turn
// beside its conversation's first, until that one names the context) go
// one at a time, in the order sent, each once the others are at rest, so
// that which reaches the server first is the seed's to say, not a race of
// goroutines let go at once.
func TestParkedGoOneAtATime(t *testing.T) {
	// A server that reports its activity: the executor waits for each
	// request to come to rest, never for a quiet period to pass, so that
	// how soon a goroutine runs on a busy machine decides nothing.
	e := &executor{spent: timeSpent{}, srv: quietServer{}}
	wake := make(chan struct{}, 16)
	named := make(chan struct{}) // the first turn named the context
	first := &flight{done: make(chan struct{})}
	first.arrived.Store(true) // held by the model
	var beside []*flight
	var order []int
	for i := range 3 {
		f := &flight{done: make(chan struct{}), waits: named, goes: make(chan struct{})}
		beside = append(beside, f)
		go func() {
			<-f.goes
			for _, o := range beside[:i] {
				// Each one before it had come to rest when it went.
				if !o.held() {
					order = append(order, -1)
				}
			}
			order = append(order, i)
			f.arrived.Store(true) // reached the model, held there
			wake <- struct{}{}
		}()
	}
	flights := append([]*flight{first}, beside...)

	// Until the first names the context, they wait, at rest.
	e.settle(flights, wake)
	for _, f := range beside {
		assert.False(t, f.gone)
	}

	close(named)
	e.settle(flights, wake)
	for _, f := range beside {
		require.True(t, f.gone)
		require.True(t, f.held())
	}
	assert.Equal(t, []int{0, 1, 2}, order)
}

// quietServer reports its activity, and none: nothing of it waits, and
// nothing changes.
type quietServer struct{}

func (quietServer) URL() string  { return "" }
func (quietServer) Close() error { return nil }
func (quietServer) Activity() (working, waiting int, changed <-chan struct{}) {
	return 0, 0, nil
}

// TestAWorkingRequestIsLookedAtLessAndLessOften: a request that works on
// for a second (its call held by the model until the server gives up)
// costs a few dozen looks at the server's goroutines, each a stop of the
// whole process, not one every pollInterval. A slower machine only makes
// fewer.
func TestAWorkingRequestIsLookedAtLessAndLessOften(t *testing.T) {
	t.Parallel() // it waits a second
	srv := &lookCounter{}
	e := &executor{spent: timeSpent{}, srv: srv}
	wake := make(chan struct{}, 1)
	f := &flight{done: make(chan struct{}), tag: "r1"}
	go func() {
		time.Sleep(time.Second)
		close(f.done)
		wake <- struct{}{}
	}()
	e.settle([]*flight{f}, wake)
	looks := srv.looks.Load()
	t.Logf("%d looks in a second", looks)
	assert.Positive(t, looks, "the working request was never looked at")
	// A look every pollInterval is 500 in the second; less and less
	// often, at most an eighth of the time since the last change, about
	// 60 at most.
	assert.LessOrEqual(t, looks, int64(100), "looks at a request that worked for a second")
}

// lookCounter is a server whose every request works on, and that counts
// the looks at its goroutines.
type lookCounter struct{ looks atomic.Int64 }

func (*lookCounter) URL() string  { return "" }
func (*lookCounter) Close() error { return nil }
func (s *lookCounter) Parked(tags []string) []goroutines.State {
	s.looks.Add(1)
	states := make([]goroutines.State, len(tags))
	for i := range states {
		states[i] = goroutines.Working
	}
	return states
}
