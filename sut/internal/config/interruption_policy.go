package config

import "fmt"

// Interruption is what a turn leaves in its conversation when its client
// disconnects while it runs (PROTOCOL.md, T10). Under Rollback and
// KeepConsistent the turn stops at once: no model call and no tool run
// starts for it after the disconnect is seen. Under Complete it runs on to
// its end, as if the client had stayed.
type Interruption string

// The interruption policies PROTOCOL.md allows a server to declare (T10).
const (
	// Rollback leaves the conversation as it was before the turn: nothing
	// of the turn is committed.
	Rollback Interruption = "rollback"
	// KeepConsistent commits, if at least one of the turn's tool rounds
	// completed, the turn's user message and its completed rounds (each
	// assistant tool call message with all its results), and nothing
	// after: never a round whose results are not all in, never a reply.
	// With no round completed it commits nothing, as Rollback.
	KeepConsistent Interruption = "keep-consistent"
	// Complete does not stop the turn: it runs to its end (its model
	// calls and tool rounds go on, each still bounded by RequestTimeout)
	// on a context detached from the client, and commits the turn whole
	// if it ends ok, nothing if it fails, as if the client had stayed. The
	// conversation's lock is held, and the request counts as working, until
	// then. Only the server itself ends such a turn early: a crash, or a
	// stop that drops the turns still running (Running.Close, or
	// Running.Shutdown past its deadline); it then commits nothing.
	Complete Interruption = "complete"
)

// ParseInterruption returns the policy named s ("" for Rollback), or an
// error naming the valid values.
func ParseInterruption(s string) (Interruption, error) {
	switch p := Interruption(s); p {
	case "":
		return Rollback, nil
	case Rollback, KeepConsistent, Complete:
		return p, nil
	}
	return "", fmt.Errorf("unknown interruption policy %q (want %s, %s or %s)", s, Rollback, KeepConsistent, Complete)
}
