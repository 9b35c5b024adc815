package main

import (
	"cmp"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/internal/fronttest"
	"github.com/turncheck/turncheck/internal/pgserver"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// TestConformReplicasOverPostgres: the reference server, run as three
// replicas over one PostgreSQL the harness starts for it (store: postgres,
// {store_url}), conforms: its conversation locks and cache hold across
// processes, where over one SQLite store they do not
// (TestReplicasShareNothingButTheStore), and across network faults
// between a replica and the store or the client.
//
// In CI, TestConformThroughAFront conforms the same replicas behind a
// front, with faults on both links, and TestReplicasShareNothingButTheStore
// sends requests to replicas the plan draws: this run is the longer
// campaign, behind -replicated.
//
// Without -replicated, one short check runs profiles/reference-replicas.yaml
// as shipped: the profile starts, serves and breaks nothing.
func TestConformReplicasOverPostgres(t *testing.T) {
	t.Parallel() // it mostly waits on the servers it starts
	if err := pgserver.Installed(); errors.Is(err, pgserver.ErrNotInstalled) {
		t.Skip(err)
	}
	onPath(t)
	if !*replicated {
		dir := t.TempDir()
		code, stdout, stderr := runCLI(t, "conform", "--profile", replicasProfile, "--checks", "1", "--steps", "12", "--seed", "2",
			"--parallel", "1", "--out", filepath.Join(dir, "out"))
		require.NotEqual(t, exitUsage, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
		assert.NotContains(t, stdout, "FAIL", "stdout:\n%s", stdout)
		assert.Regexp(t, `PASS +[1-9]\d* `, verdictLine(stdout, "T2"), "stdout:\n%s", stdout)
		t.Log("the longer campaign: go test ./cmd/turncheck -run TestConformReplicasOverPostgres -replicated")
		return
	}
	t.Run("three replicas", func(t *testing.T) {
		t.Parallel() // it mostly waits on its servers
		dir := t.TempDir()
		profile := replicasProfile
		// One check at a time: one PostgreSQL and one set of replicas
		// and proxies, not one a core.
		code, stdout, stderr := runCLI(t, "conform", "--profile", profile, "--checks", "4", "--steps", "20", "--seed", "2",
			"--parallel", "1", "--out", filepath.Join(dir, "out"))
		require.NotEqual(t, exitUsage, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
		// Their links to the client and to the store broke under turns
		// in flight, and every invariant held across.
		// (A fault drawn but never reached is counted on a line of its own,
		// "faults drawn, not reached".)
		assert.Regexp(t, `faults injected: (.*, )?network (reset|cut|partition) \(store link\)`, stdout)
		assert.Regexp(t, `faults injected: (.*, )?network (reset|cut|partition) \(client link\)`, stdout)
		for _, inv := range []string{"T1", "T2", "T3", "T4", "T5", "T6", "T7", "T8", "T9", "T10", "T11"} {
			line := verdictLine(stdout, inv)
			assert.NotContains(t, line, "FAIL", inv)
			assert.NotContains(t, line, "SAME CAUSE", inv)
			switch inv {
			case "T2", "T4", "T5":
				// What replicas break first: a turn lost to a stale
				// cache, turns forked past a lock one process holds.
				assert.Regexp(t, `PASS +[1-9]\d* `, line, inv)
			default:
				// A short run on a server that reports no activity may
				// leave a rarer one (a restart, T11) not exercised.
				assert.Regexp(t, `PASS +[1-9]\d* |NOT EXERCISED`, line, inv)
			}
		}
	})
}

// TestConformThroughAFront: the reference server's replicas, behind a
// front the test runs (nginx, round robin), are reached
// only through it: the clean server conforms across network faults on
// the front's links to the replicas and on theirs to the store, and the
// lock one process holds (replica-local-lock) forks a conversation whose
// turns the front sends to two replicas (T4). Which replica serves a turn
// is the front's choice, not the plan's.
func TestConformThroughAFront(t *testing.T) {
	t.Parallel() // it mostly waits on the servers it starts
	if err := pgserver.Installed(); errors.Is(err, pgserver.ErrNotInstalled) {
		t.Skip(err)
	}
	onPath(t)
	for _, c := range []struct {
		mutant string
		fails  string
	}{{"", ""}, {"replica-local-lock", "T4"}} {
		t.Run(cmp.Or(c.mutant, "clean"), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			// The profile and nginx configuration as shipped, on ports
			// of the test's own.
			text, front := frontProfileOnFreePorts(t)
			if c.mutant != "" {
				text = strings.Replace(text, "--request-timeout, 1s]", "--request-timeout, 1s, --mutant, "+c.mutant+"]", 1)
				require.Contains(t, text, "--mutant, "+c.mutant)
			}
			profile := filepath.Join(dir, "front.yaml")
			require.NoError(t, os.WriteFile(profile, []byte(text), 0o644))
			code, stdout, stderr := runCLI(t, "conform", "--profile", profile, "--checks", "3", "--steps", "20", "--seed", "2",
				"--shrink-time", "2s", "--out", filepath.Join(dir, "out"))
			require.NotEqual(t, exitUsage, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			for i, n := range front.Served() {
				assert.NotZero(t, n, "replica %d served through the front", i)
			}
			assert.NotContains(t, stdout, "to replica", "the front, not the plan, sends a request to its replica")
			if c.fails != "" {
				assert.Equal(t, exitViolation, code, "stdout:\n%s", stdout)
				assert.Contains(t, verdictLine(stdout, c.fails), "FAIL", "stdout:\n%s", stdout)
				// The turns that forked, each on the replica the model
				// calls showed.
				assert.Regexp(t, `message tc-u\d+, (streamed, )?served by replica \d`, stdout)
				// The saved failure replays through the front: its turns
				// sent at once go to replicas the front picks anew, so
				// every try may run them on one replica and break nothing
				// (exit 3, not reproduced).
				saved := regexp.MustCompile(`saved: (\S+` + c.fails + `-conform-\d+\.json)`).FindStringSubmatch(stdout)
				require.NotNil(t, saved, "stdout:\n%s", stdout)
				code, replay, _ := runCLI(t, "replay", saved[1], "--tries", "3")
				require.NotEqual(t, exitUsage, code, "%s", replay)
				if notReproducedBurst(t, saved[1], code, replay) {
					return
				}
				assert.Contains(t, replay, "FAIL: "+c.fails, "%s", replay)
				return
			}
			assert.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
			// The links of the replicas that served turns broke under
			// them, between the front and a replica and between a
			// replica and the store, and every invariant held across.
			assert.Regexp(t, `faults injected: (.*, )?network (reset|cut|partition) \(client link\)`, stdout)
			assert.Regexp(t, `faults injected: (.*, )?network (reset|cut|partition) \(store link\)`, stdout)
			for _, inv := range []string{"T2", "T4"} {
				assert.Regexp(t, `PASS +[1-9]\d* `, verdictLine(stdout, inv), inv)
			}
		})
	}
}

// frontProfileOnFreePorts is profiles/reference-front.yaml, and the front
// it names running: nginx started from profiles/nginx-front.conf where
// nginx is installed (.ci/run installs it), else the tests' own front.
// Both listen on free ports in place of the fixed ones the files name,
// which the profile's text is rewritten to.
func frontProfileOnFreePorts(t *testing.T) (string, *fronttest.Front) {
	t.Helper()
	b, err := os.ReadFile(frontProfile)
	require.NoError(t, err)
	target, err := targets.LoadProfile(frontProfile)
	require.NoError(t, err, "the profile as shipped loads")
	sub, ok := target.(targets.Subprocess)
	require.True(t, ok, "a profile that starts its server: %T", target)
	fixed := sub.Front
	require.NotNil(t, fixed, "the profile names its front")
	listen := strings.TrimPrefix(fixed.URL, "http://")
	var front *fronttest.Front
	if _, err := fronttest.NginxPath(); err != nil {
		t.Logf("the tests' own front: %v", err)
		front = fronttest.Start(t, len(fixed.Upstreams))
	} else {
		front = fronttest.NginxFile(t, frontConf, listen, fixed.Upstreams)
	}
	pairs := []string{fixed.URL, front.URL}
	for i, u := range fixed.Upstreams {
		pairs = append(pairs, u, front.Upstreams[i])
	}
	text := strings.NewReplacer(pairs...).Replace(string(b))
	for i := 0; i < len(pairs); i += 2 {
		require.NotContains(t, text, pairs[i], "a fixed address left in the profile")
	}
	return text, front
}
