package execute

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// NotStarted is the error of a server that did not start within its
// tries (targets.Profile.StartTries): at its first start, a start
// between two checks, a start for a replay, or a restart or crash a step
// drew (PROTOCOL.md, "A server starts"). It is the start finding
// (model.Start), not an error of the harness's, and it ends the run: no
// server is left to check. A lab whose server did not start says so
// again at every later start (Lab.NotStarted).
type NotStarted struct {
	// Start says which start failed, in words: "its start", "its crash
	// (kill -9) and restart drawn at step 7", ...
	Start string
	// Check is the number of the check it stopped, where the run that met
	// it says (0 where none does: a replay, or after a run's last check);
	// Step is the step of that check that drew it, 0 for a start before
	// the check's first step.
	Check, Step int
	// Closing says that it failed as check Check closed, after its last
	// step: the restart that starts the next check as every check starts.
	Closing bool
	// Tries is how many times the start was tried.
	Tries int
	// Err is what the last try came to.
	Err error
}

// Error says where in the run the server did not start, which start
// failed, in how many tries, and what the last try came to.
func (e *NotStarted) Error() string {
	at := ""
	switch {
	case e.Check > 0 && e.Closing:
		at = fmt.Sprintf(" after check %d", e.Check)
	case e.Check > 0 && e.Step > 0:
		at = fmt.Sprintf(" at step %d of check %d", e.Step, e.Check)
	case e.Check > 0:
		at = fmt.Sprintf(" at check %d", e.Check)
	case e.Step > 0:
		at = fmt.Sprintf(" at step %d", e.Step)
	}
	tries := "in 1 try"
	if e.Tries != 1 {
		tries = fmt.Sprintf("in %d tries", e.Tries)
	}
	return fmt.Sprintf("the server did not start%s: %s failed %s (server.start_tries: %d): %v", at, e.Start, tries, e.Tries, e.Err)
}

// Unwrap is the last try's error.
func (e *NotStarted) Unwrap() error { return e.Err }

// Output is what the server wrote in its last try, as far as its start
// kept it (faults.StartError.Output); "" where the start quotes nothing.
func (e *NotStarted) Output() string {
	var se *faults.StartError
	if errors.As(e.Err, &se) {
		return strings.TrimRight(se.Output, "\n")
	}
	return ""
}

// retriedLines bounds the server's output a note of a start tried again
// quotes: its last words say why, and the notes stay readable.
const retriedLines = 10

// firstStartFailed reports whether err, from a first start of a server
// (Target.Start), says that the server ran and did not get ready: a
// process of the target's that exited, or was not ready in time. Any
// other error (a command that cannot run, a file that cannot be written,
// a Go target's own) is no start that can be tried again, and no
// finding: nothing shows that the profile can start the server at all.
func firstStartFailed(err error) bool {
	var se *faults.StartError
	return errors.As(err, &se)
}

// restartFailed reports whether err, from a restart of a server the
// harness started before, is the server's: whatever it is, but an error
// of the harness's own parts. The same command started the server
// already; what keeps it from starting again is the server's.
func restartFailed(err error) bool { return !errors.Is(err, targets.ErrHarness) }

// ended reports whether ctx, if set, has ended: a start it cut short is
// the run's doing, never the server's.
func ended(ctx context.Context) bool { return ctx != nil && ctx.Err() != nil }

// tryStart runs start, a start of the server (what says which, in
// words), up to its profile's tries while it fails in a way failed
// says is the server's, noting each try tried again (Retried) with what
// the server last wrote. ctx ending stops the tries. It returns how many
// tries ran and the last one's error; a start that got ready is counted
// (Starts).
func (l *Lab) tryStart(ctx context.Context, what string, start func() error, failed func(error) bool) (int, error) {
	n := l.Profile.StartTriesOrDefault()
	for try := 1; ; try++ {
		err := start()
		if err == nil {
			l.Starts++
			return try, nil
		}
		if try >= n || !failed(err) || ended(ctx) {
			return try, err
		}
		l.Retried = append(l.Retried, fmt.Sprintf("the server's start failed, and was tried again (try %d of %d, server.start_tries): %s: %s",
			try, n, what, clipLines(err.Error(), retriedLines)))
	}
}

// notStarted records that the server did not start (what, at step of a
// check, 0 for none) in tries, the last one coming to err, and returns
// the lab's record: the first such, which every later start returns.
func (l *Lab) notStarted(what string, step, tries int, err error) *NotStarted {
	if l.NotStarted == nil {
		l.NotStarted = &NotStarted{Start: what, Step: step, Tries: tries, Err: err}
	}
	return l.NotStarted
}

// restart starts the server r again, stopped gracefully or killed
// (crash), loading the agent from refs (nil: as before), up to its
// tries; ctx, if set, bounds it. A restart the server failed in every
// try is recorded, and returned, as NotStarted; another error (the
// harness's, or ctx's) as it is.
func (l *Lab) restart(ctx context.Context, r targets.Restarter, crash bool, refs []string, what string) error {
	if l.NotStarted != nil {
		return l.NotStarted
	}
	restart := restartIn(ctx, r)
	tries, err := l.tryStart(ctx, what, func() error { return restart(crash, refs) }, restartFailed)
	if err == nil || !restartFailed(err) || ended(ctx) {
		return err
	}
	return l.notStarted(what, 0, tries, err)
}

// restartIn is r's restart, bounded by ctx (if set) where r takes one: the
// run's or the shrink's time bound holds through a restart of a server
// slow to start.
func restartIn(ctx context.Context, r targets.Restarter) func(crash bool, refs []string) error {
	if rc, ok := r.(targets.ContextRestarter); ok && ctx != nil {
		return func(crash bool, refs []string) error { return rc.RestartContext(ctx, crash, refs) }
	}
	return r.Restart
}

// clipLines is text with at most n lines after its first, the last ones:
// an error's first line says what failed, the output's last lines why.
func clipLines(text string, n int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) <= n+1 {
		return strings.Join(lines, "\n")
	}
	cut := len(lines) - 1 - n
	return lines[0] + fmt.Sprintf("\n  [turncheck: %d earlier line(s) left out]\n", cut) + strings.Join(lines[len(lines)-n:], "\n")
}
