package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// resultsRoot is where check and conform keep a directory of results per
// run, named by when it started, with resultsRoot/latest naming the
// newest: what a person opens after a run, pass or fail, as Jepsen keeps
// its store.
const resultsRoot = "turncheck-results"

// results is one run's results directory.
type results struct {
	dir string
	// failures is where each failure is saved as it is found: dir's
	// failures/, or the --save directory.
	failures string
}

// openResults makes the results directory of a run that starts at now:
// out if given, or a new directory under resultsRoot, which latest then
// names. save, if given, is where failures go instead of its failures/.
func openResults(out, save string, now time.Time) (*results, error) {
	r := &results{dir: out}
	if out == "" {
		dir, err := newRunDir(now)
		if err != nil {
			return nil, fmt.Errorf("the results directory: %w", err)
		}
		r.dir = dir
	} else if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("--out: %w", err)
	}
	r.failures = save
	if save == "" {
		r.failures = filepath.Join(r.dir, "failures")
	}
	return r, nil
}

// newRunDir makes resultsRoot/TIME (TIME-2, -3 ... when a run started in
// the same second) and points resultsRoot/latest at it.
func newRunDir(now time.Time) (string, error) {
	if err := os.MkdirAll(resultsRoot, 0o755); err != nil {
		return "", err
	}
	stamp := now.UTC().Format("20060102-150405")
	name := stamp
	for i := 2; ; i++ {
		err := os.Mkdir(filepath.Join(resultsRoot, name), 0o755)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) {
			return "", err
		}
		name = fmt.Sprintf("%s-%d", stamp, i)
	}
	// A relative link, replaced in one rename: a reader never finds
	// latest missing, and the tree can be moved whole.
	tmp := filepath.Join(resultsRoot, ".latest-"+name)
	_ = os.Remove(tmp)
	err := os.Symlink(name, tmp)
	if err == nil {
		err = os.Rename(tmp, filepath.Join(resultsRoot, "latest"))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return "", fmt.Errorf("point %s at the run: %w", filepath.Join(resultsRoot, "latest"), err)
	}
	return filepath.Join(resultsRoot, name), nil
}

// write renders one file of the results; a rendering that fails is said
// on stderr and leaves no file behind, and the others are still written.
func (r *results) write(cmd, name string, render func(io.Writer) error, stderr io.Writer) {
	path := filepath.Join(r.dir, name)
	writeReport(cmd, path, name, render, io.Discard, stderr)
}

// writeText writes text, what the run printed, as one file of the
// results.
func (r *results) writeText(cmd, name string, text *bytes.Buffer, stderr io.Writer) {
	r.write(cmd, name, func(w io.Writer) error { _, err := w.Write(text.Bytes()); return err }, stderr)
}

// saveFailure saves a failure's report as NAME.json (for 'turncheck
// replay FILE') and NAME.html in the failures directory, and says where.
func (r *results) saveFailure(cmd, name string, save func(string) error, html func(io.Writer) error, stdout, stderr io.Writer) {
	path := filepath.Join(r.failures, name+".json")
	err := os.MkdirAll(r.failures, 0o755)
	if err == nil {
		err = save(path)
	}
	if err != nil {
		fmt.Fprintf(stderr, "turncheck %s: save the failure: %v\n", cmd, err)
		return
	}
	fmt.Fprintf(stdout, "saved: %s (replay: %s replay %s)\n", path, self(), absPath(path))
	writeReport(cmd, filepath.Join(r.failures, name+".html"), "html", html, stdout, stderr)
}

// closing says where the results are, the run's last line.
func (r *results) closing(stdout io.Writer) {
	fmt.Fprintf(stdout, "results: %s (open %s)\n", r.dir, filepath.Join(r.dir, "index.html"))
}
