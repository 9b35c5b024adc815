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
	"github.com/turncheck/turncheck/scenarios/history"
)

// A server that already exists has findings that are known and not fixed
// yet. A baseline lists them, so that a run can gate on what is new: a
// finding whose signature is in the baseline is KNOWN (listed, with its
// example, not shrunk again, and no failure of the run); one that is not
// FAILs; a known finding whose trigger the run drew, and whose invariant
// held, is FIXED, so that the baseline can shrink; one whose trigger was
// not drawn is not seen, and stays. Each run saves its findings as a
// baseline in its results dir (BaselineFile); MergeBaselines joins those
// of several runs, so that a race one run missed is known all the same.

// BaselineFile is the name of the baseline a run saves in its results dir:
// its findings, FAIL and KNOWN.
const BaselineFile = "baseline.json"

// BaselineSchema names the version of the baseline format. v2 names a
// finding by its root cause (Signature) and keeps its trigger; a v1 file
// is read, its signatures taken to their root cause, with no trigger.
const BaselineSchema = "turncheck/baseline/v2"

// baselineV1 is the schema of the first baseline format.
const baselineV1 = "turncheck/baseline/v1"

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
// signature (Signature), the first line of what it said, for a person,
// and its trigger: what its steps drew (history.Trigger), all of which a
// run must draw before it can call the finding fixed. Runs counts the
// runs merged into the baseline that found it (MergeBaselines).
type KnownFinding struct {
	Invariant model.Invariant `json:"invariant"`
	Signature string          `json:"signature"`
	Said      string          `json:"said,omitempty"`
	Trigger   []string        `json:"trigger,omitempty"`
	Runs      int             `json:"runs,omitempty"`
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

// Signature names a finding by its root cause, the same way whatever the
// run, seed or shrink that found it. A finding with a kind of wrong state
// (model.Kind: a leftover of a failed, refused, unknown or interrupted
// turn, a lost turn) is its invariant and kind, which name both the wrong
// state and what set it off: the same bug says "reached the model in a
// later turn" at one seed and "appears 2 times" at another. Any other is
// its invariant and the first line of what it said with every variable
// part (a token, a conversation, a tick, quoted text, a count) replaced;
// an HTTP status stays: a 409 and a 500 are two findings.
func Signature(v Verdict) string {
	if v.Failure != nil && v.Failure.Violation != nil && v.Failure.Violation.Kind != "" {
		return rootCause(v.Invariant, v.Failure.Violation.Kind)
	}
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
	return string(v.Invariant) + ": " + said
}

// rootCause is the signature of a finding of inv with kind.
func rootCause(inv model.Invariant, kind model.Kind) string {
	return fmt.Sprintf("%s [%s]", inv, kind)
}

// Baseline is the run's findings (its FAIL and KNOWN verdicts), as a
// baseline that a later run takes to gate on new findings only.
func (c *Conformance) Baseline() Baseline {
	b := Baseline{Schema: BaselineSchema, Findings: []KnownFinding{}}
	for _, v := range c.Verdicts {
		if v.Status == Fail || v.Status == Known {
			k := KnownFinding{Invariant: v.Invariant, Signature: Signature(v), Said: firstLine(v.message()), Runs: 1}
			if v.Failure != nil {
				k.Trigger = history.Trigger(v.Failure.History)
			}
			b.Findings = append(b.Findings, k)
		}
	}
	return b
}

// MergeBaselines joins baselines, each of one run or already merged,
// into one: every finding any of them lists, once by signature, with the
// runs that found it summed and the smallest trigger any of them kept
// (the fewest steps that set it off), so that a race one run found and
// another missed is known to both.
func MergeBaselines(bs ...Baseline) Baseline {
	out := Baseline{Schema: BaselineSchema, Findings: []KnownFinding{}}
	at := map[string]int{}
	for _, b := range bs {
		for _, f := range b.Findings {
			f.Runs = max(f.Runs, 1)
			i, ok := at[f.Signature]
			if !ok {
				at[f.Signature] = len(out.Findings)
				out.Findings = append(out.Findings, f)
				continue
			}
			k := &out.Findings[i]
			k.Runs += f.Runs
			if len(f.Trigger) > 0 && (len(k.Trigger) == 0 || len(f.Trigger) < len(k.Trigger)) {
				k.Trigger = f.Trigger
			}
		}
	}
	slices.SortStableFunc(out.Findings, func(a, b KnownFinding) int {
		return slices.Index(Judged(), a.Invariant) - slices.Index(Judged(), b.Invariant)
	})
	return out
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
	if b.Schema != BaselineSchema && b.Schema != baselineV1 {
		return Baseline{}, fmt.Errorf("baseline %s: schema %q; want %q (write one with 'turncheck baseline')", path, b.Schema, BaselineSchema)
	}
	for i, f := range b.Findings {
		if !slices.Contains(Judged(), f.Invariant) || f.Signature == "" {
			return Baseline{}, fmt.Errorf("baseline %s: findings[%d]: want an invariant turncheck judges (%q) and a signature", path, i, f.Invariant)
		}
		if b.Schema == baselineV1 {
			// v1 named a finding with a kind by its text too: its root
			// cause is what comes before the text.
			if head, _, ok := strings.Cut(f.Signature, "]: "); ok && strings.HasPrefix(f.Signature, string(f.Invariant)+" [") {
				b.Findings[i].Signature = head + "]"
			}
		}
	}
	b.Schema = BaselineSchema
	return b, nil
}

// ApplyBaseline judges c's verdicts against b, read from the file named
// from: a FAIL whose signature b lists is KNOWN. A finding b lists that
// the run did not find is FIXED where the run drew its whole trigger and
// its invariant passed, and otherwise said in a note, not seen: its
// trigger was not drawn, or its invariant was not judged (it failed
// first in another way, or was not exercised). With a KNOWN finding, an
// invariant not exercised is SET ASIDE: the known findings' conversations
// were set aside as each was seen, and with them what would have
// exercised it.
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
	if len(matched) > 0 {
		for i := range c.Verdicts {
			if v := &c.Verdicts[i]; v.Status == NotExercised {
				v.Status = Aside
				v.Reason += "; the known findings' conversations were set aside as each was seen, and with them what may have exercised it"
			}
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
		missing := slices.DeleteFunc(slices.Clone(f.Trigger), func(d string) bool { return c.Stats.Drawn[d] > 0 })
		switch {
		case (v.Status == Pass || v.Status == Fixed) && len(missing) == 0:
			v.Status = Fixed
			v.Reason = strings.TrimPrefix(v.Reason+"; ", "; ") + "the baseline's finding was not found"
			if len(f.Trigger) > 0 {
				v.Reason += ", its trigger drawn (" + strings.Join(f.Trigger, ", ") + ")"
			} else {
				v.Reason += " (the baseline keeps no trigger: write it again with 'turncheck baseline' for one)"
			}
			v.Reason += ": " + f.Signature
		case v.Status == Pass || v.Status == Fixed:
			c.Notes = append(c.Notes, fmt.Sprintf("the baseline's finding %q was not seen: this run never drew %s, which set it off; it stays known",
				f.Signature, strings.Join(missing, ", ")))
		case v.Status == Fail || v.Status == Known || v.Status == SameCause:
			c.Notes = append(c.Notes, fmt.Sprintf("the baseline's finding %q was not looked for: %s was found broken in another way first", f.Signature, f.Invariant))
		default:
			c.Notes = append(c.Notes, fmt.Sprintf("the baseline's finding %q was not seen: %s is %s", f.Signature, f.Invariant, v.Status))
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
