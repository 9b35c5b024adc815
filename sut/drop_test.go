package sut_test

import (
	"context"
	"log/slog"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/sut"
)

// TestStopPastItsGraceAnswersWhatItDrops: when a stop's grace runs out,
// the turns still running are dropped cleanly. A plain request gets 503
// with a JSON error, a stream an error chunk and [DONE], and a turn
// queued behind one on its conversation 503 too; none commits anything,
// and the log says that the server dropped them, not that their clients
// went away.
func TestStopPastItsGraceAnswersWhatItDrops(t *testing.T) {
	var log syncbuf.Buffer
	cfg := sut.Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}
	e := newToolEnv(t, cfg)
	e.history(t, "a", "tc-u1")
	e.history(t, "b", "tc-u2")
	ha, hb := newHeld(), newHeld()
	e.model.script("tc-u3", toolStep{hold: ha})
	// The stream has begun (its first round asked for a tool) when its
	// second call is held.
	e.model.script("tc-u4", ask(echo("c1", "a")), toolStep{hold: hb})
	plain := e.send(t, "a", "tc-u3", false)
	stream := e.send(t, "b", "tc-u4", true)
	await(t, ha.arrived, "the held call of tc-u3")
	await(t, hb.arrived, "the held call of tc-u4")
	queued := e.send(t, "a", "tc-u5", false)
	awaitWaiting(t, e.gauge, 1)

	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	require.ErrorIs(t, e.srv.Shutdown(ctx), context.DeadlineExceeded)

	for _, f := range []*inFlight{plain, queued} {
		r := f.wait(t)
		requireErrorBody(t, r, http.StatusServiceUnavailable, "unavailable")
		assert.Contains(t, string(r.body), "dropped this turn")
		assert.Equal(t, "1", r.header.Get("Retry-After"))
	}
	r := stream.wait(t)
	require.Equal(t, http.StatusOK, r.status, "the stream had begun: %s", r.body)
	s := parseStream(t, r)
	assert.True(t, s.done, "the stream ends with [DONE]")
	assert.Equal(t, 1, s.errors(), "with an error chunk before it")
	assert.Contains(t, log.String(), "dropped by the server")
	assert.NotContains(t, log.String(), "client went away")

	e.start(sut.Config{})
	assert.Equal(t, lines("user tc-u1", "assistant tc-a1", "user tc-u6"), shape(e.history(t, "a", "tc-u6")))
	assert.Equal(t, lines("user tc-u2", "assistant tc-a2", "user tc-u7"), shape(e.history(t, "b", "tc-u7")))
}
