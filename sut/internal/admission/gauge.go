package admission

import (
	"context"
	"sync"
)

// Gauge counts the requests a server is working on and, of those, the ones
// waiting for their conversation's turn, and signals every change. A test
// harness reads it to know, without timers, when concurrent requests have
// all come to rest: each is either queued on its conversation or gone. It
// is safe for concurrent use; the zero value is ready.
type Gauge struct {
	mu      sync.Mutex
	working int
	waiting int
	// changed is closed at the next change; nil until someone reads, so
	// that a gauge nobody watches costs no allocation per change.
	changed chan struct{}
	// done are the tags (RequestTagHeader) of the latest requests the
	// server is done with (DoneWith), oldest first in doneOrder, at most
	// maxDone.
	done      map[string]bool
	doneOrder []string
}

// RequestTagHeader is the header a harness tags a request with, so that
// the Gauge can tell it which requests the server is done with
// (DoneWith).
const RequestTagHeader = "Turncheck-Request"

// maxDone bounds how many tags of requests it is done with a Gauge
// remembers.
const maxDone = 1024

// DoneWhen marks tag as done with when ctx ends: the context a turn
// runs on, which ends when the turn sees its client go away, or when the
// turn is over. "" marks nothing.
func (g *Gauge) DoneWhen(ctx context.Context, tag string) {
	if g == nil || tag == "" {
		return
	}
	context.AfterFunc(ctx, func() { g.markDone(tag) })
}

// markDone marks tag as done with. "" marks nothing.
func (g *Gauge) markDone(tag string) {
	if g == nil || tag == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done[tag] {
		return
	}
	if g.done == nil {
		g.done = map[string]bool{}
	}
	if len(g.doneOrder) == maxDone {
		delete(g.done, g.doneOrder[0])
		g.doneOrder = g.doneOrder[1:]
	}
	g.done[tag] = true
	g.doneOrder = append(g.doneOrder, tag)
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}

// DoneWith reports whether the server is done with the request tagged
// tag: its turn saw its client go away (the turn's context ended), or its
// handler returned. A server that stops starts nothing more for it from
// then on.
func (g *Gauge) DoneWith(tag string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.done[tag]
}

// Read returns how many requests the server is working on, how many of
// them wait for their conversation's turn, and a channel that is closed at
// the next change of either.
func (g *Gauge) Read() (working, waiting int, changed <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	return g.working, g.waiting, g.changed
}

// Add moves the counts by the deltas and wakes every reader. A nil gauge
// counts nothing.
func (g *Gauge) Add(working, waiting int) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.working += working
	g.waiting += waiting
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}
