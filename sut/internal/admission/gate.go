// Package admission is where every request enters the server, whatever its
// protocol: the listener's connection cap (conns.go), the Host and Origin
// guard, the memory budget, the request slots, the Gauge, and the one
// refusal a client is answered when there is no room (Overloaded). HTTP
// adds its own checks (http.go); ACP goes through the same Gate.
package admission

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turncheck/turncheck/internal/openai"
)

// A request reaches the turn machinery through one gate, whatever its
// protocol: counted in (the handlers running, the Gauge, the requests a
// Stop waits for), bound to the server's life, given a reservation of the
// memory budget, made to wait the server's deliberate delay, charged for
// its body, and given a request slot. A protocol adds its own checks (an
// HTTP request's key, Content-Type and body) as hooks of Admit; what it
// is refused is a Refusal, which it answers in its own terms.

// Refusal is an answer to a request refused before its turn ran, in the
// terms an HTTP client gets it: a status, an error type and a message.
// Every protocol answers it its own way (an HTTP error body, a JSON-RPC
// error), so that a refusal means the same on each.
type Refusal struct {
	// Status is the HTTP status; 0 for a request whose client left before
	// anything was worked on: nothing is answered.
	Status int
	// Type is the error type of the answer's body.
	Type string
	// Message says why, and what the client may do.
	Message string
	// RetryAfter asks the client to retry in a second.
	RetryAfter bool
	// Close closes an HTTP connection after the answer: the request was
	// refused before its body was read, and what is left of the body is
	// not worth waiting for.
	Close bool
}

// ClientLeft is a request whose client left while it waited to be
// worked on: nothing was, and nothing is answered.
var ClientLeft = &Refusal{}

// Overloaded is the refusal of a request the server has no room for
// (request slots, memory, connections, the store's connections): 503
// with Retry-After, nothing changed. Every such refusal is this one, so
// that a client that backs off on one backs off on all.
func Overloaded(msg string) *Refusal {
	return &Refusal{Status: http.StatusServiceUnavailable, Type: "overloaded", Message: msg, RetryAfter: true}
}

// Stopping is the refusal of a request that came as the server stops.
func Stopping() *Refusal {
	return &Refusal{Status: http.StatusServiceUnavailable, Type: "unavailable", Message: "the server is stopping", Close: true}
}

// Refuse is a refusal of status, with neither Retry-After nor the
// connection closed.
func Refuse(status int, typ, msg string) *Refusal {
	return &Refusal{Status: status, Type: typ, Message: msg}
}

// Early is r, answered before the request's body was read: its HTTP
// connection closes after the answer.
func (r *Refusal) Early() *Refusal {
	c := *r
	c.Close = true
	return &c
}

// Write answers r on an HTTP response whose header is not written yet.
// A refusal of status 0 writes nothing.
func (r *Refusal) Write(w http.ResponseWriter) {
	if r.Status == 0 {
		return
	}
	if r.RetryAfter {
		w.Header().Set("Retry-After", "1")
	}
	if r.Close {
		w.Header().Set("Connection", "close")
	}
	openai.WriteError(w, r.Status, r.Type, r.Message)
}

// raw is r as a whole HTTP/1.1 response, for a connection refused before
// net/http reads anything from it.
func (r *Refusal) raw() []byte {
	extra := ""
	if r.RetryAfter {
		extra = "Retry-After: 1\r\n"
	}
	return []byte(jsonResponse(r.Status, http.StatusText(r.Status), r.Type, r.Message, extra))
}

// Gate admits requests to the server's turns; see the comment above. It
// is safe for concurrent use.
type Gate struct {
	gauge *Gauge
	mem   *Budget
	slots requestSlots
	// delay is waited before each turn request is worked on
	// (Config.TurnDelay).
	delay time.Duration
	// life ends with the server, turns when a stop drops the turns still
	// running: each ends every request admitted.
	life, turns context.Context
	// http is what AdmitHTTP checks.
	http HTTPConfig
	// handling counts the requests whose handler runs, for a stop that
	// waits for the dropped ones to be answered.
	handling atomic.Int64

	// Refusals logs the requests refused for load, by whom.
	Refusals *RefusalLog

	// active counts requests in flight; once closed, none starts.
	mu     sync.Mutex
	closed bool
	active sync.WaitGroup
}

// GateConfig is what a Gate is made of.
type GateConfig struct {
	// Gauge, if not nil, counts the requests admitted.
	Gauge *Gauge
	// Memory is the server's memory budget, shared with its cache.
	Memory *Budget
	// MaxRequests bounds the turn requests worked on at once.
	MaxRequests int
	// Delay is waited before each turn request is worked on.
	Delay time.Duration
	// Life ends with the server; Turns when a stop drops the turns.
	Life, Turns context.Context
	// HTTP is what an HTTP request is checked against (AdmitHTTP).
	HTTP HTTPConfig
	// Log hears of the requests refused for load (RefusalLog).
	Log *slog.Logger
}

// NewGate returns a gate open to requests.
func NewGate(c GateConfig) *Gate {
	g := &Gate{gauge: c.Gauge, mem: c.Memory, delay: c.Delay, life: c.Life, turns: c.Turns, http: c.HTTP, Refusals: NewRefusalLog(c.Log)}
	g.slots.Max = int64(c.MaxRequests)
	return g
}

// Handle counts a request's handler in, for a stop that waits for the
// handlers (Handling); the returned func counts it out.
func (g *Gate) Handle() (done func()) {
	g.handling.Add(1)
	return func() { g.handling.Add(-1) }
}

// Handling is how many request handlers run.
func (g *Gate) Handling() int64 { return g.handling.Load() }

// In counts a request in flight, or reports that the gate is closed;
// Out counts it out. A server's Close waits for those in flight.
func (g *Gate) In() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.active.Add(1)
	return true
}

// Out counts out a request In counted in.
func (g *Gate) Out() { g.active.Done() }

// Close refuses every request from now on and reports whether it was
// closed already.
func (g *Gate) Close() (already bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	already = g.closed
	g.closed = true
	return already
}

// Wait waits until no request counted in is in flight.
func (g *Gate) Wait() { g.active.Wait() }

// Ticket is one request through the gate, from Enter to Leave.
type Ticket struct {
	g      *Gate
	tag    string
	in     bool
	cancel context.CancelFunc
	stops  []func() bool
	mem    *Reservation
}

// Enter takes a request in: counted in the gauge (its tag, if any,
// marked done with when it leaves), counted in flight, and given a
// context that ends with ctx, with the server, and when a stop drops the
// turns, which carries its memory reservation. A closed gate refuses it
// (Stopping); the ticket must be left all the same.
func (g *Gate) Enter(ctx context.Context, tag string) (*Ticket, context.Context, *Refusal) {
	// Counted in the gauge inside the handler's other bookkeeping, so that
	// a stop that waits for the handlers finds the gauge at rest.
	g.gauge.Add(1, 0)
	t := &Ticket{g: g, tag: tag}
	if !g.In() {
		return t, ctx, Stopping()
	}
	t.in = true
	// A crash ends the request at once, as a killed process would; a stop
	// that drops the turns still running ends it too.
	ctx, t.cancel = context.WithCancel(ctx)
	t.stops = append(t.stops, context.AfterFunc(g.life, t.cancel), context.AfterFunc(g.turns, t.cancel))
	// What the request reserves of the memory budget, on its way, is
	// given back when it ends.
	t.mem = &Reservation{b: g.mem}
	ctx = context.WithValue(ctx, reservationKey{}, t.mem)
	return t, context.WithValue(ctx, ticketKey{}, t), nil
}

// ticketKey is the context key of a request's *Ticket.
type ticketKey struct{}

// TicketOf is the ticket of a request's context, the one Enter gave it;
// nil for none.
func TicketOf(ctx context.Context) *Ticket {
	t, _ := ctx.Value(ticketKey{}).(*Ticket)
	return t
}

// Leave counts the request out: what it reserved is given back, its
// context ends, and the gauge hears it is done.
func (t *Ticket) Leave() {
	if t.in {
		t.mem.done()
		for i := len(t.stops) - 1; i >= 0; i-- {
			t.stops[i]()
		}
		t.cancel()
		t.g.Out()
	}
	t.g.gauge.markDone(t.tag)
	t.g.gauge.Add(-1, 0)
}

// Admit takes a turn request through what every protocol's turn
// passes before it runs: the server's deliberate delay, then check (if
// not nil: what the protocol judges before anything is reserved), then
// cost bytes of its body reserved, then read (if not nil: the body read,
// which reports the bytes of cost it did not use), then a request slot.
// It returns the slot's release, or what the request is refused.
func (t *Ticket) Admit(ctx context.Context, check func() *Refusal, cost int64, read func() (unused int64, r *Refusal)) (release func(), r *Refusal) {
	g := t.g
	if g.delay > 0 {
		select {
		case <-time.After(g.delay):
		case <-ctx.Done():
			return nil, ClientLeft // the client left: nothing was worked on
		}
	}
	if check != nil {
		if r := check(); r != nil {
			return nil, r
		}
	}
	if !t.mem.Grow(requestOverhead + bodyFactor*cost) {
		return nil, g.OverBudget().Early()
	}
	if read != nil {
		unused, r := read()
		if r != nil {
			return nil, r
		}
		// The body is in: from here it costs what it is.
		t.mem.Shrink(bodyFactor * unused)
	}
	if !g.slots.take() {
		why := fmt.Sprintf("the server is working on %d requests, its limit (--max-requests)", g.slots.Max)
		g.Refusals.Refused("max_requests", why)
		return nil, Overloaded(why + "; nothing was changed: retry shortly")
	}
	return g.slots.give, nil
}

// OverBudget is the refusal of a request for want of memory.
func (g *Gate) OverBudget() *Refusal {
	why := fmt.Sprintf("the server's memory budget (%d bytes, --max-memory) is taken by the requests in flight", g.mem.Max)
	g.Refusals.Refused("memory", why)
	return Overloaded(why + "; nothing was changed: retry shortly")
}

// MaxMemory is the memory budget in bytes.
func (g *Gate) MaxMemory() int64 { return g.mem.Max }

// Memory is the memory budget, for what the server keeps beside its
// cache (an A2A agent's tasks) to be counted in; nil for none.
func (g *Gate) Memory() *Budget { return g.mem }

// Tag is the tag the request came with (RequestTagHeader); "" for none,
// or for no ticket.
func (t *Ticket) Tag() string {
	if t == nil {
		return ""
	}
	return t.tag
}
