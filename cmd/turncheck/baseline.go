package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/turncheck/turncheck/scenarios/report"
)

const baselineHelp = `Usage: turncheck baseline [--from RESULTS_DIR] [--out FILE]

Writes a baseline: the findings of a conform run (its FAIL verdicts, and
those KNOWN already), for 'turncheck conform --baseline FILE' (or the
profile's baseline field) to take as known. A server that already exists
has findings nobody has fixed yet; with its baseline, a run FAILs only on
a new finding, lists the known ones as KNOWN (each with its shrunk
example, no failure of the run), and says FIXED of a known finding whose
invariant it exercised and never broke, so that the baseline can shrink.

A finding is known by its signature: its invariant, the kind of wrong
state it shows, and what it said with the run's own names (tokens,
conversations, ticks, counts, quoted server text) taken out, so that the
same bug found from another seed, or shrunk to other steps, has the same
one. An HTTP status stays in it: a 409 and a 500 are two findings. Every
conform run also saves its findings as baseline.json in its results dir.

Exit status: 0 when the baseline was written, 2 when the run's verdicts
could not be read or the file not written.

Examples:
  turncheck conform --profile myserver.yaml --checks 50
  turncheck baseline --out myserver-baseline.json
  turncheck conform --profile myserver.yaml --checks 50 --baseline myserver-baseline.json
`

func cmdBaseline(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("baseline", baselineHelp, stdout, stderr)
	from := fs.String("from", filepath.Join(resultsRoot, "latest"), "the results dir of the conform run whose findings to take (its verdicts.json)")
	out := fs.String("out", "turncheck-baseline.json", "where to write the baseline")
	if code := fs.parse(args); code >= 0 {
		return code
	}
	c, err := report.ReadConformance(filepath.Join(*from, "verdicts.json"))
	if err != nil {
		return fail(stderr, "baseline", fmt.Errorf("%w (give the results dir of a conform run with --from)", err))
	}
	if c.Shard != "" {
		return fail(stderr, "baseline", errors.New("the verdicts are one shard's: merge the run's shards first ('turncheck merge --json F'), and take the baseline of the whole run"))
	}
	b := c.Baseline()
	f, err := os.Create(*out)
	if err != nil {
		return fail(stderr, "baseline", err)
	}
	if err := errors.Join(b.Write(f), f.Close()); err != nil {
		return fail(stderr, "baseline", err)
	}
	fmt.Fprintf(stdout, "turncheck baseline: %d finding(s) of the run in %s, written to %s\n", len(b.Findings), *from, *out)
	for _, k := range b.Findings {
		fmt.Fprintf(stdout, "  %s\n", k.Signature)
	}
	return exitOK
}
