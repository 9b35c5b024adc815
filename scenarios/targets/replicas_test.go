//go:build unix

package targets

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
	"github.com/turncheck/turncheck/internal/testbin"
)

// TestReplicas: a Subprocess with Replicas starts that many processes on
// one data dir, each on a port of its own with {replica} its index; one
// replica restarts, even crashed, while the others go on serving.
func TestReplicas(t *testing.T) {
	bin := testbin.Turncheck(t)
	fake, err := faults.StartModel(faults.ModelConfig{})
	require.NoError(t, err)
	defer func() { require.NoError(t, fake.Close()) }()
	s := Subprocess{
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
	r, ok := srv.(Replicated)
	require.True(t, ok, "a server of two replicas is Replicated")
	urls := r.URLs()
	require.Len(t, urls, 2)
	assert.NotEqual(t, urls[0], urls[1], "a port each")
	assert.Equal(t, urls, URLs(srv))
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
	dir := srv.(*replicas).dir
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

	one, err := Subprocess{Command: s.Command, StopGrace: 5 * time.Second}.Start(fake.URL())
	require.NoError(t, err)
	_, replicated := one.(Replicated)
	assert.False(t, replicated, "a server of one process is not")
	assert.Equal(t, []string{one.URL()}, URLs(one))
	require.NoError(t, one.Close())
}
