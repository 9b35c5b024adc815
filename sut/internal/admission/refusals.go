package admission

import (
	"log/slog"
	"sync"
	"time"
)

// refusalLogEvery is how often, at most, refusals of one kind are logged
// after the first: a flood of them must not flood the log too.
const refusalLogEvery = 10 * time.Second

// RefusalLog logs the requests the server refuses for load, saying who
// refused (the server's own cap on requests, its memory budget, its
// store's pool, PostgreSQL): the first of each kind at once, then at most
// one line per refusalLogEvery with how many came since. An operator who
// sees slow or refused turns finds their cause in the log. A nil
// RefusalLog logs nothing. It is safe for concurrent use.
type RefusalLog struct {
	log *slog.Logger
	now func() time.Time
	mu  sync.Mutex
	by  map[string]*refusals
}

// refusals are one kind's counts: since its last line, and in all.
type refusals struct {
	logged       time.Time
	since, total int64
}

// NewRefusalLog returns a RefusalLog writing to log.
func NewRefusalLog(log *slog.Logger) *RefusalLog {
	return &RefusalLog{log: log, now: time.Now, by: map[string]*refusals{}}
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
	now := l.now()
	if !r.logged.IsZero() && now.Sub(r.logged) < refusalLogEvery {
		l.mu.Unlock()
		return
	}
	since, total := r.since, r.total
	r.logged, r.since = now, 0
	l.mu.Unlock()
	l.log.Warn("refused for load", "by", who, "why", why, "refused_since_last_line", since, "refused_in_all", total)
}
