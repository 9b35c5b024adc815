package admission

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/turncheck/turncheck/internal/openai"
)

// One memory budget (Config.MaxMemory) bounds what clients and the model
// can make the server hold: the conversation cache, the request bodies
// being read, and the turns in flight (the history each model call sends,
// the reply it streams back). Each of them reserves what it will cost
// before it allocates it, and gives it back when done. The cache yields:
// when a request cannot reserve, the least recently used cached
// conversations are dropped to make room (the store is durable: a dropped
// conversation is loaded again on its next turn); when the cache grows
// past the budget, it drops its oldest. A request that still cannot
// reserve is refused with 503 and Retry-After, nothing changed; a turn
// whose reply outgrows the budget mid-stream fails as a model failure
// does, with nothing committed.
//
// What a thing costs is measured in live heap bytes, by the factors
// below; what the budget does not count (the Go runtime, SQLite's page
// cache, goroutine stacks, the garbage between two collections) is the
// fixed margin the command adds to the budget for the process's GC limit
// (turncheck serve).

// Cost factors: messageOverhead measured with runtime.ReadMemStats after a
// GC (a conversation loaded from the store, held), the others from how the
// code allocates; TestServeStaysInItsMemoryBudget (cmd/turncheck) checks
// them together against the process's RSS.
const (
	// MessageOverhead is what a cached message costs besides its text: the
	// message struct, its pointer, the slice's share (measured: about
	// 100 bytes on amd64).
	MessageOverhead = 128
	// historyFactor is what a model call costs per byte of the history it
	// sends: encoding/json builds the body in a buffer that grows by
	// doubling, then copies it out (3x at the peak), while the turn holds
	// its base conversation, which the cache may have dropped meanwhile.
	historyFactor = 4
	// ReplyFactor is what a reply in flight costs per byte of its text
	// (and of its tool calls): the reply's builder grows by doubling (2x,
	// 3x while it grows), and the answer's encoding is as long again as
	// the reply.
	ReplyFactor = 3
	// StreamFactor is what a byte of the model's stream costs until its
	// event is decoded: in the stream reader's buffer (which grows by
	// doubling for a long event), then in the event's data and in the
	// decoded chunk.
	StreamFactor = 3
	// bodyFactor is what a request body costs per byte: the body, and the
	// strings decoded from it, with slack for the buffer's growth.
	bodyFactor = 3
	// requestOverhead is what every request in flight costs whatever its
	// size: buffers of its connection and of its model call, its
	// goroutine's stack, the decoded request.
	requestOverhead = 64 << 10
)

// ErrOverBudget fails a turn whose reservation cannot be had: the memory
// budget is taken by the requests in flight.
var ErrOverBudget = errors.New("the server's memory budget is taken by the requests in flight")

// Budget is the server's memory budget. It is safe for concurrent use,
// and takes no lock of its own, so that the cache may charge it under its
// lock and it may call the cache's eviction.
type Budget struct {
	// Max is the budget in bytes.
	Max  int64
	used atomic.Int64
	// Evict drops the least recently used cached conversation, giving
	// back its charge, and reports false when there was none.
	Evict func() bool
}

// reserve takes n bytes of the budget, dropping cached conversations to
// make room; false if the requests in flight leave no room.
//
// It takes the bytes only where they fit (compare and swap): adding first
// and giving back after would, for a moment, show a request that fits,
// and the cache, a budget taken by one that does not.
func (b *Budget) reserve(n int64) bool {
	for {
		used := b.used.Load()
		if used+n <= b.Max {
			if b.used.CompareAndSwap(used, used+n) {
				return true
			}
			continue
		}
		if b.Evict == nil || !b.Evict() {
			return false
		}
	}
}

// Charge takes n bytes whether or not they fit: what the cache has
// already been given. The cache drops its oldest to get back inside.
func (b *Budget) Charge(n int64) { b.used.Add(n) }

// Over reports whether more is taken than the budget allows.
func (b *Budget) Over() bool { return b.used.Load() > b.Max }

// Release gives back n bytes taken.
func (b *Budget) Release(n int64) { b.used.Add(-n) }

// Reservation is what one request holds of the budget; it is given back
// whole when the request ends (done).
type Reservation struct {
	b    *Budget
	held atomic.Int64
}

// Grow reserves n more bytes for the request, or reports that they cannot
// be had.
func (r *Reservation) Grow(n int64) bool {
	if n <= 0 {
		return true
	}
	if !r.b.reserve(n) {
		return false
	}
	r.held.Add(n)
	return true
}

// Shrink gives n bytes back before the request ends.
func (r *Reservation) Shrink(n int64) {
	r.held.Add(-n)
	r.b.Release(n)
}

// done gives back everything the request holds.
func (r *Reservation) done() { r.b.Release(r.held.Swap(0)) }

// reservationKey is the context key of a request's *reservation.
type reservationKey struct{}

// ReservationOf returns the reservation of a request's context: the one
// ServeHTTP made for it. A context without one (a turn that completes
// keeps its request's values) gets a reservation of nothing that refuses
// nothing, which cannot happen for a request ServeHTTP serves.
func ReservationOf(ctx context.Context) *Reservation {
	if r, ok := ctx.Value(reservationKey{}).(*Reservation); ok {
		return r
	}
	return &Reservation{b: &Budget{Max: math.MaxInt64}}
}

// HistoryCost is what a model call sending history costs while it runs:
// its text as JSON encodes it, which may be six times as long ("<" is
// "\u003c"), so that a client cannot make a small history a large
// request.
func HistoryCost(history []openai.Message) int64 {
	var n int64
	for _, m := range history {
		n += jsonTextLen(string(m.Content)) + MessageOverhead
		for _, c := range m.ToolCalls {
			n += jsonTextLen(c.ID) + jsonTextLen(c.Function.Name) + jsonTextLen(c.Function.Arguments) + MessageOverhead
		}
	}
	return historyFactor * n
}

// jsonTextLen is the length of s as encoding/json writes it in a string,
// without its quotes.
func jsonTextLen(s string) int64 {
	n := int64(len(s))
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			switch {
			case r == utf8.RuneError && size == 1:
				n += 5 // an invalid byte becomes \ufffd
			case r == '\u2028' || r == '\u2029':
				n += 3 // written \u2028, \u2029
			}
			i += size
			continue
		}
		switch {
		case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t':
			n++
		case c < 0x20 || c == '<' || c == '>' || c == '&':
			n += 5
		}
		i++
	}
	return n
}

// MinMaxMemory is the least budget a server with cfg's limits takes: one
// turn at every limit must fit (a body of MaxBodyBytes, a history of
// MaxHistoryBytes of plain text, a reply of the longest the model may
// send), or it would be refused however long its client waited.
func MinMaxMemory(maxBody, maxHistory, maxReply int64) int64 {
	return requestOverhead + bodyFactor*maxBody + historyFactor*maxHistory + ReplyFactor*maxReply
}

// MemoryShare is the share of the machine's memory a server takes for its
// budget when Config.MaxMemory is 0: a quarter. The process needs more
// than its budget (the margin the budget does not count), its store needs
// the kernel's page cache, and the machine is rarely the server's alone.
const MemoryShare = 4

// FallbackMaxMemory is the budget when the machine's memory cannot be
// read (not Linux).
const FallbackMaxMemory = 1 << 30

// DefaultMaxMemory is the budget of a server whose Config.MaxMemory is 0:
// a quarter (MemoryShare) of the memory this process may use, the lesser
// of the machine's physical memory (/proc/meminfo MemTotal) and the limit
// of its cgroup (cgroup v2 memory.max, or v1 memory.limit_in_bytes), if
// one is set: in a container, the cgroup's limit is what the kernel's OOM
// killer enforces, whatever the machine has. It also says where the
// figure came from, for the log.
func DefaultMaxMemory() (int64, string) {
	total, from := int64(0), ""
	if n, ok := memTotal("/proc/meminfo"); ok {
		total, from = n, "physical memory"
	}
	for _, path := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		if n, ok := cgroupLimit(path); ok && (total == 0 || n < total) {
			total, from = n, "the cgroup's memory limit ("+path+")"
			break
		}
	}
	if total == 0 {
		return FallbackMaxMemory, "a fallback: the machine's memory could not be read"
	}
	return total / MemoryShare, fmt.Sprintf("1/%d of %s, %d bytes", MemoryShare, from, total)
}

// memTotal reads MemTotal (in kB) from a meminfo file.
func memTotal(path string) (int64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			return kb << 10, err == nil && kb > 0
		}
	}
	return 0, false
}

// cgroupLimit reads a cgroup memory limit: none when the file is missing,
// says "max" (v2), or holds v1's "unlimited" (a number near 2^63).
func cgroupLimit(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n <= 0 || n >= 1<<62 {
		return 0, false
	}
	return n, true
}
