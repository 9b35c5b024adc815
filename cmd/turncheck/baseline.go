package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/turncheck/turncheck/scenarios/report"
)

const baselineHelp = `Usage: turncheck baseline [--from RESULTS_DIR]... [--out FILE]

Writes a baseline: the findings of one or more conform runs (their FAIL
verdicts, and those KNOWN already), for 'turncheck conform --baseline
FILE' (or the profile's baseline field) to take as known. A server that
already exists has findings nobody has fixed yet; with its baseline, a
run FAILs only on a new finding, lists the known ones as KNOWN (each with
its example, not shrunk again, no failure of the run), and says FIXED of
a known finding whose trigger it drew and whose invariant it exercised
and never broke, so that the baseline can shrink. A known finding whose
trigger the run did not draw is not seen, said in a note, and stays.

Give --from once per run: the baseline holds every finding any of them
found, so that a race one run missed (a crash in 6 runs of 16, say) is
known all the same. --from takes a run's results dir (its verdicts.json)
or a baseline file, to add a run to a baseline already written.

A finding is known by its signature, its root cause: its invariant and
the kind of wrong state it shows, which names what set it off too (a
leftover of a failed, refused, unknown or interrupted turn, a lost
turn), so that one bug has one signature whatever the seed or the text
it said. A finding without such a kind is named by its invariant and
what it said with the run's own names (tokens, conversations, ticks,
counts, quoted server text) taken out; an HTTP status stays in it: a 409
and a 500 are two findings. Its trigger is what its steps drew: their
actions and the faults that took effect. Every conform run also saves
its findings as baseline.json in its results dir.

Exit status: 0 when the baseline was written, 2 when a run's verdicts
could not be read or the file not written.

Examples:
  turncheck conform --profile myserver.yaml --checks 50 --out run1
  turncheck conform --profile myserver.yaml --checks 50 --out run2
  turncheck baseline --from run1 --from run2 --out myserver-baseline.json
  turncheck conform --profile myserver.yaml --checks 50 --baseline myserver-baseline.json
`

func cmdBaseline(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("baseline", baselineHelp, stdout, stderr)
	var from fromFlag
	fs.Var(&from, "from", "a conform run's results dir (its verdicts.json), or a baseline file, whose findings to take (repeatable; default "+filepath.Join(resultsRoot, "latest")+")")
	out := fs.String("out", "turncheck-baseline.json", "where to write the baseline")
	if code := fs.parse(args); code >= 0 {
		return code
	}
	if len(from) == 0 {
		from = fromFlag{filepath.Join(resultsRoot, "latest")}
	}
	var runs []report.Baseline
	for _, f := range from {
		b, err := readFindings(f)
		if err != nil {
			return fail(stderr, "baseline", err)
		}
		runs = append(runs, b)
	}
	b := report.MergeBaselines(runs...)
	f, err := os.Create(*out)
	if err != nil {
		return fail(stderr, "baseline", err)
	}
	if err := errors.Join(b.Write(f), f.Close()); err != nil {
		return fail(stderr, "baseline", err)
	}
	fmt.Fprintf(stdout, "turncheck baseline: %d finding(s) of %d run(s) (%s), written to %s\n", len(b.Findings), len(from), strings.Join(from, ", "), *out)
	for _, k := range b.Findings {
		fmt.Fprintf(stdout, "  %s (found in %d of the runs)\n", k.Signature, k.Runs)
	}
	return exitOK
}

// readFindings reads the findings of from: a run's results dir, or a
// baseline file.
func readFindings(from string) (report.Baseline, error) {
	if st, err := os.Stat(from); err == nil && !st.IsDir() {
		return report.ReadBaseline(from)
	}
	c, err := report.ReadConformance(filepath.Join(from, "verdicts.json"))
	if err != nil {
		return report.Baseline{}, fmt.Errorf("%w (give the results dir of a conform run, or a baseline file, with --from)", err)
	}
	if c.Shard != "" {
		return report.Baseline{}, fmt.Errorf("%s: the verdicts are one shard's: merge the run's shards first ('turncheck merge --json F'), and take the baseline of the whole run", from)
	}
	return c.Baseline(), nil
}

// fromFlag is the repeatable --from.
type fromFlag []string

func (f *fromFlag) String() string { return strings.Join(*f, ",") }

func (f *fromFlag) Set(v string) error {
	if v == "" {
		return errors.New("want a results dir or a baseline file")
	}
	*f = append(*f, v)
	return nil
}
