package targets

import (
	"errors"
	"fmt"
)

// Link is a network path of a replicated server that the harness can
// break: each runs through a TCP proxy of the harness's own, on loopback.
type Link string

// The links of a replica.
const (
	// StoreLink is between a replica and the store it shares with the
	// others: its {store_url} names the proxy.
	StoreLink Link = "store"
	// ClientLink is between the client and a replica: the URL the client
	// sends the replica's requests to names the proxy.
	ClientLink Link = "client"
)

// NetKind is what goes wrong on a link.
type NetKind string

// The network faults, from the mildest.
const (
	// Latency delays every byte each way by NetFault.Millis.
	Latency NetKind = "latency"
	// Reset closes each connection as soon as any byte of it moves: what
	// was sent is lost. It closes with a FIN, not a TCP reset: toxiproxy
	// sets the reset (SO_LINGER 0) only for its own reset_peer toxic,
	// which leaves a goroutine behind per connection it closes.
	Reset NetKind = "reset"
	// Cut drops every byte each way, as a link that went dark does, and
	// closes each connection NetFault.Millis after it went dark: a peer
	// that waits learns nothing until then.
	Cut NetKind = "cut"
	// Partition closes every connection at once, both ways, and each new
	// one as soon as it is accepted: nothing gets through.
	Partition NetKind = "partition"
)

// NetKinds are the network faults, from the mildest.
var NetKinds = []NetKind{Latency, Reset, Cut, Partition}

// NetFault is a network fault on one link of a replica.
type NetFault struct {
	Link Link    `json:"link"`
	Kind NetKind `json:"kind"`
	// Millis is the latency each way, for Latency, or how long a cut
	// link holds its connections dark before it closes them, for Cut.
	Millis int `json:"ms,omitempty"`
}

// maxNetMillis bounds NetFault.Millis: a fault lasts one step, and a step
// is bounded by the client's timeout.
const maxNetMillis = 5000

// Check says what makes f impossible, nil if nothing.
func (f NetFault) Check() error {
	if f.Link != StoreLink && f.Link != ClientLink {
		return fmt.Errorf("network fault on link %q: want %s or %s", f.Link, StoreLink, ClientLink)
	}
	switch f.Kind {
	case Latency, Cut:
		if f.Millis <= 0 || f.Millis > maxNetMillis {
			return fmt.Errorf("network %s of %dms: want 1 to %dms", f.Kind, f.Millis, maxNetMillis)
		}
	case Reset, Partition:
		if f.Millis != 0 {
			return fmt.Errorf("network %s with %dms: it takes none", f.Kind, f.Millis)
		}
	default:
		return fmt.Errorf("network fault %q: want one of %v", f.Kind, NetKinds)
	}
	return nil
}

// String says what the fault does, for a person.
func (f NetFault) String() string {
	link := "the link to the store"
	if f.Link == ClientLink {
		link = "the client's link"
	}
	switch f.Kind {
	case Latency:
		return fmt.Sprintf("network latency of %dms each way on %s", f.Millis, link)
	case Reset:
		return "network reset of " + link
	case Cut:
		return fmt.Sprintf("network cut of %s (dark, closed after %dms)", link, f.Millis)
	}
	return fmt.Sprintf("network %s of %s", f.Kind, link)
}

// LinkBreaker is a Replicated server whose replicas' links to the client
// and to the store run through proxies the harness controls.
type LinkBreaker interface {
	Replicated
	// Break applies f to replica i's link until heal is called; heal
	// closes what went through the link while it was broken, so that no
	// connection carries on from a stream the fault mangled.
	Break(i int, f NetFault) (heal func() error, err error)
	// Links are the links of each replica that run through the harness.
	Links() []Link
}

// Proxies are the TCP proxies of a replicated server's links, on
// loopback: one to each replica from the client (or a front), one from
// each replica to the store.
type Proxies interface {
	// AddStore starts the proxy from replica i to the store at storeURL
	// and returns the URL the replica is given: storeURL through the
	// proxy, or storeURL itself where it names no host:port.
	AddStore(i int, storeURL string) (string, error)
	// AddClient starts the proxy from the client to replica i at base,
	// listening on listen.
	AddClient(i int, listen, base string) error
	// URL is where the client reaches replica i.
	URL(i int) string
	// Repoint sends the client's link to replica i on to base, where it
	// listens since a restart; with fixed, on the same address.
	Repoint(i int, base string, fixed bool) error
	// Links are the kinds of link that run through the proxies.
	Links() []Link
	// Break applies f to replica i's link until heal is called.
	Break(i int, f NetFault) (heal func() error, err error)
	// Close stops every proxy.
	Close()
}

// Fleet runs what a replicated server needs beyond its processes: the
// proxies on its links, and a PostgreSQL of the harness's for a profile's
// "store: postgres". Package scenarios/fleet provides it, registered as it
// is imported (the turncheck command imports it): a Go test of one
// handler does not compile a proxy or a database driver it never uses.
type Fleet interface {
	// NewProxies makes a server's proxies: none yet, started one by one.
	NewProxies() Proxies
	// StartPostgres starts a throwaway PostgreSQL with a database for the
	// server, and returns its URL and what stops it.
	StartPostgres() (url string, stop func() error, err error)
}

// fleet is the registered Fleet, nil if none is.
var fleet Fleet

// RegisterFleet makes f the Fleet replicated servers run with.
func RegisterFleet(f Fleet) { fleet = f }

// errNoFleet is why a replicated server with proxies or a PostgreSQL of
// the harness's cannot start without a Fleet.
var errNoFleet = errors.New("replicas over a store of the harness's, behind a front or with their links through the harness, " +
	"need package github.com/turncheck/turncheck/scenarios/fleet: import it (import _ \"github.com/turncheck/turncheck/scenarios/fleet\"); " +
	"the turncheck command does")

// fleetOrErr is the registered Fleet, or errNoFleet.
func fleetOrErr() (Fleet, error) {
	if fleet == nil {
		return nil, errNoFleet
	}
	return fleet, nil
}
