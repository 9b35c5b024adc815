package faults

import (
	"cmp"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/turncheck/turncheck/internal/stall"
)

// stallAll is the pause StallModels set, in nanoseconds: 0 when none.
var stallAll atomic.Int64

// StallModels makes every model of the process whose ModelConfig sets no
// Stall pause for a random 0..d before each call and lookup, until the
// returned function puts back the pause there was before. It is for a
// test that slows the fake model a harness starts out of its reach (the
// model of a conform run); such a test must not run beside others, whose
// models it would slow too.
func StallModels(d time.Duration) (restore func()) {
	before := stallAll.Swap(int64(d))
	return func() { stallAll.Store(before) }
}

// stall pauses r for a random 0..Stall (stall.Sleep), before the model
// records it or looks at its script: the call, or the lookup, arrives
// late, as on a machine too busy to run the model's handler at once. It
// ends early when r's client goes away or the model closes, so that a
// stalled model stops as fast as any; if the model closed, r is aborted
// unanswered, as one that arrives at a closed model is (ServeHTTP).
func (m *Model) stall(r *http.Request) {
	d := cmp.Or(m.cfg.Stall, time.Duration(stallAll.Load()))
	if d <= 0 {
		return
	}
	stall.Sleep(r.Context(), d, m.closing)
	select {
	case <-m.closing:
		panic(http.ErrAbortHandler)
	default:
	}
}
