//go:build unix

package targets_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/turncheck/turncheck/faults"
	"github.com/turncheck/turncheck/internal/fronttest"
	"github.com/turncheck/turncheck/internal/testbin"
	_ "github.com/turncheck/turncheck/scenarios/fleet"
	"github.com/turncheck/turncheck/scenarios/targets"
)

// TestReplicas: a Subprocess with Replicas starts that many processes on
// one data dir, each on a port of its own with {replica} its index; one
// replica restarts, even crashed, while the others go on serving.
func TestReplicas(t *testing.T) {
	bin := testbin.Turncheck(t)
	fake, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	defer func() { require.NoError(t, fake.Close()) }()
	s := targets.Subprocess{
		Command:  []string{bin, "serve", "--listen", "{addr}", "--model-url", "{model_url}", "--data-dir", "{data_dir}"},
		Files:    map[string]string{"replica-{replica}.txt": "I am {replica}"},
		Replicas: 2, StopGrace: 5 * time.Second,
	}
	srv, err := s.Start(fake.URL())
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			require.NoError(t, srv.Close())
		}
	}()
	r, ok := srv.(targets.Replicated)
	require.True(t, ok, "a server of two replicas is targets.Replicated")
	urls := r.URLs()
	require.Len(t, urls, 2)
	assert.NotEqual(t, urls[0], urls[1], "a port each")
	assert.Equal(t, urls, targets.URLs(srv))
	answers := func(url string) bool {
		resp, err := http.Get(url + "/healthz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	for _, u := range urls {
		assert.True(t, answers(u), u)
	}
	dir := targets.ReplicasDir(srv)
	for _, name := range []string{"replica-0.txt", "replica-1.txt"} {
		text, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err, "one data dir, files written for each replica")
		assert.Equal(t, "I am "+name[len("replica-"):len("replica-")+1], string(text))
	}

	require.NoError(t, r.RestartReplica(context.Background(), 1, true))
	assert.Equal(t, urls[0], r.URLs()[0], "replica 0 went on serving")
	assert.True(t, answers(r.URLs()[0]))
	assert.True(t, answers(r.URLs()[1]), "replica 1 is back")
	assert.Error(t, r.RestartReplica(context.Background(), 2, false))

	require.NoError(t, srv.Close())
	closed = true
	_, err = os.Stat(dir)
	assert.True(t, os.IsNotExist(err), "the data dir is removed with the replicas")

	one, err := targets.Subprocess{Command: s.Command, StopGrace: 5 * time.Second}.Start(fake.URL())
	require.NoError(t, err)
	_, replicated := one.(targets.Replicated)
	assert.False(t, replicated, "a server of one process is not")
	assert.Equal(t, []string{one.URL()}, targets.URLs(one))
	require.NoError(t, one.Close())
}

// TestFront: behind a front, the client has the front's URL alone; the
// harness listens where the front sends (its upstreams) and passes each
// replica its share, and a replica that restarts on a port of its own is
// reached at its upstream again.
func TestFront(t *testing.T) {
	bin := testbin.Turncheck(t)
	fake, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	defer func() { require.NoError(t, fake.Close()) }()
	front := fronttest.Start(t, 2)
	s := targets.Subprocess{
		Command: []string{bin, "serve", "--listen", "{addr}", "--model-url", "{model_url}", "--data-dir", "{data_dir}"},
		// Each start on a port of the replica's choosing: a restarted
		// replica listens elsewhere.
		ReadyLine: `listening on (http://\S+)`,
		Replicas:  2, StopGrace: 5 * time.Second,
		Front: &targets.Front{URL: front.URL, Upstreams: front.Upstreams},
	}
	srv, err := s.Start(fake.URL())
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.Close()) }()
	assert.Equal(t, []string{front.URL}, targets.URLs(srv))
	assert.Equal(t, 2, targets.Replicas(srv))
	assert.True(t, targets.Fronted(srv))
	lb, ok := srv.(targets.LinkBreaker)
	require.True(t, ok, "the front's links to the replicas run through the harness")
	assert.Equal(t, []targets.Link{targets.ClientLink}, lb.Links(), "no store link: the replicas share a data dir")
	get := func() {
		t.Helper()
		resp, err := http.Get(front.URL + "/healthz")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	before := front.Served()
	for range 4 {
		get()
	}
	served := front.Served()
	assert.Equal(t, []int64{before[0] + 2, before[1] + 2}, served, "each replica answered its share")
	port := targets.ReplicaProcessURL(srv, 1)
	require.NoError(t, srv.(targets.Replicated).RestartReplica(context.Background(), 1, true))
	require.NotEqual(t, port, targets.ReplicaProcessURL(srv, 1), "the replica moved")
	get()
	get()
	assert.Equal(t, []int64{served[0] + 1, served[1] + 1}, front.Served(), "replica 1 answers at its upstream again")
}
