// Package faults holds what turncheck injects into a server under test: the
// fake model provider that records what the server sends it and answers, or
// fails, by the token of each turn; and the lifecycle of a server run as a
// subprocess (start on a free loopback port, readiness, graceful stop,
// kill -9, restart on the same data), which restarts and crashes build on.
package faults

import (
	"fmt"
)

// Kind is a kind of model fault.
type Kind int

// The kinds of model fault.
const (
	// None: the model answers normally.
	None Kind = iota
	// Status: the model answers an error status (500, 502, 503, 429).
	Status
	// Hold: the model holds the call, without answering, until the server
	// gives up on it (its timeout) or the call is otherwise cancelled (the
	// client aborted). No timer on the model's side decides anything.
	Hold
	// Cut: the model cuts the stream after After chunks.
	Cut
	// Malformed: the model sends a malformed chunk after After good ones.
	Malformed
)

var kindNames = [...]string{"none", "model-error", "model-timeout", "stream-cut", "malformed-chunk"}

// String is the kind's name as reports and counts show it.
func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// MarshalText writes the kind's name.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText reads a kind's name.
func (k *Kind) UnmarshalText(b []byte) error {
	for i, name := range kindNames {
		if name == string(b) {
			*k = Kind(i)
			return nil
		}
	}
	return fmt.Errorf("unknown fault kind %q", b)
}

// Fault is the fake model's script for one turn's token.
type Fault struct {
	Kind Kind `json:"kind"`
	// Status is the HTTP status of a Status fault; below 400 means 500.
	Status int `json:"status,omitempty"`
	// RetryHint adds a Retry-After header to a Status fault.
	RetryHint bool `json:"retryHint,omitempty"`
	// After is how many reply chunks go out before a Cut or Malformed fault.
	After int `json:"after,omitempty"`
	// Times limits the fault to the first Times calls of the turn at
	// Round; later ones (a server retrying the model) are answered
	// normally. 0: every call.
	Times int `json:"times,omitempty"`
	// Round is the model call of the turn's tool loop the fault hits: 0
	// the first call, k the call that carries the results of k tool rounds
	// (see Reply). Calls before it are answered normally, so that a turn
	// can fail after its tools ran (PROTOCOL.md, "tool turns").
	Round int `json:"round,omitempty"`
}

// String says what the fault does, for a person reading a report.
func (f Fault) String() string {
	var s string
	switch f.Kind {
	case None:
		return "none"
	case Status:
		s = fmt.Sprintf("model-error %d", f.Status)
		if f.RetryHint {
			s += " with Retry-After"
		}
	case Hold:
		s = "model-timeout: the model holds the call until the server gives up"
	case Cut:
		s = fmt.Sprintf("stream-cut after %d chunk(s)", f.After)
	case Malformed:
		s = fmt.Sprintf("malformed-chunk after %d chunk(s)", f.After)
	default:
		s = f.Kind.String()
	}
	if f.Round > 0 {
		s += fmt.Sprintf(" after %d tool round(s)", f.Round)
	}
	if f.Times > 0 {
		s += fmt.Sprintf(" on the first %d call(s)", f.Times)
	}
	return s
}
