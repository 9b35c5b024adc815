package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/turncheck/turncheck/model"
)

// A server that already exists has findings that are known and not fixed
// yet. A baseline lists them, so that a run can gate on what is new: a
// finding whose signature is in the baseline is KNOWN (listed, with its
// shrunk example, and no failure of the run); one that is not FAILs; a
// known finding whose invariant was exercised and passed is FIXED, so
// that the baseline can shrink. Each run saves its findings as a baseline
// in its results dir (BaselineFile).

// BaselineFile is the name of the baseline a run saves in its results dir:
// its findings, FAIL and KNOWN.
const BaselineFile = "baseline.json"

// BaselineSchema names the version of the baseline format.
const BaselineSchema = "turncheck/baseline/v1"

// Known and Fixed are what a baseline makes of a verdict.
const (
	// Known: broken, in a way the baseline lists: the finding is shown,
	// and is no failure of the run.
	Known Status = "known"
	// Fixed: the baseline lists a finding of this invariant, and the run
	// exercised it and never broke it: take it out of the baseline.
	Fixed Status = "fixed"
)

// Baseline is a list of findings accepted as known.
type Baseline struct {
	Schema   string         `json:"schema"`
	Findings []KnownFinding `json:"findings"`
}

// KnownFinding is one finding of a baseline: its invariant, its
// signature (Signature), and the first line of what it said, for a person.
type KnownFinding struct {
	Invariant model.Invariant `json:"invariant"`
	Signature string          `json:"signature"`
	Said      string          `json:"said,omitempty"`
}

// Variable parts of a finding's message, which differ between runs and
// seeds of the same finding: the harness's tokens, tool call ids,
// conversations, keys and ticks; quoted text (a server's error message,
// with its ports and paths); and every other number but an HTTP status.
var (
	sigTokens = regexp.MustCompile(`\btc-([a-z])[0-9-]+`)
	sigConv   = regexp.MustCompile(`\bconv-[0-9a-z]+|\bkey-[a-z0-9]+`)
	sigQuoted = regexp.MustCompile(`"[^"]*"|'[^']*'`)
	sigCount  = regexp.MustCompile(`\b(ticks?|steps?|checks?|call|turns?) [0-9]+\b`)
	sigNumber = regexp.MustCompile(`\b[0-9]+\b`)
	// sigStatus matches the HTTP statuses a server answers a turn with.
	sigStatus = regexp.MustCompile(`^(20[0-6]|4[0-2][0-9]|43[01]|451|50[0-9]|511)$`)
)

// Signature names a finding the same way whatever the run, seed or
// shrink that found it: its invariant, the kind of wrong state it shows
// (model.Kind), and the first line of what it said with every variable
// part (a token, a conversation, a tick, quoted text, a count) replaced.
// An HTTP status stays: a 409 and a 500 are two findings.
func Signature(v Verdict) string {
	// The violation's own text, without the invariant and conversation
	// Error() puts before it; else what the verdict says.
	var said string
	if v.Failure != nil && v.Failure.Violation != nil {
		said = firstLine(v.Failure.Violation.Reason)
	} else {
		said = firstLine(v.message())
	}
	said = sigTokens.ReplaceAllString(said, "tc-${1}N")
	said = sigConv.ReplaceAllString(said, "C")
	said = sigQuoted.ReplaceAllString(said, `"…"`)
	said = sigCount.ReplaceAllString(said, "$1 N")
	said = sigNumber.ReplaceAllStringFunc(said, func(n string) string {
		if sigStatus.MatchString(n) {
			return n
		}
		return "N"
	})
	sig := string(v.Invariant)
	if v.Failure != nil && v.Failure.Violation != nil && v.Failure.Violation.Kind != "" {
		sig += " [" + string(v.Failure.Violation.Kind) + "]"
	}
	return sig + ": " + said
}

// Baseline is the run's findings (its FAIL and KNOWN verdicts), as a
// baseline that a later run takes to gate on new findings only.
func (c *Conformance) Baseline() Baseline {
	b := Baseline{Schema: BaselineSchema, Findings: []KnownFinding{}}
	for _, v := range c.Verdicts {
		if v.Status == Fail || v.Status == Known {
			b.Findings = append(b.Findings, KnownFinding{Invariant: v.Invariant, Signature: Signature(v), Said: firstLine(v.message())})
		}
	}
	return b
}

// Write writes b as indented JSON.
func (b Baseline) Write(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(b)
}

// ReadBaseline reads a baseline file: one written by a run (BaselineFile
// in its results dir) or by 'turncheck baseline'. A file that is not one
// is an error that says so.
func ReadBaseline(path string) (Baseline, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Baseline{}, fmt.Errorf("baseline: %w", err)
	}
	var b Baseline
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return Baseline{}, fmt.Errorf("baseline %s: not a turncheck baseline: %w", path, err)
	}
	if b.Schema != BaselineSchema {
		return Baseline{}, fmt.Errorf("baseline %s: schema %q; want %q (write one with 'turncheck baseline')", path, b.Schema, BaselineSchema)
	}
	for i, f := range b.Findings {
		if !slices.Contains(Judged(), f.Invariant) || f.Signature == "" {
			return Baseline{}, fmt.Errorf("baseline %s: findings[%d]: want an invariant turncheck judges (%q) and a signature", path, i, f.Invariant)
		}
	}
	return b, nil
}

// ApplyBaseline judges c's verdicts against b, read from the file named
// from: a FAIL whose signature b lists is KNOWN; a PASS of an invariant b
// lists a finding of is FIXED. What b lists that the run could not look
// for (its invariant failed first in another way, or was not exercised)
// is said in a note: neither found nor fixed.
func (c *Conformance) ApplyBaseline(b Baseline, from string) {
	c.BaselineFrom = from
	known := map[string]bool{}
	for _, f := range b.Findings {
		known[f.Signature] = true
	}
	matched := map[string]bool{}
	for i := range c.Verdicts {
		v := &c.Verdicts[i]
		if v.Status != Fail {
			continue
		}
		if sig := Signature(*v); known[sig] {
			v.Status, matched[sig] = Known, true
		}
	}
	for _, f := range b.Findings {
		if matched[f.Signature] {
			continue
		}
		i := slices.IndexFunc(c.Verdicts, func(v Verdict) bool { return v.Invariant == f.Invariant })
		if i < 0 {
			continue
		}
		v := &c.Verdicts[i]
		switch v.Status {
		case Pass, Fixed:
			v.Status = Fixed
			v.Reason = strings.TrimPrefix(v.Reason+"; ", "; ") + "the baseline's finding was not found: " + f.Signature
		case Fail, Known, SameCause:
			c.Notes = append(c.Notes, fmt.Sprintf("the baseline's finding %q was not looked for: %s was found broken in another way first", f.Signature, f.Invariant))
		default:
			c.Notes = append(c.Notes, fmt.Sprintf("the baseline's finding %q is neither found nor fixed: %s is %s", f.Signature, f.Invariant, v.Status))
		}
	}
}

// Lists reports whether b lists f, a failure as it is found: false for a
// nil baseline.
func (b *Baseline) Lists(f *Failure) bool {
	if b == nil || f == nil || f.Violation == nil {
		return false
	}
	sig := Signature(Verdict{Invariant: f.Violation.Invariant, Status: Fail, Failure: f})
	return slices.ContainsFunc(b.Findings, func(k KnownFinding) bool { return k.Signature == sig })
}

// knownCount is how many verdicts are KNOWN.
func (c *Conformance) knownCount() int {
	n := 0
	for _, v := range c.Verdicts {
		if v.Status == Known {
			n++
		}
	}
	return n
}
