package a2a

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/turncheck/turncheck/sut/internal/turn"
)

// TestReplyPiecesCostTheirLength: a reply streamed in many small pieces,
// as real models stream, costs its task memory in proportion to its
// length, not its square: a 400 KB reply in 16-byte pieces summed piece
// by piece allocated some 5 GB. Bytes allocated, not time, are measured:
// a loaded machine changes the one, never the other.
func TestReplyPiecesCostTheirLength(t *testing.T) {
	h := &Handler{Engine: &turn.Engine{}}
	p := &responder{h: h, task: &task{}}
	piece := strings.Repeat("x", 16)
	const pieces = 25_000 // 400 KB
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range pieces {
		p.Delta(nil, piece)
	}
	runtime.ReadMemStats(&after)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(64*16*pieces), "bytes allocated for a reply of %d bytes", 16*pieces)
}
