// Package goroutines reads the process's own goroutines, by the labels
// they carry: a harness that serves a handler in process labels each
// request's goroutine, every goroutine it starts inherits the label, and a
// look at them all says whether the request is at rest, parked on a lock
// or a channel, or still working, with no timer.
package goroutines

import (
	"bytes"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
)

// G is a group of goroutines with the same stack and labels, as the
// goroutine profile shows them.
type G struct {
	// Count is how many goroutines the group holds.
	Count int
	// Labels are the pprof labels they carry.
	Labels map[string]string
	// Top is the innermost function of the stack, the runtime's own
	// included: runtime.gopark for a goroutine that waits.
	Top string
	// Funcs are the functions of the stack, innermost first, the
	// runtime's left out.
	Funcs []string
}

// Snapshot returns every goroutine of the process, in groups.
func Snapshot() []G {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1) // writes to memory: no error
	return parse(b.String())
}

// label is one "key":"value" of a "# labels: {...}" line.
var label = regexp.MustCompile(`("(?:[^"\\]|\\.)*"):("(?:[^"\\]|\\.)*")`)

// parse reads the goroutine profile's text at debug level 1: groups, each
// a header ("3 @ 0x43d0ce 0x44f8c5 ..."), perhaps a "# labels:" line, and
// a "#\tPC\tfunc+off\tfile:line" line per frame.
func parse(text string) []G {
	var gs []G
	for block := range strings.SplitSeq(text, "\n\n") {
		lines := strings.Split(strings.TrimSpace(block), "\n")
		// The first group follows the profile's own header line.
		if len(lines) > 1 && !strings.Contains(lines[0], " @ ") {
			lines = lines[1:]
		}
		count, pcs, ok := strings.Cut(lines[0], " @ ")
		n, err := strconv.Atoi(count)
		if !ok || err != nil {
			continue
		}
		g := G{Count: n}
		if top, _, _ := strings.Cut(pcs, " "); top != "" {
			if pc, err := strconv.ParseUint(top, 0, 64); err == nil && pc > 0 {
				// A return address: the call is the byte before it.
				if f := runtime.FuncForPC(uintptr(pc - 1)); f != nil {
					g.Top = f.Name()
				}
			}
		}
		for _, l := range lines[1:] {
			if labels, ok := strings.CutPrefix(l, "# labels: "); ok {
				g.Labels = map[string]string{}
				for _, m := range label.FindAllStringSubmatch(labels, -1) {
					k, err1 := strconv.Unquote(m[1])
					v, err2 := strconv.Unquote(m[2])
					if err1 == nil && err2 == nil {
						g.Labels[k] = v
					}
				}
				continue
			}
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "#" {
				fn, _, _ := strings.Cut(f[2], "+0x")
				g.Funcs = append(g.Funcs, fn)
			}
		}
		gs = append(gs, g)
	}
	return gs
}

// outbound are the functions of a call made to another server, such as the
// model: a goroutine waiting for its answer is working.
var outbound = []string{"net/http.(*Transport).", "net/http.(*Client).", "net/http.send", "net.(*Dialer)."}

// State is what a goroutine, or all of a request's, are doing.
type State int

// The states, from the least at rest to the most.
const (
	// None: no goroutine carries the label.
	None State = iota
	// Working: running, runnable, or waiting for the answer to a call of
	// its own.
	Working
	// Asleep: waiting on a timer (time.Sleep), for something no one
	// announces, such as a lock polled or a backoff.
	Asleep
	// Parked: waiting for another goroutine, or a client, to act: on a
	// lock, a channel, a condition or a read.
	Parked
)

// State says what the goroutines are doing.
func (g G) State() State {
	if g.Top != "runtime.gopark" && g.Top != "runtime.goparkunlock" {
		return Working
	}
	for _, f := range g.Funcs {
		for _, o := range outbound {
			if strings.HasPrefix(f, o) {
				return Working
			}
		}
	}
	if slices.Contains(g.Funcs, "time.Sleep") {
		return Asleep
	}
	return Parked
}

// States says, of each value, what the goroutines of gs carrying the label
// key=value are doing: the least at rest of them, None if none does.
func States(gs []G, key string, values []string) []State {
	least := map[string]State{}
	for _, g := range gs {
		v, ok := g.Labels[key]
		if !ok {
			continue
		}
		st := g.State()
		if cur, seen := least[v]; !seen || st < cur {
			least[v] = st
		}
	}
	out := make([]State, len(values))
	for i, v := range values {
		out[i] = least[v] // None if unseen
	}
	return out
}
