// Command turncheck checks that a session server behind an OpenAI-compatible
// chat endpoint keeps its conversations transactional under retries,
// timeouts and stream errors.
//
//	turncheck check                  check the embedded reference server
//	turncheck check --mutant NAME    check it with a real bug switched back on
//	turncheck conform --profile F    check any server, in any language: a verdict per invariant
//	turncheck merge SHARD.json...    join the verdicts of a run's shards (conform --shard K/N)
//	turncheck replay FILE            re-execute a saved failure (of check or conform) and explain it
//	turncheck serve ...              run the reference server
//	turncheck model ...              run the fake model provider
//	turncheck mutants                the track record: every mutant caught, the clean server passing
//
// Exit status: 0 when no invariant was broken, 1 when one was, 2 for a
// usage or setup error, 3 when replay FILE's tries did not break the
// saved failure's invariant again (nor any other).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"

	// Profiles with replicas over a PostgreSQL of the harness's, or
	// behind a front, run with the proxies and the database it brings.
	_ "github.com/turncheck/turncheck/scenarios/fleet"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// version says which turncheck this is: the module version, or the
// commit it was built from.
func version() string {
	v := "turncheck (version unknown)"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v = "turncheck " + bi.Main.Version
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			v += ", commit " + s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			v += " (modified)"
		}
	}
	return v + ", " + bi.GoVersion
}

// Exit statuses.
const (
	exitOK        = 0
	exitViolation = 1
	exitUsage     = 2
	// exitNotReproduced: replay FILE tried the saved steps and none of
	// the tries broke an invariant; no verdict, neither a pass of the
	// saved failure nor a new one.
	exitNotReproduced = 3
	// exitNotProven: conform broke nothing, but proved no conformance
	// either: an invariant was not exercised, or the time bound cut the
	// run short. A gate tells it from a broken server (1).
	exitNotProven = 4
)

const usage = `turncheck checks that a server which keeps LLM conversations server-side keeps
them transactional: a failed turn changes nothing, a committed turn stays, a
request without a new user message is refused, and conversations never leak
into each other. It reaches the server through the client protocol its
profile names, one of:
{protocols}as one process, as replicas over one store, or behind a front
(profiles/README.md).

Usage:
  turncheck <command> [flags]

Commands:
  conform   check YOUR server, in any language, through a profile: a verdict per
            invariant (start here: see the README's five-minute walkthrough)
  check     check turncheck's own reference server, optionally with a mutant (a real
            bug brought back); also called self-check
  replay    re-execute a saved failure (or a seed) and explain what it finds
  merge     join the verdicts of the shards of one run (conform --shard K/N)
  baseline  write a run's findings as known ones, for conform --baseline
  serve     run the reference session server
  model     run the fake model provider standalone
  mutants   the track record: check every mutant (a real bug brought back) and the clean server
  version   print turncheck's version

Examples:
  turncheck check
  turncheck check --mutant mutate-before-run --checks 200
  turncheck replay turncheck-results/latest/failures/T1-mutate-before-run-4015895127573847763.json
  turncheck mutants
  turncheck conform --profile profiles/reference.yaml
  turncheck model --listen 127.0.0.1:9090 &
  turncheck serve --model-url http://127.0.0.1:9090/v1 --data-dir ./data

Run 'turncheck <command> --help' for a command's flags.
Exit status: 0 no invariant broken, 1 an invariant broken, 2 usage or setup error,
3 a saved failure replayed did not break again (see 'turncheck replay --help'),
4 conform broke nothing but proved no conformance (NOT PROVEN: an invariant
not exercised, or the run cut short; see 'turncheck conform --help').
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// The first signal asks for a clean stop; a second one, with the
		// default handling back, ends the process at once.
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole CLI, minus the process: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, helpText(usage))
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "check", "self-check":
		return cmdCheck(ctx, rest, stdout, stderr)
	case "replay":
		return cmdReplay(ctx, rest, stdout, stderr)
	case "conform":
		return cmdConform(ctx, rest, stdout, stderr)
	case "serve":
		return cmdServe(ctx, rest, stdout, stderr)
	case "model":
		return cmdModel(ctx, rest, stdout, stderr)
	case "mutants":
		return cmdMutants(ctx, rest, stdout, stderr)
	case "merge":
		return cmdMerge(ctx, rest, stdout, stderr)
	case "baseline":
		return cmdBaseline(ctx, rest, stdout, stderr)
	case "version", "--version":
		if len(rest) > 0 {
			if rest[0] == "-h" || rest[0] == "-help" || rest[0] == "--help" {
				fmt.Fprint(stdout, "Usage: turncheck version\n\nPrints turncheck's version and the Go toolchain it was built with.\n")
				return exitOK
			}
			fmt.Fprintf(stderr, "turncheck version: takes no arguments, got %q\n", rest)
			return exitUsage
		}
		fmt.Fprintln(stdout, version())
		return exitOK
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 && rest[0] != "help" && !strings.HasPrefix(rest[0], "-") {
			return run(ctx, []string{rest[0], "--help"}, stdout, stderr) // turncheck help check
		}
		fmt.Fprint(stdout, helpText(usage))
		return exitOK
	default:
		fmt.Fprintf(stderr, "turncheck: unknown command %q (see 'turncheck --help')\n", cmd)
		return exitUsage
	}
}

// flagSet is a command's flags. Its --help prints the command's help (what
// it does, an example) and the flags to stdout; a bad flag is a one-line
// error on stderr.
type flagSet struct {
	*flag.FlagSet
	help           string
	stdout, stderr io.Writer
	// positional is how many arguments may follow the flags.
	positional int
}

// helpText is a help text with its lists of protocols filled in from
// the one registry (targets.Protocols): {protocols}, a line for each, and
// {protocol names}, their names in a sentence.
func helpText(text string) string {
	return strings.NewReplacer("{protocols}", targets.ProtocolsHelp("  "), "{protocol names}", targets.ProtocolNames()).Replace(text)
}

func newFlags(name, help string, stdout, stderr io.Writer) *flagSet {
	fs := flag.NewFlagSet("turncheck "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse reports errors itself, on one line
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, help: help, stdout: stdout, stderr: stderr}
}

// parse parses args; it returns the exit status to stop with, or -1 to go
// on.
//
// Flags may come anywhere on the line, before or after the arguments
// (replay FILE --html x.html), up to a "--", after which everything is an
// argument.
func (fs *flagSet) parse(args []string) int {
	err := fs.parseAnywhere(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(fs.stdout, "%s\n\nFlags:\n", strings.TrimSpace(helpText(fs.help)))
		fs.printFlags()
		return exitOK
	case err != nil:
		fmt.Fprintf(fs.stderr, "%s: %v (see '%s --help')\n", fs.Name(), err, fs.Name())
		return exitUsage
	case fs.NArg() > fs.positional:
		fmt.Fprintf(fs.stderr, "%s: unexpected argument %q (see '%s --help')\n", fs.Name(), fs.Arg(fs.positional), fs.Name())
		return exitUsage
	}
	return -1
}

// parseAnywhere parses args with flags before, between and after the
// arguments, leaving the arguments, in order, as fs.Args().
func (fs *flagSet) parseAnywhere(args []string) error {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			positional = append(positional, rest...) // after "--": all arguments
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	return fs.Parse(append([]string{"--"}, positional...))
}

// printFlags lists the flags as they are written, --name, with what each
// takes and its default.
func (fs *flagSet) printFlags() {
	fs.VisitAll(func(f *flag.Flag) {
		kind, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if kind != "" {
			line += " " + kind
		}
		fmt.Fprintf(fs.stdout, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
		switch f.DefValue {
		case "", "0", "false", "0s", "[]":
		default:
			fmt.Fprintf(fs.stdout, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(fs.stdout)
	})
}

// self is how to run this turncheck again from a shell: "turncheck", or,
// under go run (a binary in Go's build cache), the go run form, which
// works from the module's root.
func self() string {
	if strings.Contains(os.Args[0], string(filepath.Separator)+"go-build") {
		return "go run ./cmd/turncheck"
	}
	return "turncheck"
}

// absPath is path made absolute where it can be, so that a printed
// command works from any directory.
func absPath(path string) string {
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}

func fail(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "turncheck %s: %v\n", cmd, err)
	return exitUsage
}
