package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/scenarios/targets"
)

// The user's documentation: the README, what it links to under docs/, and
// the profiles' own.
var userDocs = []string{"README.md", "docs/*.md", "profiles/README.md"}

// repoRoot is the repository's root, where the README's commands run.
const repoRoot = "../.."

var (
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	fence      = regexp.MustCompile("(?s)```(\\w*)\n(.*?)```")
	inlineCode = regexp.MustCompile("`(turncheck [^`]+)`")
)

// docFiles are the files of userDocs, relative to the repository's root.
func docFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, pattern := range userDocs {
		m, err := filepath.Glob(filepath.Join(repoRoot, pattern))
		require.NoError(t, err)
		require.NotEmpty(t, m, pattern)
		files = append(files, m...)
	}
	return files
}

// TestREADMELinks: every relative link of the user's documentation names
// a file that is there.
func TestREADMELinks(t *testing.T) {
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		links := 0
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") {
				continue
			}
			links++
			assert.FileExists(t, filepath.Join(filepath.Dir(file), target), "%s links to %s", file, m[1])
		}
		if filepath.Base(file) == "README.md" && filepath.Dir(file) == repoRoot {
			assert.Positive(t, links, "the README links to its docs")
		}
	}
}

// commandLines are the turncheck command lines the documentation shows:
// each line of a shell block that starts with turncheck, and each inline
// `turncheck ...` span, with where it was found.
func commandLines(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		text := string(b)
		for _, m := range fence.FindAllStringSubmatch(text, -1) {
			if m[1] != "sh" {
				continue
			}
			for _, line := range strings.Split(m[2], "\n") {
				if strings.HasPrefix(line, "turncheck ") {
					out[line] = file
				}
			}
		}
		for _, m := range inlineCode.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
			out[m[1]] = file
		}
	}
	return out
}

// words splits a documented command line as a shell would, for the
// simple lines the documentation shows (quotes, no expansions); the
// placeholders of a synopsis (FILE, [--x], a|b) are kept as words.
func words(line string) []string {
	var out []string
	for _, f := range regexp.MustCompile(`"[^"]*"|'[^']*'|\S+`).FindAllString(line, -1) {
		out = append(out, strings.Trim(f, `"'`))
	}
	return out
}

// TestREADMEFlagsParse: every turncheck command and flag the user's
// documentation names is one the CLI has: the line, asked for --help after
// it, parses.
func TestREADMEFlagsParse(t *testing.T) {
	lines := commandLines(t)
	require.NotEmpty(t, lines)
	subcommand := regexp.MustCompile(`^turncheck ([a-z-]+)`)
	flagName := regexp.MustCompile(`--[a-z][a-z-]*`)
	checked := 0
	for line, file := range lines {
		m := subcommand.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		// Only the command and its flags: a synopsis's placeholders and
		// values do not parse, and need not.
		args := []string{m[1]}
		for _, f := range flagName.FindAllString(line, -1) {
			if f != "--help" {
				args = append(args, f+"=x")
			}
		}
		code, _, stderr := runCLI(t, append(args, "--help")...)
		if code != exitOK && regexp.MustCompile(`invalid (boolean )?value "x"`).MatchString(stderr) {
			// A flag whose value x does not parse exists; one that does
			// not exist says so first.
			code = exitOK
		}
		assert.Equal(t, exitOK, code, "%s: %q does not parse: %s", file, line, firstLine(stderr))
		checked++
	}
	assert.Greater(t, checked, 10, "the documentation's commands")
}

func firstLine(s string) string { l, _, _ := strings.Cut(s, "\n"); return l }

// cheap bounds what a documented command does when the test runs it: few
// checks and steps, a short shrink, a fixed seed, results in a temporary
// directory.
func cheap(t *testing.T, args []string) []string {
	t.Helper()
	out := slices.Clone(args)
	set := func(flag, value string, atMost int) {
		if i := slices.Index(out, flag); i >= 0 && i+1 < len(out) {
			if n, err := strconv.Atoi(out[i+1]); atMost == 0 || err != nil || n > atMost {
				out[i+1] = value
			}
			return
		}
		out = append(out, flag, value)
	}
	switch out[0] {
	case "check", "conform":
		set("--checks", "2", 2)
		set("--steps", "10", 10)
		set("--shrink-time", "2s", 0)
		set("--seed", "1", 0)
		set("--out", t.TempDir(), 0)
	}
	return out
}

// TestREADMECommands: the README's shell commands run as shown, made
// cheap (cheap): the first verdict, the reference server's checks and
// mutants, the ready profiles. None ends in a usage or setup error. A
// command that needs what the reader supplies (their server's profile, a
// running server, a front) only has its flags checked
// (TestREADMEFlagsParse); go commands are left to the reader.
func TestREADMECommands(t *testing.T) {
	t.Parallel() // its commands run as processes of their own, from the repository's root
	bin := onPath(t)
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("the five-minute walkthrough's server needs python3")
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	var runnable [][]string
	for _, m := range fence.FindAllStringSubmatch(string(b), -1) {
		if m[1] != "sh" {
			continue
		}
		for _, line := range strings.Split(m[2], "\n") {
			args := words(line)
			if len(args) < 2 || args[0] != "turncheck" {
				continue
			}
			if i := slices.Index(args, "--profile"); i >= 0 {
				if _, err := os.Stat(filepath.Join(repoRoot, args[i+1])); err != nil || strings.Contains(args[i+1], "front") {
					continue // the reader's own profile, or a front the reader starts
				}
			}
			if slices.Contains(args, "--url") {
				continue // a server the reader runs
			}
			runnable = append(runnable, args[1:])
		}
	}
	require.GreaterOrEqual(t, len(runnable), 4, "the README's commands: %v", runnable)
	for _, args := range runnable {
		args = outOfTheWay(t, cheap(t, args))
		code, stdout, stderr := runIn(t, repoRoot, bin, args...)
		t.Logf("turncheck %s: exit %d", strings.Join(args, " "), code)
		assert.Contains(t, []int{exitOK, exitViolation, exitNotProven}, code, "turncheck %s:\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), stdout, stderr)
		if slices.Contains(args, "mutate-before-run") {
			assert.Equal(t, exitViolation, code, "the mutant the README switches on is caught")
		}
	}
}

// TestREADMEProfiles: every profile the user's documentation shows in a
// yaml block loads: the fields it names are fields a profile has.
func TestREADMEProfiles(t *testing.T) {
	dir := t.TempDir()
	n := 0
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		for _, m := range fence.FindAllStringSubmatch(string(b), -1) {
			if m[1] != "yaml" || !strings.Contains(m[2], "conversation_header") && !strings.Contains(m[2], "policies:") {
				continue // not a whole profile (a CI job, a fragment)
			}
			n++
			path := filepath.Join(dir, strconv.Itoa(n)+".yaml")
			require.NoError(t, os.WriteFile(path, []byte(m[2]), 0o644))
			_, err := targets.LoadProfile(path)
			assert.NoError(t, err, "%s: the profile\n%s", file, m[2])
		}
	}
	assert.Positive(t, n, "the README shows a profile")
}

// TestCIRunsTheREADMETestCommand: the test command the README gives a
// newcomer is the one CI runs, as it stands: a line of .ci/run of its own.
func TestCIRunsTheREADMETestCommand(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	require.NoError(t, err)
	var commands []string
	for _, m := range fence.FindAllStringSubmatch(string(b), -1) {
		for _, line := range strings.Split(m[2], "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "go test") {
				commands = append(commands, strings.TrimSpace(line))
			}
		}
	}
	require.Len(t, commands, 1, "the README gives one test command")
	ci, err := os.ReadFile(filepath.Join(repoRoot, ".ci", "run"))
	require.NoError(t, err)
	lines := strings.Split(string(ci), "\n")
	assert.True(t, slices.ContainsFunc(lines, func(l string) bool { return strings.TrimSpace(l) == commands[0] }),
		".ci/run does not run the README's test command %q as a line of its own", commands[0])
}
