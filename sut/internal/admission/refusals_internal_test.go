package admission

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestRefusalLogSaysWhoAndHowMany: the first refusal of each kind is
// logged at once, with who refused; those that follow within the
// interval are counted, and the next line says how many came since.
func TestRefusalLogSaysWhoAndHowMany(t *testing.T) {
	var buf bytes.Buffer
	l := NewRefusalLog(slog.New(slog.NewTextHandler(&buf, nil)))
	clock := time.Unix(0, 0)
	l.now = func() time.Time { return clock }

	l.Refused("postgresql", "too many clients")
	for range 5 {
		l.Refused("postgresql", "too many clients")
	}
	l.Refused("max_requests", "512 in flight")
	clock = clock.Add(refusalLogEvery)
	l.Refused("postgresql", "too many clients")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if !assert.Len(t, lines, 3, buf.String()) {
		return
	}
	assert.Contains(t, lines[0], "by=postgresql")
	assert.Contains(t, lines[0], "refused_since_last_line=1 refused_in_all=1")
	assert.Contains(t, lines[1], "by=max_requests")
	assert.Contains(t, lines[2], "refused_since_last_line=6 refused_in_all=7")

	var none *RefusalLog
	none.Refused("postgresql", "nothing logged, no panic")
}
