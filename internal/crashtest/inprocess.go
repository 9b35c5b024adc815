package crashtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turncheck/turncheck/internal/loopback"
	"github.com/turncheck/turncheck/scenarios/reference"
	"github.com/turncheck/turncheck/scenarios/targets"
	"github.com/turncheck/turncheck/sut"
)

// Target is the reference server in process, with PanicOnAbort's defect:
// behind a front of this package's, which plays the process, it serves as
// the reference target does, and once it has served a streamed turn
// whose client went away before the stream ended it dies as that process would (no connection
// answers, what was not durable is lost) and says so as a watched process
// does (targets.ServerWatcher), with the runtime's panic as its last
// output, until the harness restarts it.
type Target struct{ reference.Target }

// Start serves a reference server behind a front that dies.
func (t Target) Start(modelURL string) (targets.Server, error) {
	srv, err := t.Target.Start(modelURL)
	if err != nil {
		return nil, err
	}
	in, ok := srv.(*sut.Instance)
	if !ok {
		return nil, errors.Join(fmt.Errorf("crashtest: a %T, not one reference server", srv), srv.Close())
	}
	d := &dying{Instance: in, tr: &http.Transport{}}
	d.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(d.upstream.Load())
			pr.Out.Host = pr.In.Host
		},
		Transport:     d.tr,
		FlushInterval: -1,
		// A turn the server did not answer breaks its connection, as the
		// process's would; to a client gone, nothing is said.
		ErrorHandler: func(_ http.ResponseWriter, r *http.Request, _ error) {
			if r.Context().Err() == nil {
				panic(http.ErrAbortHandler)
			}
		},
	}
	if err := d.listen(); err != nil {
		return nil, errors.Join(err, in.Close())
	}
	return d, nil
}

// dying is a reference server behind a front that dies, which the
// harness sees as one process.
type dying struct {
	*sut.Instance
	proxy    *httputil.ReverseProxy
	tr       *http.Transport
	upstream atomic.Pointer[url.URL]

	mu sync.Mutex
	// front serves the process's address while it lives; life counts its
	// lives, so that a turn of an earlier life cannot end this one.
	front  *http.Server
	ln     net.Listener
	served chan struct{}
	life   int
	// died is set once it died, until the harness restarts it.
	died bool
}

// listen starts a life: a front on a fresh loopback port, before the
// server as it now listens. Called with mu held, or before any request.
func (d *dying) listen() error {
	u, err := url.Parse(d.Instance.URL())
	if err != nil {
		return err
	}
	d.upstream.Store(u)
	ln, err := loopback.Listen("")
	if err != nil {
		return err
	}
	d.life++
	life := d.life
	d.ln, d.died, d.served = ln, false, make(chan struct{})
	d.front = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		streamed := Streamed(r)
		ended := &endWriter{ResponseWriter: w}
		w = ended
		defer func() {
			// Also as the proxy gives up on a client gone mid-stream
			// (http.ErrAbortHandler).
			if streamed && !ended.done && r.Context().Err() != nil {
				d.die(life)
			}
		}()
		d.proxy.ServeHTTP(w, r)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func(srv *http.Server, served chan struct{}) {
		defer close(served)
		_ = srv.Serve(ln)
	}(d.front, d.served)
	return nil
}

// die ends life, if it is still the current one: the front stops and
// drops every connection, and the server drops what it held, as kill -9
// would.
func (d *dying) die(life int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if life != d.life || d.died {
		return // the harness stopped that life, or it died already
	}
	d.died = true
	d.stopFront()
	_ = d.Instance.Running.Crash()
}

// stopFront closes the front and its connections, and waits until it no
// longer serves. Called with mu held.
func (d *dying) stopFront() {
	d.life++ // what the turns of the ending life do decides nothing now
	_ = d.front.Close()
	<-d.served
}

// URL is the front's.
func (d *dying) URL() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return "http://" + d.ln.Addr().String()
}

// Exited says that the server died, with its last output, nil while it
// lives.
func (d *dying) Exited() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.died {
		return nil
	}
	return fmt.Errorf("the reference server in process %w; its last output:\n%s", errDied, panicText)
}

// Output is the panic, once it died.
func (d *dying) Output() string {
	if d.Exited() == nil {
		return ""
	}
	return panicText
}

// Restart stops the front (if it still lives) and the server, gracefully
// or as a crash, and starts both again on the same data.
func (d *dying) Restart(crash bool, agents []string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.died {
		d.stopFront()
	}
	if err := d.Instance.Restart(crash, agents); err != nil {
		return err
	}
	d.tr.CloseIdleConnections()
	return d.listen()
}

// Close stops the front and the server, and removes its data.
func (d *dying) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.died {
		d.stopFront()
	}
	d.tr.CloseIdleConnections()
	return d.Instance.Close()
}

// RestartContext is Restart: an in-process start does not wait.
func (d *dying) RestartContext(_ context.Context, crash bool, agents []string) error {
	return d.Restart(crash, agents)
}
