// Package fleet runs what a replicated server needs beyond its processes:
// toxiproxy proxies on the links between the client (or a front) and each
// replica and between each replica and the store, which the harness breaks
// (network faults), and a throwaway PostgreSQL for a profile's "store:
// postgres". Importing it registers it with package targets
// (targets.RegisterFleet); the turncheck command does. A Go test of one
// handler leaves it out, and compiles neither toxiproxy nor a database
// driver.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/rs/zerolog"

	"github.com/turncheck/turncheck/internal/pgserver"
	"github.com/turncheck/turncheck/scenarios/targets"
)

func init() { targets.RegisterFleet(provider{}) }

// provider is the Fleet this package registers.
type provider struct{}

// NewProxies makes a server's proxies.
func (provider) NewProxies() targets.Proxies { return newProxies() }

// StartPostgres starts a PostgreSQL with a database for the server. The
// harness crashes the server's processes, never PostgreSQL: what
// PostgreSQL acknowledged survives them whether or not it reached the
// disk, so it need not wait for the disk.
func (provider) StartPostgres() (string, func() error, error) {
	pg, err := pgserver.Start("fsync=off", "full_page_writes=off")
	if err != nil {
		return "", nil, err
	}
	url, err := pg.CreateDatabase("turncheck")
	if err != nil {
		return "", nil, errors.Join(err, pg.Stop())
	}
	return url, pg.Stop, nil
}

// proxies are the TCP proxies of a replicated server's links: one to
// each replica from the client, one from each replica to the store.
type proxies struct {
	api           *toxiproxy.ApiServer
	client, store []*toxiproxy.Proxy
}

// newProxies makes a server's proxies: none yet, started one by one.
func newProxies() *proxies {
	return &proxies{api: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())}
}

// start starts a proxy on listen (a free port for "127.0.0.1:0") to
// upstream (host:port). It listens until the server closes: a fault
// breaks what goes through it, never its port, which nothing else may
// take while the replica it serves still knows it.
func (ps *proxies) start(name, listen, upstream string) (*toxiproxy.Proxy, error) {
	p := toxiproxy.NewProxy(ps.api, name, listen, upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("proxy %s on %s to %s: %w", name, listen, upstream, err)
	}
	return p, nil
}

// addStore starts the proxy from replica i to the store at storeURL and
// returns the URL the replica is given: storeURL through the proxy. A
// store URL without a host:port (a socket) goes through none.
func (ps *proxies) AddStore(i int, storeURL string) (string, error) {
	u, err := url.Parse(storeURL)
	if err != nil || u.Port() == "" {
		ps.store = append(ps.store, nil)
		return storeURL, nil
	}
	p, err := ps.start(fmt.Sprintf("store-%d", i), "127.0.0.1:0", u.Host)
	if err != nil {
		return "", err
	}
	ps.store = append(ps.store, p)
	u.Host = p.Listen
	return u.String(), nil
}

// addClient starts the proxy from the client (or a front) to replica i
// at base (an http:// URL), listening on listen.
func (ps *proxies) AddClient(i int, listen, base string) error {
	p, err := ps.start(fmt.Sprintf("client-%d", i), listen, strings.TrimPrefix(base, "http://"))
	if err != nil {
		return err
	}
	ps.client = append(ps.client, p)
	return nil
}

// url is the URL the client reaches replica i at.
func (ps *proxies) URL(i int) string { return "http://" + ps.client[i].Listen }

// repoint gives the client a new proxy to replica i at base, where the
// replica listens since its restart, on a port of its own (the client
// is told the replicas' URLs anew after a restart); the old one closes.
// With fixed, the new proxy takes the old one's address, which a front
// knows: the old one closes first.
func (ps *proxies) Repoint(i int, base string, fixed bool) error {
	old := ps.client[i]
	up := strings.TrimPrefix(base, "http://")
	if old.Upstream == up {
		return nil
	}
	listen := "127.0.0.1:0"
	if fixed {
		listen = old.Listen
		old.Stop()
	}
	p, err := ps.start(old.Name, listen, up)
	for wait := time.Now(); err != nil && fixed && time.Since(wait) < rebindWait; {
		// Another socket took the port in the moment it was free (an
		// outgoing connection's, in the ephemeral range): it may let go.
		time.Sleep(20 * time.Millisecond)
		p, err = ps.start(old.Name, listen, up)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", targets.ErrHarness, err)
	}
	old.Stop()
	ps.client[i] = p
	return nil
}

// rebindWait bounds the wait for a front's upstream address to be free
// again after its proxy closed.
const rebindWait = 2 * time.Second

// links are the kinds of link that run through ps: the client's always,
// the store's where a replica reaches it over TCP.
func (ps *proxies) Links() []targets.Link {
	for _, p := range ps.store {
		if p != nil {
			return []targets.Link{targets.StoreLink, targets.ClientLink}
		}
	}
	return []targets.Link{targets.ClientLink}
}

// healTimeout bounds the wait for a fault's toxics to come off a link:
// toxiproxy's ResetToxics does not heed its context (it waits for each
// toxic's connections to let go), so the wait is bounded here, and a heal
// that takes longer is reported, its removal left to finish on its own.
const healTimeout = 5 * time.Second

// breakLink applies f to replica i's link and returns its heal.
func (ps *proxies) Break(i int, f targets.NetFault) (func() error, error) {
	if err := f.Check(); err != nil {
		return nil, err
	}
	links := ps.client
	if f.Link == targets.StoreLink {
		links = ps.store
	}
	if i < 0 || i >= len(links) || links[i] == nil {
		return nil, fmt.Errorf("replica %d has no %s link through the harness", i, f.Link)
	}
	p := links[i]
	var toxic string
	switch f.Kind {
	case targets.Partition:
		toxic = `"type": "` + partitionToxic + `", "attributes": {}`
	case targets.Latency:
		toxic = fmt.Sprintf(`"type": "latency", "attributes": {"latency": %d}`, f.Millis)
	case targets.Reset:
		toxic = `"type": "` + closeToxic + `", "attributes": {}`
	case targets.Cut:
		toxic = fmt.Sprintf(`"type": "%s", "attributes": {"dark": %d}`, cutToxic, f.Millis)
	}
	heal := func() error {
		healed := make(chan struct{})
		go func() {
			defer close(healed)
			p.Toxics.ResetToxics(context.Background())
		}()
		select {
		case <-healed:
			return nil
		case <-time.After(healTimeout):
			return fmt.Errorf("the %s link of replica %d was not healed within %s", f.Link, i, healTimeout)
		}
	}
	for _, stream := range []string{"upstream", "downstream"} {
		body := fmt.Sprintf(`{"name": "%s-%s", "stream": "%s", %s}`, f.Kind, stream, stream, toxic)
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
			return nil, errors.Join(fmt.Errorf("network %s on replica %d's %s link: %w", f.Kind, i, f.Link, err), heal())
		}
	}
	return heal, nil
}

// The toxics of Reset, Cut and Partition. toxiproxy's own (reset_peer,
// timeout) stop reading once they have closed their stream: the next
// chunk the connection brings then blocks the toxic before them for
// good, a goroutine left behind by every connection a fault closed.
// These close as they do, then drain what still comes until the
// connection ends. A partition is a toxic too, rather than a proxy
// stopped and started again: its port stays the proxy's.
const (
	closeToxic     = "turncheck_close"
	cutToxic       = "turncheck_cut"
	partitionToxic = "turncheck_partition"
)

func init() {
	toxics.Register(closeToxic, new(closingToxic))
	toxics.Register(cutToxic, new(darkToxic))
	toxics.Register(partitionToxic, new(partitionedToxic))
}

// partitionedToxic closes its stream at once: every connection open when
// the partition comes, and every one accepted while it holds.
type partitionedToxic struct{}

// Pipe closes and drains.
func (partitionedToxic) Pipe(stub *toxics.ToxicStub) {
	stub.Close()
	drain(stub)
}

// closingToxic closes its stream at the first chunk that comes, which it
// drops.
type closingToxic struct{}

// Pipe drops the first chunk, closes, and drains.
func (closingToxic) Pipe(stub *toxics.ToxicStub) {
	select {
	case <-stub.Interrupt:
		return
	case c := <-stub.Input:
		stub.Close()
		if c != nil {
			drain(stub)
		}
	}
}

// darkToxic drops every chunk, and closes its stream Dark milliseconds
// after it went dark.
type darkToxic struct {
	Dark int64 `json:"dark"`
}

// Pipe drops what comes, closes when the time is up, and drains.
func (t *darkToxic) Pipe(stub *toxics.ToxicStub) {
	timer := time.NewTimer(time.Duration(t.Dark) * time.Millisecond)
	defer timer.Stop()
	for {
		select {
		case <-stub.Interrupt:
			return
		case <-timer.C:
			stub.Close()
			drain(stub)
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
		}
	}
}

// Cleanup closes the stream when the cut heals: what went dark does not
// carry on from a stream with a hole in it. The stub is no longer run
// after it, so what still comes is drained here, until the connection,
// closed now, ends.
func (t *darkToxic) Cleanup(stub *toxics.ToxicStub) {
	stub.Close()
	go drain(stub)
}

// drain reads what still comes to a closed stub until the connection
// ends.
func drain(stub *toxics.ToxicStub) {
	for c := range stub.Input {
		if c == nil {
			return
		}
	}
}

// close stops every proxy, closing the connections through it.
func (ps *proxies) Close() {
	for _, p := range append(ps.client, ps.store...) {
		if p != nil {
			p.Stop()
		}
	}
}
