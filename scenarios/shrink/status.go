package shrink

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/turncheck/turncheck/scenarios/report"
)

// State says how far the shrink got, for a report, and a note on what
// that rests on. Shrunk means that the search ran to its end, that no
// smaller candidate it tried broke the invariant on any of the tries it
// needed, and that the run reported broke it again when confirmed (on a
// fresh server where the run shared one). Short of that, the state is
// PartlyShrunk where the run reported is smaller than the failing run,
// NotShrunk where it is the failing run itself. The note says how many
// candidates were tried how often, and what kept the state from Shrunk.
// Where the bound ended, or the shrinker gave up (GaveUp), before the
// failure reproduced, it is NotShrunk, and the note says so.
func (s *Shrinker) State() (report.ShrinkState, string) {
	notes := []string{s.tally()}
	undecided := 0
	for _, c := range s.cands {
		// One passed over for a smaller one kept in its round decided
		// nothing the search needed.
		if c.left && !c.kept && c.tries-c.errs < s.needs(c) {
			undecided++
		}
	}
	if undecided > 0 {
		notes = append(notes, fmt.Sprintf("%d of them given fewer tries than they needed", undecided))
	}
	if s.Dropped > 0 {
		n := count(s.Dropped, "smaller run") + " that broke it did not break it again"
		if s.fresh {
			n += " on a fresh server"
		}
		notes = append(notes, n)
	}
	if s.Cut {
		what := "the search ended"
		if len(s.found) == 0 {
			what = "the failing run's steps broke it again"
		}
		ended := "the run was stopped before " + what
		if b := (boundError{}); errors.As(context.Cause(s.ctx), &b) {
			ended = b.Error() + " before " + what
		}
		notes = append(notes, ended)
	}
	if s.gaveUp {
		after := "before any replay"
		if s.Runs > 0 {
			after = "after " + count(s.Runs, "replay") + ", none of which broke it again"
		}
		bound := time.Duration(float64(s.reproduceIn) / ReproduceShare)
		notes = append(notes, fmt.Sprintf("gave up %s: one at the %s the failing run took would have ended past %s, the %.0f%% of its %s bound a failure has to reproduce in",
			after, roughly(s.took), roughly(s.reproduceIn), ReproduceShare*100, roughly(bound)))
	}
	switch {
	case len(s.found) == 0:
		// Nothing reproduced: nothing to confirm; the failing run as it
		// was is reported.
	case s.unconfirmed:
		notes = append(notes, "its steps did not break it again on a fresh server")
	case s.unreplayed && s.fresh:
		notes = append(notes, "its steps could not be replayed on a fresh server to confirm them")
	case s.unreplayed:
		notes = append(notes, "its steps could not be replayed again to confirm them")
	case !s.confirmed && s.fresh:
		notes = append(notes, "its steps were not confirmed on a fresh server")
	case !s.confirmed:
		notes = append(notes, "its steps were not confirmed by another replay")
	}
	note := strings.Join(notes, "; ")
	switch {
	case undecided == 0 && s.Dropped == 0 && !s.Cut && s.confirmed:
		return report.Shrunk, note
	case len(s.found) > 0 && s.found[len(s.found)-1].smaller:
		return report.PartlyShrunk, note
	}
	return report.NotShrunk, note
}

// tally says how many smaller candidates were tried, and how many of
// them how often where more than once: "14 candidates tried, 9 of them
// twice".
func (s *Shrinker) tally() string {
	byTries, tried := map[int]int{}, 0
	for _, c := range s.cands {
		if c.tries > 0 {
			byTries[c.tries]++
			tried++
		}
	}
	if tried == 0 {
		return "no smaller candidate tried"
	}
	b := count(tried, "candidate") + " tried"
	for _, tries := range slices.Sorted(maps.Keys(byTries)) {
		if tries < 2 {
			continue
		}
		how := "twice"
		if tries > 2 {
			how = fmt.Sprintf("%d times", tries)
		}
		if tried == 1 {
			b += ", " + how
			continue
		}
		b += fmt.Sprintf(", %d of them %s", byTries[tries], how)
	}
	return b
}

// count is n of noun, in the plural where n is not 1.
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// roughly is d rounded to a unit that suits it: seconds from a second
// up, milliseconds below.
func roughly(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Second)
	case d >= time.Millisecond:
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}
