package main

import (
	"bytes"
	"cmp"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/loopback"
	"github.com/turncheck/turncheck/internal/pgserver"
	"github.com/turncheck/turncheck/internal/syncbuf"
	"github.com/turncheck/turncheck/internal/testbin"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/plan"
	"github.com/turncheck/turncheck/scenarios/report"
	"github.com/turncheck/turncheck/sut"
)

// onPath builds turncheck into a temporary dir and puts that dir first on
// PATH, as profiles/reference.yaml expects: once for the whole test
// binary (the same build every time), so that tests that start servers
// through profiles may run in parallel, which a test's own Setenv forbids.
// The directory of the interpreter python3 runs comes next: python3 on
// PATH may be a shim (pyenv's runs a dozen shell processes, about 0.3 s of
// CPU, before every start of a Python example's server), and there it is
// the interpreter itself, the same one.
func onPath(t *testing.T) string {
	t.Helper()
	bin := testbin.Turncheck(t)
	pathOnce.Do(func() {
		dirs := []string{filepath.Dir(bin)}
		if out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output(); err == nil {
			if python := string(bytes.TrimSpace(out)); filepath.Base(python) == "python3" {
				dirs = append(dirs, filepath.Dir(python))
			}
		}
		pathErr = os.Setenv("PATH", strings.Join(append(dirs, os.Getenv("PATH")), string(os.PathListSeparator)))
	})
	require.NoError(t, pathErr)
	return bin
}

var (
	pathOnce sync.Once
	pathErr  error
)

const referenceProfile = "../../profiles/reference.yaml"

// replicasProfile is the reference server as three replicas over one
// PostgreSQL, and frontProfile the same behind a front (nginx, with
// frontConf).
const (
	replicasProfile = "../../profiles/reference-replicas.yaml"
	frontProfile    = "../../profiles/reference-front.yaml"
	frontConf       = "../../profiles/nginx-front.conf"
)

// verdictLine finds the verdict printed for inv: its row of the table
// (its title follows), not a violation's message, which starts with inv
// too.
func verdictLine(out, inv string) string {
	return regexp.MustCompile(`(?m)^` + inv + ` +[a-z].*$`).FindString(out)
}

// TestConformReferenceProfile: the reference server, started through its
// profile as any third-party server is, conforms: every invariant
// turncheck checks passes, exercised, and it stays up.
func TestConformReferenceProfile(t *testing.T) {
	t.Parallel() // it mostly waits on the servers it starts
	onPath(t)
	base, err := os.ReadFile(referenceProfile)
	require.NoError(t, err)
	for _, policy := range []sut.Interruption{sut.Rollback, sut.KeepConsistent, sut.Complete} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel() // each run mostly waits on its server
			save := t.TempDir()
			profile := referenceProfile
			if policy != sut.Rollback {
				profile = filepath.Join(save, "profile.yaml")
				text := strings.Replace(string(base), "--interruption, rollback", "--interruption, "+string(policy), 1)
				text = strings.Replace(text, "interruption: rollback", "interruption: "+string(policy), 1)
				require.NoError(t, os.WriteFile(profile, []byte(text), 0o644))
			}
			// Two checks from seed 1 exercise every invariant under each
			// policy.
			code, stdout, stderr := runCLI(t, "conform", "--profile", profile, "--checks", "2", "--steps", "20",
				"--seed", "1", "--save", save, "--junit", filepath.Join(save, "junit.xml"))
			require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			assert.Contains(t, stdout, "CONFORMS")
			// It stays up, watched, and starts: a correct server is no
			// crash, and comes back from every restart.
			for _, inv := range []string{"T1", "T2", "T3", "T4", "T5", "T6", "T7", "T8", "T9", "T10", "T11", "crash", "start"} {
				assert.Regexp(t, `PASS +[1-9]\d* `, verdictLine(stdout, inv), inv)
			}
			junit, err := os.ReadFile(filepath.Join(save, "junit.xml"))
			require.NoError(t, err)
			assert.Contains(t, string(junit), `tests="14"`, "T1 to T11, crash, start and wire")
		})
	}
}

// TestConformEachProtocol: the reference server conforms through its
// profile for each client protocol, the Responses API (where turns sent at
// once branch, T4) and its session API, as under chat.
func TestConformEachProtocol(t *testing.T) {
	t.Parallel() // it mostly waits on the servers it starts
	onPath(t)
	// Checks until every invariant is exercised, from a seed that gets
	// there soon: T11 (a failed turn between two with committed tools)
	// is the last, in the third check under the Responses API from seed
	// 9, the fourth under the session API from seed 7 and A2A from seed
	// 8; the reference ACP agent exercises every one that applies to it
	// in two from seed 1.
	for protocol, run := range map[string]struct{ checks, seed string }{
		"responses": {"3", "9"}, "sessions": {"4", "7"}, "acp": {"2", "1"}, "a2a": {"4", "8"},
	} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel() // each run mostly waits on its server
			save := t.TempDir()
			code, stdout, stderr := runCLI(t, "conform", "--profile", protocolProfile(protocol), "--checks", run.checks, "--steps", "20",
				"--seed", run.seed, "--save", save)
			require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			assert.Contains(t, stdout, "CONFORMS")
			for _, inv := range []string{"T1", "T2", "T3", "T4", "T5", "T6", "T7", "T8", "T9", "T10", "T11"} {
				line := verdictLine(stdout, inv)
				assert.Regexp(t, `PASS +[1-9]\d* |NOT APPLICABLE`, line, inv)
			}
		})
	}
}

// TestConformTitlesThroughProfile: a server that calls the model for a
// title beside every turn (serve --titles), checked through its profile
// alone, conforms in every protocol: its title calls are set apart as
// auxiliary, never judged as a turn's history.
func TestConformTitlesThroughProfile(t *testing.T) {
	t.Parallel() // it mostly waits on the servers it starts
	onPath(t)
	for _, protocol := range []string{"", "responses", "sessions", "acp", "a2a"} {
		t.Run(cmp.Or(protocol, "chat"), func(t *testing.T) {
			t.Parallel() // each run mostly waits on its server
			base, err := os.ReadFile(protocolProfile(protocol))
			require.NoError(t, err)
			text := strings.Replace(string(base), "--request-timeout, 1s]", "--request-timeout, 1s, --titles]", 1)
			require.NotEqual(t, string(base), text, "the profile's command ends as the test expects")
			profile := filepath.Join(t.TempDir(), "profile.yaml")
			require.NoError(t, os.WriteFile(profile, []byte(text), 0o644))
			// Two checks from seed 1, 40 to 130 requests (for chat, the
			// Responses API and sessions, TestTitleCallsRaiseNoFalseAlarm
			// runs twelve more in process): they may leave the rarest
			// (T11) not exercised; no FAIL through a profile is what this
			// proves.
			_, stdout, stderr := runCLI(t, "conform", "--profile", profile, "--checks", "2", "--steps", "20", "--seed", "1")
			for _, inv := range model.Invariants() {
				assert.NotContains(t, verdictLine(stdout, string(inv)), "FAIL", "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			}
			assert.Regexp(t, `auxiliary model calls \(made beside a turn, .*\): [1-9]`, stdout)
			assert.Regexp(t, `PASS +[1-9]\d* `, verdictLine(stdout, "T2"))
		})
	}
}

// protocolProfile is the reference server's profile for protocol ("" for
// chat).
func protocolProfile(protocol string) string {
	if protocol == "" {
		return referenceProfile
	}
	return strings.Replace(referenceProfile, "reference.yaml", "reference-"+protocol+".yaml", 1)
}

// replicated runs the longer campaigns of replicas through their
// profiles too (the mutants of replicas, the clean replicas each request
// goes to as the plan draws): each starts a PostgreSQL and three
// replicas, more than the suite's time allows on two cores.
var replicated = flag.Bool("replicated", false, "also run the campaigns of replicas over PostgreSQL through their profiles")

// TestConformMutantsThroughProfile: each mutant, switched on in the
// profile's start command, fails the invariant it breaks through the
// black-box path, and no other, and its saved failure replays through the
// profile.
func TestConformMutantsThroughProfile(t *testing.T) {
	t.Parallel() // its runs are processes of their own
	bin := onPath(t)
	type run struct {
		info sut.MutantInfo
		dir  string
		out  []byte
		err  error
		// skip, if set, says why the mutant is not run: one of replicas
		// with no PostgreSQL here for them.
		skip error
	}
	// The runs wait on their servers (quiet periods, held calls, the
	// server's own timeout) far more than they compute: all of them run
	// at once, each a process of its own, rather than two at a time as
	// parallel subtests would.
	var runs []*run
	var wg sync.WaitGroup
	for _, m := range sut.Mutants() {
		// Each runs two checks, from a seed whose first finds its bug
		// (those of replicas, below, more): the second leaves room for a
		// second FAIL, which must not come. No more: every check is a
		// server's worth of steps, restarts and quiet periods, and
		// TestMutantsCaught searches longer.
		checks, seed := "2", "2"
		short := true // run under -short too
		switch m.Mutant {
		case sut.MutateBeforeRun, sut.CrossKeyLeak, sut.ForkNewSession, sut.NoConversationLock, sut.RefuseConcurrentNew,
			sut.FailedResponseChainable, sut.ResponseCrossKey, sut.ShallowClone,
			sut.A2AContextRace, sut.A2AFailedTaskStays, sut.A2ACancelCommits, sut.A2ATaskHistoryContext,
			sut.LostOnEvict:
			short = false // TestMutantsCaught has them in process
		case sut.A2ACancelIgnored, sut.A2ATaskRerun, sut.AckBeforeDurable, sut.CommitOnStreamError,
			sut.ExactSourceKeyOnly, sut.ReplayWithoutUser, sut.SessionEmptyRuns, sut.SessionExactSourceKey:
			seed = "1" // from seed 2, found after 3 to 5 checks
		case sut.OrphanToolCallOnInterrupt:
			// A tool loop interrupted while a tool runs (from seed 2,
			// found after 15 checks).
			seed = "10"
		case sut.ToolRunsAfterCancel:
			seed = "11" // the same (from seed 2, after 10)
		}
		if m.Replicas > 0 {
			// Found after 1 to 3 checks from seed 2; each check of three
			// replicas over PostgreSQL costs what three of one do.
			checks = "4"
		}
		if testing.Short() && !short && m.Replicas == 0 {
			continue
		}
		r := &run{info: m, dir: t.TempDir()}
		runs = append(runs, r)
		if m.Replicas > 0 {
			if !*replicated {
				r.skip = fmt.Errorf("%s is caught on %d replicas over one PostgreSQL, a longer campaign: "+
					"go test ./cmd/turncheck -run TestConformMutantsThroughProfile -replicated", m.Mutant, m.Replicas)
				continue
			}
			if err := pgserver.Installed(); err != nil {
				r.skip = fmt.Errorf("%s is caught on %d replicas over one PostgreSQL: %w", m.Mutant, m.Replicas, err)
				continue
			}
		}
		profile := writeMutantProfile(t, r.dir, m)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Unshrunk (the shrink has tests of its own, in process and
			// through profiles): the failing check's steps are saved as
			// found, and replayed below.
			r.out, r.err = exec.Command(bin, "conform", "--profile", profile, "--checks", checks, "--steps", "20", "--seed", seed,
				"--save", r.dir, "--out", filepath.Join(r.dir, "out"), "--timeout", "2m", "--shrink-time", "1ms", "--parallel", "1").CombinedOutput()
		}()
	}
	wg.Wait()
	for _, r := range runs {
		t.Run(string(r.info.Mutant), func(t *testing.T) {
			t.Parallel()
			if r.skip != nil {
				t.Skip(r.skip)
			}
			var exit *exec.ExitError
			require.ErrorAs(t, r.err, &exit, "%s", r.out)
			require.Equal(t, exitViolation, exit.ExitCode(), "%s", r.out)
			// One root cause and trigger, one FAIL: no invariant is named
			// for it but those its bug breaks, each on its own trigger.
			// An ACP agent's breach of the protocol is ACP's own finding,
			// wire.
			fails := regexp.MustCompile(`(?m)^(T\d+|wire) +.*\bFAIL\b`).FindAllStringSubmatch(string(r.out), -1)
			require.NotEmpty(t, fails, "%s", r.out)
			for _, f := range fails {
				assert.Contains(t, namedAs(r.info), f[1], "%s", r.out)
			}
			breaks := fails[0][1]
			saved := regexp.MustCompile(`saved: (\S+` + breaks + `-conform-\d+\.json)`).FindStringSubmatch(string(r.out))
			require.NotNil(t, saved, "%s", r.out)
			// A server that reports no activity may run a burst's requests
			// in another interleaving on a replay (and beside a CPU hog,
			// one replay in two may): the saved steps break the invariant
			// again in one of ten tries.
			replay, err := exec.Command(bin, "replay", saved[1], "--tries", "10").CombinedOutput()
			require.ErrorAs(t, err, &exit, "%s", replay)
			if exit.ExitCode() == exitNotReproduced && breaksInABurst(t, saved[1]) {
				// Seen beside a CPU hog: a burst whose interleaving broke
				// the invariant in the run, and in none of ten fresh
				// replays. A failure at a step sent one at a time must
				// replay.
				t.Logf("the saved burst did not break %s again in ten tries:\n%s", breaks, replay)
				return
			}
			assert.Equal(t, exitViolation, exit.ExitCode(), "%s", replay)
			assert.Contains(t, string(replay), "FAIL: "+breaks, "%s", replay)
		})
	}
}

// breaksInABurst reports whether the failure saved at path broke its
// invariant at a step that sends more than one request at once (a burst):
// its last.
func breaksInABurst(t *testing.T, path string) bool {
	plans := savedPlans(t, path)
	return len(plans) > 0 && len(plans[len(plans)-1].Sends) > 1
}

// notReproducedBurst reports whether the replay of the failure saved at
// path ended not reproduced (exit 3), and fails t unless that failure
// sends turns at once: on replicas that do not report their activity, a
// burst may run in another interleaving on every try, as the replay
// says; steps sent one at a time replay.
func notReproducedBurst(t *testing.T, path string, code int, replay string) bool {
	t.Helper()
	if code != exitNotReproduced {
		return false
	}
	require.True(t, sendsAtOnce(t, path), "steps sent one at a time replay: %s", replay)
	return true
}

// sendsAtOnce reports whether the failure saved at path has a step that
// sends more than one request at once (a burst).
func sendsAtOnce(t *testing.T, path string) bool {
	return slices.ContainsFunc(savedPlans(t, path), func(p plan.Plan) bool { return len(p.Sends) > 1 })
}

// savedPlans are the steps of the failure saved at path.
func savedPlans(t *testing.T, path string) []plan.Plan {
	t.Helper()
	saved, err := report.ReadReport(path)
	require.NoError(t, err)
	require.NotNil(t, saved.Failure)
	return saved.Failure.Plans
}

// namedAs lists the invariants a mutant's bug may be found under: its own,
// and where its wrong state shows on more than one kind of turn, the
// others. An evicted conversation's loss shows when it is next loaded:
// after an eviction (T2), or after a restart (T7), one finding, the other
// SAME CAUSE. A message committed before the run is kept by a failed turn
// (T1), an interrupted one (T10) and one cut by a crash (T6): each a
// trigger of its own, found on its own evidence.
func namedAs(m sut.MutantInfo) []string {
	switch m.Mutant {
	case sut.LostOnEvict, sut.StoreErrorAcked:
		// A lost turn seen first after a restart is what the restart
		// lost, as the harness can tell (T7); seen with none, T2.
		return []string{"T2", "T7"}
	case sut.MutateBeforeRun:
		// An interrupted tool turn kept shows as its message (T10) or
		// as the tool call it left without a result (T9): one leftover.
		return []string{"T1", "T10", "T6", "T9"}
	case sut.CommitOnStreamError:
		// A failed turn kept in part is T1 where its client heard of the
		// failure; where it never did (its stream ended without its end,
		// or the client gave up waiting, on a loaded machine), it is an
		// unknown turn kept in part (T6), or an interrupted one (T10).
		return []string{"T1", "T6", "T10"}
	case sut.ACPConcurrentPrompts:
		// Prompts run at once on one history (T4); and a session/cancel
		// for one of them meets another that committed already, answered
		// cancelled all the same: an interrupted turn kept (T10), a
		// trigger of its own (a cancel). Where the replies of prompts
		// that ran at once cannot be told apart, their turns are unknown,
		// and the fork shows first as one of them seen gone, then back
		// (T6).
		return []string{"T4", "T10", "T6"}
	}
	return []string{m.Breaks}
}

// writeMutantProfile writes mutantProfile for m into dir and returns its
// path.
func writeMutantProfile(t *testing.T, dir string, m sut.MutantInfo) string {
	t.Helper()
	path := protocolProfile(m.Protocol)
	if m.Replicas > 0 {
		// A bug of replicas: the server runs as replicas over one
		// PostgreSQL the harness starts for them, as the profile of
		// replicas says.
		path = replicasProfile
	}
	base, err := os.ReadFile(path)
	require.NoError(t, err)
	profile := filepath.Join(dir, string(m.Mutant)+".yaml")
	require.NoError(t, os.WriteFile(profile, []byte(mutantProfile(t, string(base), m)), 0o644))
	return profile
}

// mutantProfile is the reference profile with mutant m switched on in its
// start command, and the policies the mutant's server declares.
func mutantProfile(t *testing.T, base string, m sut.MutantInfo) string {
	text := strings.Replace(base, "--request-timeout, 1s]", "--request-timeout, 1s, --mutant, "+string(m.Mutant)+"]", 1)
	require.NotEqual(t, base, text, "the profile's command ends as the test expects")
	if m.Interruption == sut.KeepConsistent {
		// goose #7785's server keeps what an interrupted turn did.
		text = strings.Replace(text, "--interruption, rollback", "--interruption, keep-consistent", 1)
		text = strings.Replace(text, "interruption: rollback", "interruption: keep-consistent", 1)
	}
	if m.Mutant == sut.A2ACancelIgnored {
		// Without tools, a held model call is all of the turn: only the
		// agent's own word that it cancelled the task lets the harness
		// answer the call before the server's own 1 s timeout gives it
		// up (found after 4 checks from seed 2; missed without that word).
		text = strings.Replace(text, "\ntools: true\n", "\ntools: false\n", 1)
	}
	if m.Mutant == sut.LostOnEvict {
		// A loss on eviction depends on what else the cache holds: on a
		// server shared by the checks, other checks' conversations too, so
		// its saved steps replay on a fresh server only if they were found
		// on one. A smaller cache evicts sooner.
		text = strings.Replace(text, "  agent: helper\n", "  agent: helper\n  fresh_per_check: true\n", 1)
		text = strings.Replace(text, `--conversations-max, "4"`, `--conversations-max, "2"`, 1)
	}
	if m.Replicas > 0 {
		// As many replicas as the bug needs.
		replicas := strings.Replace(text, "  replicas: 3\n", "  replicas: "+strconv.Itoa(m.Replicas)+"\n", 1)
		require.True(t, m.Replicas == 3 || replicas != text, "the profile of replicas names their number as the test expects")
		text = replicas
	}
	return text
}

// TestConformURLNothingServed: a running server that answers 400 to
// everything does not conform: nothing about committed turns was
// exercised.
func TestConformURLNothingServed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":{"message":"no","type":"invalid_request_error"}}`))
	}))
	defer srv.Close()
	// Below the range the kernel hands out for port 0: no other
	// process's server takes it before the fake model binds it.
	addr, err := loopback.FreeAddr()
	require.NoError(t, err)
	code, stdout, stderr := runCLI(t, "conform", "--url", srv.URL, "--model-addr", addr, "--checks", "3", "--steps", "10")
	// Nothing broke, and nothing was proven: not proven, not broken.
	assert.Equal(t, exitNotProven, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, "NOT PROVEN: nothing broke; not exercised: T1, T2, T3")
	assert.Contains(t, stdout, "\n  T2    turns that end ok:", "each invariant not exercised is named with what would exercise it")
	assert.Contains(t, verdictLine(stdout, "T2"), "NOT EXERCISED")
	assert.Contains(t, verdictLine(stdout, "T7"), "NOT APPLICABLE")
	srv.CloseClientConnections()
}

// TestConformFindsTurncheckYAML: without --profile or --url, conform reads
// turncheck.yaml in the current directory, and says so; without one it
// says that it looked.
func TestConformFindsTurncheckYAML(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	code, _, stderr := runCLI(t, "conform")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "turncheck.yaml")

	// A profile whose server cannot start: what matters is which file
	// was read, and the error names it.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "turncheck.yaml"), []byte("server: {comand: [x]}\n"), 0o644))
	code, stdout, stderr := runCLI(t, "conform")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stdout, "using the profile turncheck.yaml")
	assert.Contains(t, stderr, `turncheck.yaml: line 1: unknown field "comand"`)
}

// TestConformUsage: what conform cannot run is a one-line error, exit 2.
func TestConformUsage(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("server: {comand: [x]}\n"), 0o644))
	for _, args := range [][]string{
		{"conform"},
		{"conform", "--profile", referenceProfile, "--url", "http://127.0.0.1:1"},
		{"conform", "--profile", "no-such.yaml"},
		{"conform", "--profile", bad},
		{"conform", "--profile", referenceProfile, "--skip", "T99"},
		{"conform", "--url", "http://example.com"},
		{"conform", "--url", "http://127.0.0.1:1", "--model-addr", "8.8.8.8:53"},
		{"conform", "--profile", referenceProfile, "--timeout", "0"},
	} {
		code, _, stderr := runCLI(t, args...)
		assert.Equal(t, exitUsage, code, "turncheck %s", strings.Join(args, " "))
		assert.Equal(t, 1, strings.Count(stderr, "\n"), "turncheck %s: want a one-line error, got %q", strings.Join(args, " "), stderr)
	}
	code, _, stderr := runCLI(t, "conform", "--profile", bad)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, `unknown field "comand" in server`)
}

// TestConformFindingsAsTheyHappen: a finding is printed, and saved, as
// soon as it is shrunk, before the verdicts; --fail-fast ends the run
// there.
func TestConformFindingsAsTheyHappen(t *testing.T) {
	t.Parallel() // it mostly waits on the servers it starts
	onPath(t)
	dir := t.TempDir()
	profile := writeMutantProfile(t, dir, sut.Mutants()[0])
	code, stdout, stderr := runCLI(t, "conform", "--profile", profile, "--checks", "20", "--steps", "20", "--seed", "2",
		"--save", dir, "--fail-fast", "--shrink-time", "3s")
	require.Equal(t, exitViolation, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	finding := strings.Index(stdout, "=== T")
	table := strings.Index(stdout, "\nT1   atomic turns")
	require.GreaterOrEqual(t, finding, 0, stdout)
	require.Greater(t, table, finding, "the finding comes before the verdicts:\n%s", stdout)
	assert.Less(t, strings.Index(stdout, "saved: "), table, "and is saved as it is found")
	assert.Contains(t, stdout, "stopped early: the first failure was found (fail fast)")
	fails := regexp.MustCompile(`(?m)^(T\d+) +.*\bFAIL\b`).FindAllStringSubmatch(stdout, -1)
	assert.Len(t, fails, 1, stdout)
}

// TestExampleServerConforms: the README's walkthrough server, a few lines
// of Python, conforms through its profile, so the walkthrough never rots.
func TestExampleServerConforms(t *testing.T) {
	t.Parallel() // it mostly waits on the server it starts
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 on this machine: the example server is a Python script")
	}
	// The profile names the script from the repository's root: it runs
	// from there, in a process of its own, so that other tests run beside.
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	code, stdout, stderr := runIn(t, root, onPath(t), "conform", "--profile", "examples/pyserver/profile.yaml", "--checks", "4", "--steps", "15",
		"--seed", "1", "--save", t.TempDir(), "--out", t.TempDir())
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Contains(t, stdout, "CONFORMS")
	for _, inv := range []string{"T1", "T2", "T3", "T4", "T5", "T6", "T10"} {
		assert.Regexp(t, `PASS +[1-9]\d* `, verdictLine(stdout, inv), inv)
	}
}

// TestIndependentA2AServer: an A2A agent written from the A2A
// specification alone (examples/a2a-pyserver, Python's standard library),
// checked through its profile as a user would: correct, it breaks
// nothing; with a real A2A bug switched on, that bug is found under its
// own invariant: an executor that never hears of tasks/cancel (answered
// canceled, committed all the same) is T10, and a message naming a
// finished task that runs it again is T3.
func TestIndependentA2AServer(t *testing.T) {
	t.Parallel() // it mostly waits on the servers it starts
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 on this machine: the example server is a Python script")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	shipped, err := os.ReadFile(filepath.Join(root, "examples/a2a-pyserver/profile.yaml"))
	require.NoError(t, err)
	onPath(t) // python3 is the interpreter, not a shim
	profile := func(t *testing.T, bug string) string {
		// The profile names its script from the repository's root: here
		// by its absolute path, so that the subtests can run at once.
		text := strings.Replace(string(shipped), "examples/a2a-pyserver/server.py", filepath.Join(root, "examples/a2a-pyserver/server.py"), 1)
		if bug != "" {
			text = strings.Replace(text, `--queue-wait, "8"]`, `--queue-wait, "8", --bug, `+bug+`]`, 1)
			require.Contains(t, text, bug)
		}
		path := filepath.Join(t.TempDir(), "profile.yaml")
		require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
		return path
	}
	for _, c := range []struct {
		bug          string
		checks, seed string
		inv          string
	}{
		{"", "3", "1", ""},
		// Each bug is found in the first check from seed 6, one check on
		// one server: from seed 1, ignore-cancel was found in the first
		// or the fifth of checks run two at a time, as their servers'
		// speed had it, and missed in three.
		{"ignore-cancel", "1", "6", "T10"},
		{"rerun-finished-task", "1", "6", "T3"},
	} {
		t.Run(cmp.Or(c.bug, "correct"), func(t *testing.T) {
			t.Parallel()
			// No shrink: that the bug is found, and named, is what this
			// shows.
			code, stdout, stderr := runCLI(t, "conform", "--profile", profile(t, c.bug), "--checks", c.checks, "--steps", "15",
				"--seed", c.seed, "--shrink-time", "1ms", "--save", t.TempDir())
			if c.inv == "" {
				assert.NotEqual(t, exitViolation, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
				assert.NotRegexp(t, `(?m)^\S+ +[a-z].* FAIL `, stdout)
				// A context whose tasks all failed, refused after a
				// restart, is what the faults drawn call for: no warning.
				assert.NotContains(t, stdout, "WARNING")
				return
			}
			require.Equal(t, exitViolation, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			assert.Contains(t, verdictLine(stdout, c.inv), "FAIL", stdout)
		})
	}
}

// TestProgressLine: the progress line counts checks and names the failure
// being shrunk.
func TestProgressLine(t *testing.T) {
	var b strings.Builder
	progress(&b, true)(scenarios.Stats{Checks: 7, ShrinkRuns: 5, Shrinking: "the T4 failure, at 3 step(s)"})
	assert.Contains(t, b.String(), "7 checks")
	assert.Contains(t, b.String(), "; shrinking the T4 failure, at 3 step(s): 5 replays so far")
}

// TestProgressWhileACheckRuns: off a terminal, a check that takes longer
// than progressEvery is no silence: a beat says the latest counts again,
// and that a check is running; one soon after a line says nothing.
func TestProgressWhileACheckRuns(t *testing.T) {
	var b syncbuf.Buffer
	p := newProgressLog(&b, false)
	p.update(scenarios.Stats{Checks: 2})
	p.beat()
	assert.Empty(t, b.String(), "said less than progressEvery ago")
	p.said = p.said.Add(-progressEvery)
	p.beat()
	assert.Contains(t, b.String(), "turncheck: 2 checks, ")
	assert.Contains(t, b.String(), "; a check is running\n")
	stop := p.beats(time.Millisecond)
	stop()
}

// TestShardsThroughTheCLI: the shards of one run, each a conform --shard
// K/N with the run's seed, merge into the run's verdicts (the same checks,
// every one run once); merge refuses shards that do not make a whole run,
// and conform a shard without a seed.
func TestShardsThroughTheCLI(t *testing.T) {
	t.Parallel() // it mostly waits on the servers it starts
	onPath(t)
	t.Run("three shards", func(t *testing.T) {
		t.Parallel() // it mostly waits on its servers
		shardsThroughTheCLI(t)
	})
}

func shardsThroughTheCLI(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for k := 1; k <= 3; k++ {
		file := filepath.Join(dir, fmt.Sprintf("shard%d.json", k))
		code, stdout, stderr := runCLI(t, "conform", "--profile", referenceProfile, "--checks", "6", "--steps", "10", "--seed", "9",
			"--shard", fmt.Sprintf("%d/3", k), "--json", file, "--out", filepath.Join(dir, fmt.Sprint(k)))
		require.NotEqual(t, exitUsage, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
		assert.Contains(t, stdout, fmt.Sprintf("This is shard %d/3 of the run", k))
		files = append(files, file)
	}
	merged := filepath.Join(dir, "merged.json")
	code, stdout, stderr := runCLI(t, append([]string{"merge", "--json", merged, "--junit", filepath.Join(dir, "junit.xml")}, files...)...)
	require.NotEqual(t, exitUsage, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	c, err := report.ReadConformance(merged)
	require.NoError(t, err)
	for _, v := range c.Verdicts {
		// Six short checks may leave a rare one (T11) not exercised; an
		// HTTP server makes no calls back (wire).
		assert.Contains(t, []scenarios.Status{scenarios.Pass, scenarios.NotExercised, scenarios.NotApplicable}, v.Status, "%s", v.Invariant)
	}
	assert.Equal(t, scenarios.Pass, c.Verdict(model.T2).Status)
	assert.Contains(t, stdout, "T2   committed turns stay            PASS")
	assert.Equal(t, 6, c.Stats.Checks, "every check of the run ran once")
	assert.Equal(t, 6, c.Asked)
	assert.Empty(t, c.Shard, "the merge is the whole run")
	assert.FileExists(t, filepath.Join(dir, "junit.xml"))

	for args, says := range map[string]string{
		"merge " + files[0] + " " + files[1]:                  "shard(s) 3/3 missing",
		"merge " + strings.Join(append(files, files[0]), " "): "shard 1/3 twice",
		"merge " + merged: "no shard",
		"merge":           "give the verdicts.json of every shard",
		"conform --profile " + referenceProfile + " --shard 1/3":           "--shard needs --seed",
		"conform --profile " + referenceProfile + " --shard 4/3 --seed 1":  `"4/3": want K/N`,
		"conform --profile " + referenceProfile + " --shard 1/3x --seed 1": `"1/3x": want K/N`,
	} {
		code, _, stderr := runCLI(t, strings.Fields(args)...)
		assert.Equal(t, exitUsage, code, args)
		assert.Contains(t, stderr, says, args)
	}
}

// TestReplicasShareNothingButTheStore: the reference server, correct as
// one process, run as two replicas over one SQLite store (its per-process
// conversation lock and cache serve nothing across them), is caught: turns
// of one conversation sent to both fork it (T4), or one replica serves a
// stale cached copy and loses the other's turn (T2). The saved failure
// replays on the replicas the plan names.
func TestReplicasShareNothingButTheStore(t *testing.T) {
	t.Parallel() // it mostly waits on the servers it starts
	onPath(t)
	t.Run("two replicas", func(t *testing.T) {
		t.Parallel() // it mostly waits on its servers
		dir := t.TempDir()
		base, err := os.ReadFile(referenceProfile)
		require.NoError(t, err)
		text := strings.Replace(string(base), "  agent: helper\n", "  agent: helper\n  replicas: 2\n", 1)
		require.NotEqual(t, string(base), text, "the profile names its agent as the test expects")
		profile := filepath.Join(dir, "replicas.yaml")
		require.NoError(t, os.WriteFile(profile, []byte(text), 0o644))
		code, stdout, stderr := runCLI(t, "conform", "--profile", profile, "--checks", "10", "--steps", "20", "--seed", "1",
			"--fail-fast", "--save", dir, "--out", filepath.Join(dir, "out"))
		require.Equal(t, exitViolation, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
		fails := regexp.MustCompile(`(?m)^(T\d+) +.*\bFAIL\b`).FindAllStringSubmatch(stdout, -1)
		require.Len(t, fails, 1, stdout)
		assert.Contains(t, []string{"T2", "T4"}, fails[0][1], stdout)
		assert.Contains(t, stdout, "to replica 1", "the report says which replica each request went to")

		saved, err := filepath.Glob(filepath.Join(dir, fails[0][1]+"-*.json"))
		require.NoError(t, err)
		require.Len(t, saved, 1)
		code, replayed, stderr := runCLI(t, "replay", saved[0], "--tries", "6")
		require.NotEqual(t, exitUsage, code, "%s", stderr)
		if notReproducedBurst(t, saved[0], code, replayed) {
			return
		}
		require.Equal(t, exitViolation, code, "replay:\n%s\n%s", replayed, stderr)
		assert.Contains(t, replayed, fails[0][1]+" (")
	})
}
