//go:build unix

package scenarios_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/pgserver"
	"github.com/turncheck/turncheck/internal/testbin"
	"github.com/turncheck/turncheck/model"
	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/scenarios/plan"
)

// BenchmarkReplicas measures whole checks through the reference profile,
// its server one process over SQLite and three replicas over one
// PostgreSQL the harness starts (each request drawn to a replica), one
// check at a time and as many at once as the machine has cores: what a
// replicated run costs against a single server's.
func BenchmarkReplicas(b *testing.B) {
	bin := testbin.Turncheck(b)
	for _, server := range []struct {
		name     string
		replicas int
		store    string
	}{{"1-sqlite", 1, ""}, {"3-postgres", 3, "postgres"}} {
		target := profileTarget(b, bin).(scenarios.Subprocess)
		if server.store != "" {
			target = overPostgres(b, target, server.replicas)
		}
		for _, parallel := range []int{1, scenarios.Parallel(target, 0)} {
			b.Run(fmt.Sprintf("%s/parallel=%d", server.name, parallel), func(b *testing.B) {
				if server.store != "" {
					if err := pgserver.Installed(); err != nil {
						b.Skip(err)
					}
				}
				measureChecks(b, target, 12, parallel)
			})
		}
	}
}

// overPostgres is target run as n replicas over one PostgreSQL the
// harness starts: the data dir in its command becomes {store_url}.
func overPostgres(tb testing.TB, target scenarios.Subprocess, n int) scenarios.Subprocess {
	tb.Helper()
	command := append([]string(nil), target.Command...)
	found := false
	for i := range command[:len(command)-1] {
		if command[i] == "--data-dir" {
			command[i], command[i+1], found = "--store", "{store_url}", true
		}
	}
	require.True(tb, found, "the profile's command names its data dir")
	target.Command, target.Replicas, target.Store = command, n, "postgres"
	return target
}

// measureChecks runs conform checks of 20 steps on target, checks at a
// time, and reports checks per minute and steps per second.
func measureChecks(b *testing.B, target scenarios.Target, checks, parallel int) {
	total, steps, elapsed := 0, 0, time.Duration(0)
	for b.Loop() {
		c, err := scenarios.Conform(target, scenarios.Options{Checks: checks, Steps: 20, Seed: 1, Parallel: parallel})
		require.NoError(b, err)
		require.Empty(b, c.Failures(), "the clean server failed")
		total, steps, elapsed = total+c.Stats.Checks, steps+c.Stats.Steps, elapsed+c.Elapsed
	}
	b.ReportMetric(float64(total)/elapsed.Minutes(), "checks/min")
	b.ReportMetric(float64(steps)/elapsed.Seconds(), "steps/s")
}

// BenchmarkFailover measures how long a conversation is out of reach when
// the replica serving it dies: three reference servers over one
// PostgreSQL; a turn runs on replica 0 (the model holds its call, so the
// replica holds the conversation's lock); replica 0 is killed (kill -9);
// the next turn of the conversation goes to replica 1, which waits for the
// lock that died with replica 0's connection. The metric is the time from
// the kill to that turn's answer; "idle" kills a replica with no turn
// running, and "no-kill" is a turn on replica 1 with nobody killed, the
// cost of a turn itself.
func BenchmarkFailover(b *testing.B) {
	if err := pgserver.Installed(); err != nil {
		b.Skip(err)
	}
	bin := testbin.Turncheck(b)
	pg, err := pgserver.Start()
	require.NoError(b, err)
	defer func() { require.NoError(b, pg.Stop()) }()
	store, err := pg.CreateDatabase("failover")
	require.NoError(b, err)
	fake, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(b, err)
	defer fake.Close()
	replicas := make([]*faults.Process, 3)
	for i := range replicas {
		replicas[i], err = faults.StartProcess(faults.ProcessConfig{
			// The request timeout outlasts the failover, so the waiting
			// turn is answered when the lock is free, not refused.
			Command: []string{bin, "serve", "--listen", "{addr}", "--model-url", "{model_url}", "--store", store,
				"--key", "key-a", "--request-timeout", "30s"},
			ModelURL: fake.URL(),
			DataDir:  b.TempDir(),
		})
		require.NoError(b, err)
		defer func() { require.NoError(b, replicas[i].Stop()) }()
	}
	client := &http.Client{Timeout: time.Minute}
	defer client.CloseIdleConnections()
	n := 0
	for _, kill := range []string{"mid-turn", "idle", "no-kill"} {
		b.Run(kill, func(b *testing.B) {
			var out time.Duration
			for b.Loop() {
				n++
				conv := fmt.Sprintf("failover-%d", n)
				require.NoError(b, sendTurn(client, replicas[0].URL(), conv, model.UserToken(3*n)))
				held := make(chan error, 1)
				var gate *faults.Gate
				if kill == "mid-turn" {
					tok := model.UserToken(3*n + 1)
					gate = fake.Gate(tok)
					go func() { held <- sendTurn(client, replicas[0].URL(), conv, tok) }()
					select {
					case <-gate.Arrived():
					case err := <-held:
						b.Fatalf("the turn to be held on replica 0 ended first: %v", err)
					}
				}
				start := time.Now()
				if kill != "no-kill" {
					require.NoError(b, replicas[0].Kill())
				}
				require.NoError(b, sendTurn(client, replicas[1].URL(), conv, model.UserToken(3*n+2)))
				out += time.Since(start)
				if gate != nil {
					require.Error(b, <-held, "the turn on the killed replica")
					gate.Release()
				}
				if kill != "no-kill" {
					b.StopTimer()
					require.NoError(b, replicas[0].RestartContext(context.Background()))
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(out.Microseconds())/1000/float64(b.N), "ms-to-served")
		})
	}
}

// sendTurn sends the user message of tok as the next turn of conv to the
// server at base, and fails unless it is answered 200.
func sendTurn(client *http.Client, base, conv string, tok model.Token) error {
	body, err := json.Marshal(map[string]any{"model": "turncheck", "stream": false,
		"messages": []map[string]string{{"role": "user", "content": plan.UserText(tok)}}})
	if err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer key-a")
	req.Header.Set(scenarios.DefaultConversationHeader, conv)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var answer struct {
		Error *struct{ Message string } `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&answer)
	if resp.StatusCode != http.StatusOK {
		if answer.Error != nil {
			return fmt.Errorf("%s: %s", resp.Status, answer.Error.Message)
		}
		return errors.New(resp.Status)
	}
	return nil
}
