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
	l.after = func(time.Duration, func()) func() bool { return func() bool { return true } }

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
	none.Flush()
}

// TestRefusalLogMissesNone: refusals counted after a line are logged
// once the next line is due, though no refusal comes then, and those
// still pending when the server stops are logged at its Flush: every
// refusal is in some line.
func TestRefusalLogMissesNone(t *testing.T) {
	var buf bytes.Buffer
	l := NewRefusalLog(slog.New(slog.NewTextHandler(&buf, nil)))
	clock := time.Unix(0, 0)
	l.now = func() time.Time { return clock }
	var due []func()
	var dueIn []time.Duration
	l.after = func(d time.Duration, f func()) func() bool {
		due, dueIn = append(due, f), append(dueIn, d)
		return func() bool { return true }
	}

	l.Refused("store_pool", "all held")
	clock = clock.Add(4 * time.Second)
	l.Refused("store_pool", "all held")
	l.Refused("store_pool", "all held")
	if !assert.Len(t, due, 1, "one line due for both") {
		return
	}
	assert.Equal(t, refusalLogEvery-4*time.Second, dueIn[0], "due when the interval since the last line ends")
	clock = clock.Add(6 * time.Second)
	due[0]()
	l.Refused("memory", "budget taken")
	clock = clock.Add(time.Second)
	l.Refused("memory", "budget taken")
	l.Flush()
	l.Flush()

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if !assert.Len(t, lines, 4, buf.String()) {
		return
	}
	assert.Contains(t, lines[0], "by=store_pool")
	assert.Contains(t, lines[0], "refused_since_last_line=1 refused_in_all=1")
	assert.Contains(t, lines[1], "by=store_pool")
	assert.Contains(t, lines[1], "refused_since_last_line=2 refused_in_all=3", "the two since, though no third came")
	assert.Contains(t, lines[2], "by=memory")
	assert.Contains(t, lines[3], "by=memory")
	assert.Contains(t, lines[3], "refused_since_last_line=1 refused_in_all=2", "the one pending at the stop")
}
