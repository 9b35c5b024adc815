package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/turncheck/turncheck/scenarios/report"
)

const mergeHelp = `Usage: turncheck merge [--json F] [--junit F] SHARD.json...

Joins the verdicts of the shards of one run ('turncheck conform --shard
K/N --seed S --json F', run anywhere: a CI matrix, several machines) into
the run's verdicts, prints them as conform does, and writes them as JSON
and JUnit where asked.

An invariant fails if it failed in a shard, with the failure of the
earliest check; a failure of the same kind of wrong state as one found at
an earlier check is a same cause; it passes if it passed in a shard and
broke in none; evaluations and counts add up. Every shard of the run must
be given, once, all from one seed: a merge without one would pass what
never ran. Past a finding, a whole run goes on past the violations it
sets aside, where a shard that had not found it stops a check: what the
merge says was exercised may then differ from a whole run's, never what
it found.

Exit status: as conform's, for the merged verdicts: 0 when they conform,
1 when they are broken, 4 when nothing broke but they prove no
conformance (NOT PROVEN), 2 when the shards could not be read or merged.

Examples:
  turncheck conform --profile p.yaml --seed 7 --shard 1/3 --json s1.json
  turncheck conform --profile p.yaml --seed 7 --shard 2/3 --json s2.json
  turncheck conform --profile p.yaml --seed 7 --shard 3/3 --json s3.json
  turncheck merge --json run.json --junit junit.xml s1.json s2.json s3.json
`

func cmdMerge(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("merge", mergeHelp, stdout, stderr)
	jsonPath := fs.String("json", "", "write the merged verdicts as JSON to this file")
	junitPath := fs.String("junit", "", "write the merged verdicts as JUnit XML, one test case per invariant, to this file")
	fs.positional = math.MaxInt // the shards' files
	if code := fs.parse(args); code >= 0 {
		return code
	}
	if fs.NArg() == 0 {
		return fail(stderr, "merge", errors.New("give the verdicts.json of every shard of the run (see 'turncheck merge --help')"))
	}
	var shards []*report.Conformance
	for _, path := range fs.Args() {
		c, err := report.ReadConformance(path)
		if err != nil {
			return fail(stderr, "merge", err)
		}
		shards = append(shards, c)
	}
	c, err := report.Merge(shards)
	if err != nil {
		return fail(stderr, "merge", err)
	}
	fmt.Fprintf(stdout, "turncheck merge: %d shard(s) of the run from seed %d\n", len(shards), c.Seed)
	for _, f := range c.Failures() {
		fmt.Fprint(stdout, report.FindingText(f)+"\n")
	}
	fmt.Fprint(stdout, c.Table())
	return conclude("merge", c, nil, *jsonPath, *junitPath, stdout, stderr)
}
