package config

import "fmt"

// Concurrency is what the server does with a request for a conversation
// whose turn is already running.
type Concurrency string

// The concurrency policies PROTOCOL.md allows a server to declare (T4).
const (
	// Serialize makes the request wait its turn, first come first served,
	// for at most RequestTimeout (then 503 conversation_busy).
	Serialize Concurrency = "serialize"
	// Reject answers the request 409 conflict at once, before any model
	// call; nothing changes.
	Reject Concurrency = "reject"
	// Supersede, for an ACP prompt, cancels the session's running prompt
	// (answered stopReason cancelled, its turn ended as one whose client
	// sent session/cancel: the interruption policy decides what stays),
	// then runs the new one once it is done, as docker-agent's and
	// openclaw's agents do. Other protocols serialize.
	Supersede Concurrency = "supersede"
)

// ParseConcurrency returns the policy named s ("" for Serialize), or an
// error naming the valid values.
func ParseConcurrency(s string) (Concurrency, error) {
	switch c := Concurrency(s); c {
	case "":
		return Serialize, nil
	case Serialize, Reject, Supersede:
		return c, nil
	}
	return "", fmt.Errorf("unknown concurrency policy %q (want %s, %s or %s)", s, Serialize, Reject, Supersede)
}
