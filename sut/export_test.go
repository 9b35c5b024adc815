package sut

import (
	"time"

	"github.com/turncheck/turncheck/sut/internal/acp/stdio"
	"github.com/turncheck/turncheck/sut/internal/store"
	"github.com/turncheck/turncheck/sut/internal/turn"
)

// SetFlushInterval sets how often the ack-before-durable mutant flushes
// its queue, for the servers started after it, until restore.
func SetFlushInterval(d time.Duration) (restore func()) {
	old := store.FlushInterval
	store.FlushInterval = d
	return func() { store.FlushInterval = old }
}

// SetAgentFetchTimeout sets the bound on fetching an agent reference, for
// the servers started after it, until restore.
func SetAgentFetchTimeout(d time.Duration) (restore func()) {
	old := turn.AgentFetchTimeout
	turn.AgentFetchTimeout = d
	return func() { turn.AgentFetchTimeout = old }
}

// Redact is what a server configured with keys and modelURL logs of s.
func Redact(keys []string, modelURL, s string) string {
	u, err := turn.ParseModelURL(modelURL)
	if err != nil {
		panic(err)
	}
	return turn.NewRedactor(keys, u).Redact(s)
}

// SetConnClock sets the clock r's connection cap judges stalls by.
func (r *Running) SetConnClock(now func() time.Time) {
	r.conns.SetClock(now)
}

// SetACPWriteTimeout sets how long an ACP server waits for its client to
// take a line of its output, for the servers started after it, until
// restore.
func SetACPWriteTimeout(d time.Duration) (restore func()) {
	old := stdio.WriteTimeout
	stdio.WriteTimeout = d
	return func() { stdio.WriteTimeout = old }
}
