package report

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/turncheck/turncheck/scenarios/targets"
)

// ReportSchema names the version of the JSON report format. A saved
// failure is a report with a failure; `turncheck replay FILE` reads it.
// v2 gives every duration in milliseconds (v1 gave a failure's in
// nanoseconds); ReadReport reads both.
const ReportSchema = "turncheck/report/v2"

// reportSchemaV1 is the schema before durations were all milliseconds.
const reportSchemaV1 = "turncheck/report/v1"

// Report is a run's outcome as data: the JSON report, the saved failure
// file, and the text, JUnit and HTML renderings all come from it.
type Report struct {
	Schema string             `json:"schema"`
	Server targets.ServerSpec `json:"server"`
	Seed   uint64             `json:"seed"`
	// Verdict is "pass", "fail", or "flaky" (a failure that did not
	// reproduce when its steps were replayed).
	Verdict string `json:"verdict"`
	Stats   Stats  `json:"stats"`
	// ElapsedMS is the run's wall time, shrinking included.
	ElapsedMS int64 `json:"elapsedMs"`
	// Failure is nil for a pass.
	Failure *Failure `json:"failure,omitempty"`
}

// NewReport turns a Check's result into a report about server.
func NewReport(res *Result, server targets.ServerSpec) *Report {
	r := &Report{Schema: ReportSchema, Server: server, Seed: res.Seed, Verdict: "pass", Stats: res.Stats,
		ElapsedMS: res.Elapsed.Milliseconds(), Failure: res.Failure}
	if f := res.Failure; f != nil {
		r.Verdict = "fail"
		if f.Flaky {
			r.Verdict = "flaky"
		}
	}
	return r
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Save writes the report as JSON to path.
func (r *Report) Save(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	return errors.Join(r.WriteJSON(f), f.Close())
}

// ReadReport reads a report written by WriteJSON, refusing another
// schema.
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: not a turncheck report: %v", path, err)
	}
	if r.Schema != ReportSchema && r.Schema != reportSchemaV1 {
		return nil, fmt.Errorf("%s: schema %q, want %q", path, r.Schema, ReportSchema)
	}
	return &r, nil
}

// failureJSON is a Failure as JSON writes it, its durations aside.
type failureJSON Failure

// MarshalJSON writes f with its durations in milliseconds, as every
// duration of turncheck's JSON is.
func (f Failure) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		failureJSON
		FoundIn  int64 `json:"foundInMs"`
		ShrunkIn int64 `json:"shrunkInMs"`
	}{failureJSON(f), f.FoundIn.Milliseconds(), f.ShrunkIn.Milliseconds()})
}

// UnmarshalJSON reads what MarshalJSON writes, and a failure saved under
// schema v1, whose durations were in nanoseconds.
func (f *Failure) UnmarshalJSON(b []byte) error {
	var in struct {
		*failureJSON
		FoundInMS  *int64 `json:"foundInMs"`
		ShrunkInMS *int64 `json:"shrunkInMs"`
		FoundInNS  int64  `json:"foundInNs"`
		ShrunkInNS int64  `json:"shrunkInNs"`
	}
	in.failureJSON = (*failureJSON)(f)
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	f.FoundIn, f.ShrunkIn = time.Duration(in.FoundInNS), time.Duration(in.ShrunkInNS)
	if in.FoundInMS != nil {
		f.FoundIn = time.Duration(*in.FoundInMS) * time.Millisecond
	}
	if in.ShrunkInMS != nil {
		f.ShrunkIn = time.Duration(*in.ShrunkInMS) * time.Millisecond
	}
	return nil
}

// Text renders the report for a person: the failure's report, or the
// run's summary.
func (r *Report) Text(p targets.Profile) string {
	if r.Failure == nil {
		return "PASS: no invariant broken\n" + r.Stats.Summary() + "\n"
	}
	switch {
	case r.Failure.Report != "":
		return r.Failure.Report
	case r.Failure.Violation != nil:
		return FormatFailure(r.Failure.Violation, r.Failure.History, p)
	}
	return "the harness failed, not the server; nothing was kept to say how\n"
}

// junitSuite is the JUnit XML a CI dashboard reads.
type junitSuite struct {
	XMLName  xml.Name    `xml:"testsuite"`
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	ClassName string        `xml:"classname,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes the report as a JUnit suite with one test case per
// invariant, so that a dashboard shows which property broke: failed for
// the broken one, skipped for one never evaluated (never a pass for what
// was not exercised), passed otherwise.
func (r *Report) WriteJUnit(w io.Writer) error {
	s := junitSuite{Name: "turncheck " + r.Server.Kind, Time: fmt.Sprintf("%.3f", float64(r.ElapsedMS)/1000)}
	invs := Judged()
	if f := r.Failure; f != nil && f.Violation != nil && !slices.Contains(invs, f.Violation.Invariant) {
		// An invariant this build does not judge (a report saved by
		// another): its failure still gets a case, never lost.
		invs = append(invs, f.Violation.Invariant)
	}
	for _, inv := range invs {
		c := junitCase{Name: fmt.Sprintf("%s %s", inv, inv.Title()), ClassName: "turncheck." + r.Server.Kind}
		switch {
		case r.Failure != nil && r.Failure.Violation != nil && r.Failure.Violation.Invariant == inv:
			msg := r.Failure.Violation.Error()
			if r.Failure.Flaky {
				msg = "(did not reproduce) " + msg
			}
			c.Failure = &junitMessage{Message: msg, Text: r.Failure.Report}
			s.Failures++
		case r.Stats.Invariants[inv] == 0:
			c.Skipped = &junitMessage{Message: "not exercised: never evaluated in this run"}
			s.Skipped++
		}
		s.Cases = append(s.Cases, c)
	}
	if r.Failure != nil && r.Failure.Violation == nil {
		// The harness failed, not the server: no invariant is shown to hold.
		s.Cases = append(s.Cases, junitCase{Name: "harness", ClassName: "turncheck." + r.Server.Kind,
			Failure: &junitMessage{Message: "the harness failed, not the server", Text: r.Failure.Report}})
		s.Failures++
	}
	return s.write(w)
}

// WriteJSON writes the verdicts as indented JSON.
func (c *Conformance) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Schema string `json:"schema"`
		*Conformance
		ElapsedMS int64 `json:"elapsedMs"`
		Passed    bool  `json:"passed"`
		// Outcome is the run's word (Conformance.Outcome): a gate reads
		// CONFORMS, NOT PROVEN or DOES NOT CONFORM apart.
		Outcome string `json:"outcome"`
	}{ConformanceSchema, c, c.Elapsed.Milliseconds(), c.Passed(), c.Outcome()})
}

// ReadConformance reads verdicts WriteJSON wrote, as 'conform --json'
// saves them.
func ReadConformance(path string) (*Conformance, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var in struct {
		Schema string `json:"schema"`
		*Conformance
		ElapsedMS int64 `json:"elapsedMs"`
	}
	in.Conformance = &Conformance{}
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, fmt.Errorf("%s: not turncheck verdicts: %v", path, err)
	}
	if in.Schema != ConformanceSchema {
		return nil, fmt.Errorf("%s: schema %q, want %q (the verdicts of 'turncheck conform --json')", path, in.Schema, ConformanceSchema)
	}
	in.Elapsed = time.Duration(in.ElapsedMS) * time.Millisecond
	return in.Conformance, nil
}

// ConformanceSchema names the version of the JSON verdicts format. v2
// gives the run's wall time as elapsedMs (v1: elapsedNs), in
// milliseconds as every duration of turncheck's JSON.
const ConformanceSchema = "turncheck/conformance/v2"

// WriteJUnit writes the verdicts as JUnit XML: a test case per invariant,
// failed, skipped (not applicable, skipped) with the reason,
// or failed as not exercised.
func (c *Conformance) WriteJUnit(w io.Writer) error {
	s := junitSuite{Name: "turncheck conform", Time: fmt.Sprintf("%.3f", c.Elapsed.Seconds())}
	for _, v := range c.Verdicts {
		tc := junitCase{Name: fmt.Sprintf("%s %s", v.Invariant, v.Invariant.Title()), ClassName: "turncheck.conform"}
		switch v.Status {
		case Fail:
			tc.Failure = &junitMessage{Message: v.message()}
			if v.Failure != nil {
				tc.Failure.Text = v.Failure.Report
			} else {
				// No step shows it (a crash between two checks): the notes
				// say what was seen.
				tc.Failure.Text = strings.Join(c.Notes, "\n")
			}
			s.Failures++
		case NotExercised:
			// Nothing broke: not proven, which a gate that fails on
			// failures alone lets through, as exit status 4 does.
			tc.Skipped = &junitMessage{Message: "not exercised (not proven): " + v.Reason + "; to exercise it: " + WouldExercise[v.Invariant]}
			s.Skipped++
		case Pass, Fixed:
		case Known:
			// Listed, not failed: a CI gate fails on new findings only.
			tc.Skipped = &junitMessage{Message: "known finding, in the baseline " + c.BaselineFrom + ": " + v.message()}
			if v.Failure != nil {
				tc.Skipped.Text = v.Failure.Report
			}
			s.Skipped++
		default:
			tc.Skipped = &junitMessage{Message: string(v.Status) + ": " + v.Reason}
			s.Skipped++
		}
		s.Cases = append(s.Cases, tc)
	}
	return s.write(w)
}

// write writes the suite as a JUnit XML document.
func (s junitSuite) write(w io.Writer) error {
	s.Tests = len(s.Cases)
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	return errors.Join(enc.Encode(s), enc.Close())
}

// ShrinkStats says, for a person, how a failure was found and how far it
// was shrunk: "shrunk" only where the shrinker was done and sure, with
// what its state rests on (ShrinkNote).
func (f *Failure) ShrinkStats() string {
	state := f.Shrink
	if state == "" {
		state = Shrunk // a report saved before the state was kept
	}
	how := string(state)
	switch {
	case f.Flaky:
		how += " (the failure did not reproduce)"
	case f.ShrinkNote != "":
		how += " (" + f.ShrinkNote + ")"
	case state != Shrunk:
		// A report saved before the note was kept: then only the bound
		// kept a failure from being shrunk.
		how += " (the shrink bound ran out first)"
	}
	// Counted from the run's start, whatever was found before it.
	return fmt.Sprintf("found after %d check(s) of the run, %s into it; %s in %d replay(s), %s, to %d step(s)",
		f.FoundAfter, f.FoundIn.Round(time.Millisecond), how, f.ShrinkRuns, f.ShrunkIn.Round(time.Millisecond), len(f.Plans))
}
