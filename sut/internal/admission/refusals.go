package admission

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// refusalLogEvery is how often, at most, refusals of one kind are logged
// after the first: a flood of them must not flood the log too.
const refusalLogEvery = 10 * time.Second

// RefusalLog logs the requests the server refuses for load, saying who
// refused (the server's own cap on requests, its memory budget, its
// store's pool, PostgreSQL): the first of each kind at once, then at most
// one line per refusalLogEvery with how many came since. Refusals counted
// and not yet logged are logged refusalLogEvery after the last line,
// though no other comes, and at Flush: every refusal is in a line. An
// operator who sees slow or refused turns finds their cause in the log.
// A nil RefusalLog logs nothing. It is safe for concurrent use.
type RefusalLog struct {
	log *slog.Logger
	now func() time.Time
	// after runs f once d has passed (time.AfterFunc), returning what
	// stops it.
	after func(d time.Duration, f func()) (stop func() bool)
	mu    sync.Mutex
	by    map[string]*refusals
}

// refusals are one kind's counts: since its last line, and in all.
type refusals struct {
	logged       time.Time
	since, total int64
	// why is the last refusal's, for the line that counts it.
	why string
	// stop, while not nil, stops the line due for the refusals since.
	stop func() bool
}

// NewRefusalLog returns a RefusalLog writing to log.
func NewRefusalLog(log *slog.Logger) *RefusalLog {
	return &RefusalLog{log: log, now: time.Now, by: map[string]*refusals{},
		after: func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }}
}

// Refused counts a refusal by who (a short name: max_requests, memory,
// store_pool, postgresql) and logs it, rate-limited; why says what was
// refused and how.
func (l *RefusalLog) Refused(who, why string) {
	if l == nil || l.log == nil {
		return
	}
	l.mu.Lock()
	r := l.by[who]
	if r == nil {
		r = &refusals{}
		l.by[who] = r
	}
	r.since++
	r.total++
	r.why = why
	now := l.now()
	if !r.logged.IsZero() && now.Sub(r.logged) < refusalLogEvery {
		if r.stop == nil {
			r.stop = l.after(refusalLogEvery-now.Sub(r.logged), func() { l.due(who) })
		}
		l.mu.Unlock()
		return
	}
	ln := r.take(who, now)
	l.mu.Unlock()
	l.write(ln)
}

// due logs who's refusals counted since its last line, once their line
// is due.
func (l *RefusalLog) due(who string) {
	l.mu.Lock()
	r := l.by[who]
	r.stop = nil
	if r.since == 0 {
		l.mu.Unlock()
		return
	}
	ln := r.take(who, l.now())
	l.mu.Unlock()
	l.write(ln)
}

// Flush logs, at once, the refusals of every kind not yet in a line: the
// server is stopping.
func (l *RefusalLog) Flush() {
	if l == nil || l.log == nil {
		return
	}
	l.mu.Lock()
	var lines []refusalLine
	for who, r := range l.by {
		if r.since > 0 {
			lines = append(lines, r.take(who, l.now()))
		}
	}
	l.mu.Unlock()
	slices.SortFunc(lines, func(a, b refusalLine) int { return strings.Compare(a.who, b.who) })
	for _, ln := range lines {
		l.write(ln)
	}
}

// refusalLine is one line of the log: who refused, why, and how many.
type refusalLine struct {
	who, why     string
	since, total int64
}

// take is r's line at now, the count since it set back and the line due
// for it called off; the caller holds the log's lock.
func (r *refusals) take(who string, now time.Time) refusalLine {
	if r.stop != nil {
		r.stop()
		r.stop = nil
	}
	ln := refusalLine{who: who, why: r.why, since: r.since, total: r.total}
	r.logged, r.since = now, 0
	return ln
}

// write logs ln.
func (l *RefusalLog) write(ln refusalLine) {
	l.log.Warn("refused for load", "by", ln.who, "why", ln.why, "refused_since_last_line", ln.since, "refused_in_all", ln.total)
}
