//go:build unix

package scenarios_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/testbin"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/sut"
)

// profileTarget is profiles/reference.yaml with its server run from bin,
// extra appended to the server's command line.
func profileTarget(tb testing.TB, bin string, extra ...string) scenarios.Target {
	return slowStartTarget(tb, bin, 0, "", extra...)
}

// slowStartTarget is profileTarget whose server, when delay is not 0,
// waits that long before it starts, each start counted by a line in the
// file starts.
func slowStartTarget(tb testing.TB, bin string, delay time.Duration, starts string, extra ...string) scenarios.Target {
	tb.Helper()
	base, err := os.ReadFile("../profiles/reference.yaml")
	require.NoError(tb, err)
	run := bin + ","
	if delay > 0 {
		run = fmt.Sprintf(`sh, -c, 'echo start >> "%s"; sleep %g; exec "$0" "$@"', %s,`, starts, delay.Seconds(), bin)
	}
	text := strings.Replace(string(base), "command: [turncheck,", "command: ["+run, 1)
	text = strings.Replace(text, "timeout: 15s", fmt.Sprintf("timeout: %s", delay+15*time.Second), 1)
	for _, arg := range extra {
		text = strings.Replace(text, "--request-timeout, 1s]", "--request-timeout, 1s, "+arg+"]", 1)
	}
	target, err := scenarios.ParseProfile([]byte(text))
	require.NoError(tb, err)
	return target
}

// BenchmarkChecksPerMinute measures whole checks through the reference
// profile, the server a subprocess, one check at a time and as many at
// once as the machine has cores: on the reference server as it is, and
// on one that waits 300 ms before each turn (serve --turn-delay).
func BenchmarkChecksPerMinute(b *testing.B) {
	bin := testbin.Turncheck(b)
	for _, server := range []struct {
		name   string
		extra  []string
		checks int
	}{{"reference", nil, 12}, {"slow-300ms", []string{"--turn-delay, 300ms"}, 4}} {
		target := profileTarget(b, bin, server.extra...)
		for _, parallel := range []int{1, scenarios.Parallel(target, 0)} {
			b.Run(fmt.Sprintf("%s/parallel=%d", server.name, parallel), func(b *testing.B) {
				measureChecks(b, target, server.checks, parallel)
			})
		}
	}
}

// BenchmarkFirstFailThroughProfile runs each mutant through the reference
// profile until its first failure (fail fast), as many checks at once as
// the machine has cores: when the finding is printed (found and shrunk),
// how long shrinking took, how many steps it came to and how many
// candidates it replayed.
func BenchmarkFirstFailThroughProfile(b *testing.B) {
	bin := testbin.Turncheck(b)
	for _, delay := range []time.Duration{0, time.Second} {
		for _, m := range sut.Mutants() {
			starts := filepath.Join(b.TempDir(), "starts")
			extra := []string{"--mutant, " + string(m.Mutant)}
			if m.Mutant == sut.LostOnEvict {
				extra = append(extra, "--conversations-max, 2")
			}
			if m.Interruption == sut.KeepConsistent {
				extra = append(extra, "--interruption, keep-consistent")
			}
			s := slowStartTarget(b, bin, delay, starts, extra...).(scenarios.Subprocess)
			if m.Interruption == sut.KeepConsistent {
				s.Reaches.Interruption = scenarios.KeepConsistent
			}
			// A loss on eviction depends on what else the cache holds: a
			// fresh server per check, as in the conform test.
			s.FreshPerCheck = m.Mutant == sut.LostOnEvict
			b.Run(fmt.Sprintf("start=%s/%s", delay, m.Mutant), func(b *testing.B) {
				var first, shrinking time.Duration
				steps, replays, n := 0, 0, 0
				for b.Loop() {
					start := time.Now()
					var at time.Duration
					c, err := scenarios.Conform(s, scenarios.Options{Checks: 60, Steps: 20, Seed: 2, FailFast: true,
						ShrinkTime: 10 * time.Second, Parallel: scenarios.Parallel(s, 0),
						Found: func(*scenarios.Failure, scenarios.Stats) { at = time.Since(start) }})
					require.NoError(b, err)
					fs := c.Failures()
					require.NotEmpty(b, fs, "%s not caught", m.Mutant)
					f := fs[0]
					b.Logf("%s: %s in %s; %s", m.Mutant, f.Violation.Invariant, at.Round(time.Millisecond), f.ShrinkStats())
					first, shrinking = first+at, shrinking+f.ShrunkIn
					steps, replays, n = steps+len(f.Plans), replays+f.ShrinkRuns, n+1
				}
				b.ReportMetric(first.Seconds()/float64(n), "s-to-FAIL")
				b.ReportMetric(shrinking.Seconds()/float64(n), "shrink-s")
				b.ReportMetric(float64(steps)/float64(n), "steps")
				b.ReportMetric(float64(replays)/float64(n), "replays")
				if delay > 0 {
					// Whole runs: the checks' starts and the shrink's.
					text, err := os.ReadFile(starts)
					require.NoError(b, err)
					b.ReportMetric(float64(strings.Count(string(text), "start"))/float64(n), "starts")
				}
			})
		}
	}
}

// BenchmarkSlowServerCoverage is how long a slow server takes to have
// every applicable invariant exercised: the reference profile, the
// server waiting 15 s before each start and 3 s before each turn, checked
// with conform's defaults for at most 10 minutes. It reports the time to
// full coverage (the end of the first check after which nothing
// applicable is NOT EXERCISED), or 600 s and what was left, and the
// run's pace line.
func BenchmarkSlowServerCoverage(b *testing.B) {
	bin := testbin.Turncheck(b)
	starts := filepath.Join(b.TempDir(), "starts")
	target := slowStartTarget(b, bin, 15*time.Second, starts, "--turn-delay, 3s")
	// The reference profile offers tools, two keys, an agent source and
	// durability across restarts and crashes: all but the ACP wire.
	applicable := []model.Invariant{"T1", "T2", "T3", "T4", "T5", "T6", "T7", "T8", "T9", "T10", "T11", "crash"}
	for b.Loop() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		start := time.Now()
		var covered time.Duration
		var last scenarios.Stats
		_, err := scenarios.Conform(target, scenarios.Options{Seed: 1, Context: ctx, Progress: func(s scenarios.Stats) {
			last = s
			if covered == 0 && !slices.ContainsFunc(applicable, func(inv model.Invariant) bool { return s.Invariants[inv] == 0 }) {
				covered = time.Since(start)
				cancel()
			}
		}})
		cancel()
		if err != nil && !errors.Is(err, scenarios.ErrInterrupted) {
			b.Fatal(err)
		}
		var left []model.Invariant
		for _, inv := range applicable {
			if last.Invariants[inv] == 0 {
				left = append(left, inv)
			}
		}
		if covered == 0 {
			covered = 10 * time.Minute
		}
		b.Logf("covered in %s after %d check(s), %d step(s); not exercised: %v\n%s", covered.Round(time.Second), last.Checks, last.Steps, left, last.Summary())
		b.ReportMetric(covered.Seconds(), "s-to-coverage")
		b.ReportMetric(float64(len(left)), "not-exercised")
	}
}
