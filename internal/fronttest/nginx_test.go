package fronttest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFrontBalancesByLoad: the operator's front (profiles/nginx-front.conf),
// and the one the tests write, send a request to the replica with the
// fewest requests in flight (nginx's least_conn), not round robin: a
// replica slower than the others, one request still on it, gets no more
// until it answers, where round robin would pile every third on it.
func TestFrontBalancesByLoad(t *testing.T) {
	for name, start := range map[string]func(t *testing.T, upstreams int) *Front{
		"profiles/nginx-front.conf": func(t *testing.T, _ int) *Front {
			return NginxFile(t, "../../profiles/nginx-front.conf", "127.0.0.1:18080",
				[]string{"127.0.0.1:18081", "127.0.0.1:18082", "127.0.0.1:18083"})
		},
		"the tests' own": func(t *testing.T, upstreams int) *Front {
			return Nginx(t, upstreams)
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := start(t, 3)
			release := make(chan struct{})
			var slow atomic.Int32 // requests that reached the slow replica
			for i, addr := range f.Upstreams {
				ln, err := net.Listen("tcp", addr)
				require.NoError(t, err)
				srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if i == 0 {
						slow.Add(1)
						select {
						case <-release:
						case <-r.Context().Done():
						}
					}
					_, _ = io.WriteString(w, "ok")
				})}
				go func() { _ = srv.Serve(ln) }()
				t.Cleanup(func() { _ = srv.Close() })
			}
			client := &http.Client{Timeout: 30 * time.Second}
			t.Cleanup(client.CloseIdleConnections)
			get := func() error {
				r, err := client.Get(f.URL + "/")
				if err == nil {
					_, _ = io.Copy(io.Discard, r.Body)
					r.Body.Close()
				}
				return err
			}

			// One request held on the slow replica: sent until one lands
			// there (round robin over three, at most a few tries).
			held := make(chan error, 1)
			for try := 0; slow.Load() == 0; try++ {
				require.Less(t, try, 10, "no request reached the slow replica")
				go func() { held <- get() }()
			wait:
				for slow.Load() == 0 {
					select {
					case err := <-held: // answered by a fast one
						require.NoError(t, err)
						break wait
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
			for range 12 {
				require.NoError(t, get(), "a request sent to the replica still busy")
			}
			assert.Equal(t, int32(1), slow.Load(), "requests sent to the replica still busy with one")
			close(release)
			require.NoError(t, <-held)
		})
	}
}

// TestNginxOnATakenPortIsNoFront: where another server took the port
// picked for nginx before nginx bound it, that server answers on it, and
// nginx, unable to bind, exits: the start fails, saying why, rather than
// take the other server for the front (a harness would then check that
// server, and the replies of another test's model would read as the
// check's own).
func TestNginxOnATakenPortIsNoFront(t *testing.T) {
	bin, err := NginxPath()
	if err != nil {
		t.Skip(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	other := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "another server")
	})}
	go func() { _ = other.Serve(ln) }()
	t.Cleanup(func() { _ = other.Close() })

	dir := t.TempDir()
	conf := fmt.Sprintf(nginxConf, "", dir, "\t\tserver 127.0.0.1:1;\n", ln.Addr().String())
	if os.Geteuid() == 0 {
		conf = "user root;\n" + conf
	}
	log, err := startNginx(t, bin, dir, []byte(conf), ln.Addr().String())
	require.Error(t, err, "the other server was taken for nginx")
	assert.Contains(t, log, "Address already in use")
}
