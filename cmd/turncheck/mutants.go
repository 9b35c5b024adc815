package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/sut"
)

const mutantsHelp = `Usage: turncheck mutants [--list] [--json] [--checks N] [--seed S] [--shrink-time D] [MUTANT...]

The track record: runs the checker against the clean reference server and
against every mutant, each of which brings back a real bug from a real
server, and prints a table: the mutant, the issue it reproduces, whether it
was caught, how long catching and shrinking took, how short the failure
shrank, and the invariant it broke. The mutants of replicas over one
PostgreSQL are left out: one process does not show their bugs, and they
are caught through profiles/reference-replicas.yaml with "--mutant, NAME"
added to its command. Exit status 0 only if every mutant was caught and
the clean server passed.

--list only lists the mutants and the bugs they bring back. Name mutants
to run only those, after the clean server.

Examples:
  turncheck mutants
  turncheck mutants mutate-before-run acp-cancel-commits
  turncheck mutants --json > track-record.json
  turncheck mutants --list
`

// trackRow is one line of the track record.
type trackRow struct {
	Mutant    string `json:"mutant"`
	Issue     string `json:"issue"`
	Caught    bool   `json:"caught"`
	Invariant string `json:"invariant,omitempty"`
	// CatchMS and ShrinkMS are the time to the first violation and the
	// time spent shrinking it.
	CatchMS  int64 `json:"catchMs"`
	ShrinkMS int64 `json:"shrinkMs"`
	// Steps is the shrunk failure's length.
	Steps int    `json:"steps"`
	Seed  uint64 `json:"seed"`
	// Passed is, for the clean server, that no failure was found.
	Passed bool `json:"passed,omitempty"`
	// Reproduce is the command that shows it.
	Reproduce string `json:"reproduce"`
}

func cmdMutants(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("mutants", mutantsHelp, stdout, stderr)
	list := fs.Bool("list", false, "only list the mutants and the bugs they bring back")
	asJSON := fs.Bool("json", false, "print the track record as JSON")
	checks := fs.Int("checks", 100, "state-machine runs to try per server")
	seed := fs.Uint64("seed", 0, "seed of every server's first run; 0 draws one each")
	shrink := fs.Duration("shrink-time", 10*time.Second, "time limit for shrinking each failure; a failure has half of it to break its invariant again in, and its shrink gives up before a replay that would end past that")
	fs.positional = math.MaxInt // the mutants to run, all if none
	if code := fs.parse(args); code >= 0 {
		return code
	}
	if *list {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MUTANT\tFROM\tBREAKS\tBUG")
		for _, m := range sut.Mutants() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", m.Mutant, m.Issue, m.Breaks, m.Bug)
		}
		_ = tw.Flush()
		return exitOK
	}
	if *checks <= 0 || *shrink <= 0 {
		return fail(stderr, "mutants", errors.New("--checks and --shrink-time must be positive"))
	}
	opts := scenarios.Options{Checks: *checks, Seed: *seed, ShrinkTime: *shrink, Context: ctx}
	named, unknown := map[string]bool{}, map[string]bool{}
	for _, name := range fs.Args() {
		named[name], unknown[name] = true, true
	}
	servers := []sut.MutantInfo{{Mutant: sut.Clean, Issue: "-", Breaks: "-"}}
	var replicated []string
	for _, m := range sut.Mutants() {
		if len(named) > 0 && !named[string(m.Mutant)] {
			continue
		}
		delete(unknown, string(m.Mutant))
		if m.Replicas > 0 {
			// A bug of replicas over one PostgreSQL: the command runs the
			// server in process on SQLite, where it does not show; the
			// tests catch it on replicas over a PostgreSQL of their own.
			replicated = append(replicated, string(m.Mutant))
			continue
		}
		servers = append(servers, m)
	}
	if len(unknown) > 0 {
		names := slices.Sorted(maps.Keys(unknown))
		fmt.Fprintf(stderr, "turncheck mutants: no mutant named %s (see 'turncheck mutants --list')\n", strings.Join(names, ", "))
		return exitUsage
	}
	var rows []trackRow
	ok := true
	for _, info := range servers {
		if isTerminal(stderr) {
			fmt.Fprintf(stderr, "\r\033[Kchecking %s...", mutantLabel(info.Mutant))
		}
		res, err := scenarios.Check(reference.WithMutant(info.Mutant), opts)
		if isTerminal(stderr) {
			fmt.Fprint(stderr, "\r\033[K")
		}
		if err != nil {
			return fail(stderr, "mutants", fmt.Errorf("%s: %w", mutantLabel(info.Mutant), err))
		}
		row := trackRow{Mutant: mutantLabel(info.Mutant), Issue: info.Issue, Seed: res.Seed,
			Reproduce: "turncheck check"}
		if info.Mutant != sut.Clean {
			row.Reproduce += " --mutant " + string(info.Mutant)
		}
		f := res.Failure
		if f != nil && f.Violation != nil && !f.Flaky {
			row.Caught, row.Invariant, row.Steps = true, string(f.Violation.Invariant), len(f.Plans)
			row.CatchMS, row.ShrinkMS = f.FoundIn.Milliseconds(), f.ShrunkIn.Milliseconds()
		}
		if info.Mutant == sut.Clean {
			// The clean server passes only with no failure at all: a flaky
			// one, or the harness failing, is no pass.
			row.Passed = f == nil
			if f != nil && f.Violation != nil {
				row.Invariant = string(f.Violation.Invariant)
			}
			ok = ok && row.Passed
		} else {
			ok = ok && row.Caught
		}
		rows = append(rows, row)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rows)
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MUTANT\tFROM\tCAUGHT\tCATCH\tSHRINK\tSTEPS\tINVARIANT\tREPRODUCE")
		for _, r := range rows {
			caught := "no"
			switch {
			case r.Mutant == "none" && r.Passed:
				caught = "passes"
			case r.Mutant == "none":
				caught = "FAILS"
			case r.Caught:
				caught = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Mutant, r.Issue, caught,
				time.Duration(r.CatchMS)*time.Millisecond, time.Duration(r.ShrinkMS)*time.Millisecond, r.Steps,
				orDash(r.Invariant), r.Reproduce)
		}
		_ = tw.Flush()
	}
	if len(replicated) > 0 {
		fmt.Fprintf(stderr, "turncheck mutants: not run in process, caught on replicas over PostgreSQL through profiles/reference-replicas.yaml, '--mutant, NAME' added to its command: %s\n",
			strings.Join(replicated, ", "))
	}
	if !ok {
		fmt.Fprintln(stderr, "turncheck mutants: a mutant went uncaught, or the clean server failed")
		return exitViolation
	}
	return exitOK
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
