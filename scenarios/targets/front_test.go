package targets

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFrontNotRunning: a front that does not answer is an error that
// says the harness does not start it, and where it must send.
func TestFrontNotRunning(t *testing.T) {
	f := Front{URL: "http://127.0.0.1:1", Upstreams: []string{"127.0.0.1:9701", "127.0.0.1:9702"}}
	err := f.wait(context.Background(), 100*time.Millisecond, "/healthz")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "turncheck starts the replicas, not the front")
	assert.Contains(t, err.Error(), "replica 0 to 127.0.0.1:9701, replica 1 to 127.0.0.1:9702")
}

// TestSubprocessSaysHowItRuns: a report names the replicas, their store
// (never its password) and their front.
func TestSubprocessSaysHowItRuns(t *testing.T) {
	s := Subprocess{Command: []string{"srv", "--port", "{port}"}}
	assert.Equal(t, "srv --port {port}", s.String())
	s.Replicas, s.Store = 3, "postgres"
	assert.Equal(t, "srv --port {port} (3 replicas over a PostgreSQL of the harness's)", s.String())
	s.Store, s.Front = "postgres://app:secret@127.0.0.1:5432/db", &Front{URL: "http://127.0.0.1:8080"}
	assert.Equal(t, "srv --port {port} (3 replicas over the PostgreSQL at 127.0.0.1:5432, behind the front at http://127.0.0.1:8080)", s.String())
}

// TestHandlerCountsItsWork: a Handler's server says how many requests are
// in the handler, and when that changes: the harness knows when it is
// idle with no quiet period (WorkReporter).
func TestHandlerCountsItsWork(t *testing.T) {
	release := make(chan struct{})
	target := Handler(Profile{}, func(string, string) (http.Handler, error) {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }), nil
	})
	srv, err := target.Start("http://127.0.0.1:1/v1")
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.Close()) }()
	wr, ok := srv.(WorkReporter)
	require.True(t, ok, "a Handler's server reports its work")
	n, changed := wr.Working()
	require.Zero(t, n)
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Get(srv.URL())
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-changed
	n, changed = wr.Working()
	assert.Equal(t, 1, n)
	close(release)
	<-changed
	<-done
	n, _ = wr.Working()
	assert.Zero(t, n)
}
