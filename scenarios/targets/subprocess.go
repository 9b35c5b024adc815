//go:build unix

package targets

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/turncheck/turncheck/faults"
)

// Subprocess is a Target whose server is a process started from a command
// template, in any language: "{addr}", "{port}", "{model_url}",
// "{data_dir}" and "{agents}" in an argument are replaced (see
// faults.ProcessConfig). By default one process serves a whole run, each
// check under a namespace of its own (ServerReuse); with FreshPerCheck,
// every check gets a fresh process on a fresh data dir. A data dir is
// removed when its process stops. Its servers report no activity and hold
// no deadlines of the harness's: bursts settle by a quiet period, and a
// held model call times out on the server's own clock.
type Subprocess struct {
	// Command is the command line template, one argument per element.
	Command []string
	// Env is added to the environment, KEY=VALUE; placeholders are
	// replaced as in Command.
	Env []string
	// Files are written into the data dir before every start, a
	// restart's too: a path relative to it, mapped to a template whose
	// placeholders are replaced as in Command (see faults.ProcessConfig).
	Files map[string]string
	// Agent names the agent the server loads from the fake model, if any:
	// {agents} gets a reference to it, http://MODEL/agents/NAME.yaml?tag=v1,
	// whose query the harness changes across restarts (set Reaches.Agent
	// too).
	Agent string
	// Ready is the path polled until the server answers; "" is /healthz.
	Ready string
	// ReadyLine, if set, replaces the HTTP probe: a regular expression
	// that a line of the server's output matches once it is ready; a
	// capture group in it is the address the server listens on.
	ReadyLine string
	// StartTimeout bounds a start (0: 15s); StopGrace is how long a stop
	// waits after SIGTERM before SIGKILL (0: 5s).
	StartTimeout, StopGrace time.Duration
	// StopStatus are exit statuses the server gives on SIGTERM as its
	// ordinary stop: no note (faults.ProcessConfig.StopStatus).
	StopStatus []int
	// FreshPerCheck starts a fresh server for every check rather than one
	// for the whole run: slower, but no check can see another's traces.
	FreshPerCheck bool
	// MaxParallel, if not 0, is how many of its servers may run at once
	// (Options.Parallel asks for more in vain): one for a server that
	// takes a fixed port or a resource only one instance can hold.
	MaxParallel int
	// Replicas, if above 1, is how many processes serve the server, all
	// from Command over one data dir (the store they share), each with a
	// port of its own and "{replica}" (0, 1, ...) replaced in Command, Env
	// and Files: a request goes to the replica its plan names, or to Front.
	Replicas int
	// Front, if set, is a load balancer someone else runs in front of the
	// replicas: every request goes to it, and it picks the replica.
	Front *Front
	// Store, if set, is where the server keeps its store, given to it as
	// "{store_url}" in Command, Env and Files: "postgres" starts a fresh
	// PostgreSQL on loopback for each server (its data in a temporary
	// directory, stopped with the server), a postgres:// URL names a
	// database someone else runs.
	Store string
	// ModelAt, if set, is the loopback host:port the fake model listens
	// on; "" picks a free port.
	ModelAt string
	// Reaches is how to talk to the servers.
	Reaches Profile
	// Started, if set, is called with the command line of each process
	// once it is ready (each replica's, each restart's): its placeholders
	// filled, what was actually run, where String gives the template. It
	// must not block: a start waits for it.
	Started func(argv []string)
}

// Profile returns s.Reaches.
func (s Subprocess) Profile() Profile { return s.Reaches }

// ReuseServer reports whether one process serves the whole run.
func (s Subprocess) ReuseServer() bool { return !s.FreshPerCheck }

// ModelAddr is s.ModelAt.
func (s Subprocess) ModelAddr() string { return s.ModelAt }

// String is the command line, for reports, and how many replicas run it,
// over what store, behind what front.
func (s Subprocess) String() string {
	out := strings.Join(s.Command, " ")
	if s.Replicas <= 1 {
		return out
	}
	out += fmt.Sprintf(" (%d replicas", s.Replicas)
	switch u, err := url.Parse(s.Store); {
	case s.Store == "postgres":
		out += " over a PostgreSQL of the harness's"
	case s.Store != "" && err == nil:
		out += " over the PostgreSQL at " + u.Host // never its password
	}
	if s.Front != nil {
		out += ", behind the front at " + s.Front.URL
	}
	return out + ")"
}

// Start starts a process pointed at modelURL on a fresh data dir.
func (s Subprocess) Start(modelURL string) (Server, error) {
	return s.StartContext(context.Background(), modelURL)
}

// StartContext is Start, with ctx bounding the waits for the server to be
// ready: its first start's and every restart's.
func (s Subprocess) StartContext(ctx context.Context, modelURL string) (Server, error) {
	var refs []string
	if s.Agent != "" {
		p := s.Reaches
		p.Agent = s.Agent
		refs = p.SourceRefs(modelURL, []string{FirstSource})
	}
	if s.Reaches.Protocol == ACP {
		return s.startACP(ctx, modelURL, refs)
	}
	dir, err := os.MkdirTemp("", "turncheck-subprocess-*")
	if err != nil {
		return nil, err
	}
	st, err := s.openStore()
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	if s.Replicas <= 1 {
		p, err := s.startReplica(ctx, modelURL, dir, refs, "", st.url)
		if err != nil {
			return nil, errors.Join(err, st.stop(), os.RemoveAll(dir))
		}
		return &subprocessServer{p: p, dir: dir, store: st}, nil
	}
	r := &replicas{dir: dir, store: st, front: s.Front}
	if s.Store != "" || s.Front != nil {
		// Replicas over a store the network joins, or behind a front:
		// their links run through the harness's proxies, which break them
		// (LinkBreaker), and which listen where the front sends.
		f, err := fleetOrErr()
		if err != nil {
			return nil, errors.Join(err, st.stop(), os.RemoveAll(dir))
		}
		r.links = f.NewProxies()
	}
	for i := range s.Replicas {
		storeURL := st.url
		if s.Store != "" {
			if storeURL, err = r.links.AddStore(i, st.url); err != nil {
				return nil, errors.Join(fmt.Errorf("replica %d: %w", i, err), r.Close())
			}
		}
		replicaModel := modelURL
		if s.Front != nil {
			// Each replica calls the model at a base URL of its own: the
			// model tells which one serves a turn the front sent on.
			replicaModel = faults.ReplicaURL(modelURL, i)
		}
		p, err := s.startReplica(ctx, replicaModel, dir, refs, strconv.Itoa(i), storeURL)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("replica %d: %w", i, err), r.Close())
		}
		r.procs = append(r.procs, p)
		if r.links != nil {
			if err := r.links.AddClient(i, s.upstream(i), p.URL()); err != nil {
				return nil, errors.Join(fmt.Errorf("replica %d: %w", i, err), r.Close())
			}
		}
	}
	if s.Front != nil {
		if err := s.Front.wait(ctx, cmp.Or(s.StartTimeout, 15*time.Second), cmp.Or(s.Ready, "/healthz")); err != nil {
			return nil, errors.Join(err, r.Close())
		}
	}
	if r.links != nil {
		return &linkedReplicas{r}, nil
	}
	return r, nil
}

// upstream is where the harness listens for the client's requests to
// replica i: where the front sends them, or a free port.
func (s Subprocess) upstream(i int) string {
	if s.Front != nil {
		return s.Front.Upstreams[i]
	}
	return "127.0.0.1:0"
}

// store is the store a server of s keeps its data in, beside its data dir.
type store struct {
	url string
	// stopPG stops the PostgreSQL the harness started for it, if it did.
	stopPG func() error
}

// stop stops the PostgreSQL the harness started, if any.
func (st store) stop() error {
	if st.stopPG == nil {
		return nil
	}
	return st.stopPG()
}

// openStore is the store s.Store names: a PostgreSQL started now for
// "postgres".
func (s Subprocess) openStore() (store, error) {
	if s.Store != "postgres" {
		return store{url: s.Store}, nil
	}
	f, err := fleetOrErr()
	if err != nil {
		return store{}, fmt.Errorf("store: postgres: %w", err)
	}
	url, stop, err := f.StartPostgres()
	if err != nil {
		return store{}, fmt.Errorf("store: postgres: %w", err)
	}
	return store{url: url, stopPG: stop}, nil
}

// startReplica starts one process of s on dir, "{replica}" standing for
// replica ("" for a server of one process) and "{store_url}" for storeURL.
func (s Subprocess) startReplica(ctx context.Context, modelURL, dir string, refs []string, replica, storeURL string) (*faults.Process, error) {
	repl := strings.NewReplacer("{replica}", replica, "{store_url}", storeURL)
	expand := func(in []string) []string {
		out := make([]string, len(in))
		for i, a := range in {
			out[i] = repl.Replace(a)
		}
		return out
	}
	var files map[string]string
	if s.Files != nil {
		files = map[string]string{}
		for name, text := range s.Files {
			files[repl.Replace(name)] = repl.Replace(text)
		}
	}
	return faults.StartProcess(faults.ProcessConfig{Command: expand(s.Command), ModelURL: modelURL, DataDir: dir,
		Env: expand(s.Env), Files: files, Agents: refs, Ready: s.Ready, ReadyLine: s.ReadyLine,
		StartTimeout: s.StartTimeout, StopGrace: s.StopGrace, StopStatus: s.StopStatus, Context: ctx, Started: s.Started})
}

type subprocessServer struct {
	p     *faults.Process
	dir   string
	store store
}

func (s *subprocessServer) URL() string { return s.p.URL() }

// Exited reports a process that exited on its own, with its last output
// and how it ended (an exit status, or a signal). No current process (a
// start that failed, or that the run's end cut short) is no exit: where
// it failed said so.
func (s *subprocessServer) Exited() error {
	return exited(s.p, "")
}

// exited reports p's current run if it has ended, with how and its last
// output, prefixed by who ("replica 1, "); nil while it runs or where
// there is no current run.
func exited(p *faults.Process, who string) error {
	select {
	case <-p.Exited():
		how := p.Ended()
		if how == "" {
			return nil
		}
		return fmt.Errorf("%s%s %s; its last output:\n%s", who, p, how, lastLines(p.Stderr(), 20))
	default:
		return nil
	}
}

// Output is the last lines the process wrote, stdout and stderr together.
func (s *subprocessServer) Output() string { return lastLines(s.p.Stderr(), 20) }

// Restart stops the process gracefully, or kills its group (crash), and
// starts it again on the same data dir, with agents for {agents} if not
// nil.
func (s *subprocessServer) Restart(crash bool, agents []string) error {
	return s.RestartContext(context.Background(), crash, agents)
}

// RestartContext is Restart, with ctx bounding the wait for the new run
// to be ready.
func (s *subprocessServer) RestartContext(ctx context.Context, crash bool, agents []string) error {
	if agents != nil {
		s.p.SetAgents(agents)
	}
	if crash {
		if err := s.p.Kill(); err != nil {
			return err
		}
	} else {
		// How the old run ended (a failure status after SIGTERM, or a
		// SIGKILL after the grace period) is no invariant's business:
		// what matters is that the new run serves the old data.
		_ = s.p.Stop()
	}
	return s.p.RestartContext(ctx)
}

// Close stops the process gracefully (then kills it) and removes its data
// and the store the harness started for it.
func (s *subprocessServer) Close() error {
	return errors.Join(s.p.Stop(), s.store.stop(), os.RemoveAll(s.dir))
}

// lastLines is the last n lines of out, with what the harness's client
// aborts caused marked as such (markAborts).
func lastLines(out string, n int) string {
	lines := foldRepeats(strings.Split(markAborts(strings.TrimRight(out, "\n")), "\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}

// digits matches the numbers in a line, which differ between the starts
// of one server (a port, a pid, a time).
var digits = regexp.MustCompile(`[0-9]+`)

// foldRepeats folds a run of lines that differ only in their numbers (a
// server's "Listening on 127.0.0.1:PORT" at each of a run's starts) into
// its last line, and says how many it stood for: the lines before them,
// a crash's traceback, stay in view.
func foldRepeats(lines []string) []string {
	out := make([]string, 0, len(lines))
	for i := 0; i < len(lines); {
		j := i + 1
		for j < len(lines) && lines[j] != "" && digits.ReplaceAllString(lines[j], "N") == digits.ReplaceAllString(lines[i], "N") {
			j++
		}
		line := lines[j-1]
		if j-i > 1 {
			line += fmt.Sprintf("  [turncheck: %d such lines, one after another, folded into the last]", j-i)
		}
		out = append(out, line)
		i = j
	}
	return out
}

// replicas is a server of several processes over one data dir.
type replicas struct {
	procs []*faults.Process
	dir   string
	store store
	// links, if not nil, are the proxies the client (or the front)
	// reaches each replica through, and each replica its store.
	links Proxies
	// front, if not nil, is where every request goes.
	front *Front
}

// linkedReplicas are replicas whose links run through the harness's
// proxies: the harness can break them.
type linkedReplicas struct{ *replicas }

// Break applies f to replica i's link until heal is called.
func (r linkedReplicas) Break(i int, f NetFault) (heal func() error, err error) {
	return r.links.Break(i, f)
}

// Links are the links of the replicas that run through the harness.
func (r linkedReplicas) Links() []Link { return r.links.Links() }

// URL is the front's, or the first replica's.
func (r *replicas) URL() string { return r.URLs()[0] }

// Replicas is how many processes serve the server.
func (r *replicas) Replicas() int { return len(r.procs) }

// URLs are the replicas', in order: their proxies', where the client
// reaches them through the harness's. Behind a front, the front's alone.
func (r *replicas) URLs() []string {
	if r.front != nil {
		return []string{r.front.URL}
	}
	out := make([]string, len(r.procs))
	for i, p := range r.procs {
		out[i] = p.URL()
		if r.links != nil {
			out[i] = r.links.URL(i)
		}
	}
	return out
}

// repoint points the client's proxy to replica i where it now listens.
func (r *replicas) repoint(i int) error {
	if r.links == nil {
		return nil
	}
	return r.links.Repoint(i, r.procs[i].URL(), r.front != nil)
}

// Exited reports the first replica that exited on its own.
func (r *replicas) Exited() error {
	for i, p := range r.procs {
		if err := exited(p, fmt.Sprintf("replica %d, ", i)); err != nil {
			return err
		}
	}
	return nil
}

// Output is the last lines each replica wrote.
func (r *replicas) Output() string {
	var b strings.Builder
	for i, p := range r.procs {
		fmt.Fprintf(&b, "replica %d:\n%s\n", i, lastLines(p.Stderr(), 10))
	}
	return b.String()
}

// Restart restarts every replica, as a restart of a server of one
// process does: all stopped (or killed), then all started.
func (r *replicas) Restart(crash bool, agents []string) error {
	return r.RestartContext(context.Background(), crash, agents)
}

// RestartContext is Restart, with ctx bounding the waits for the new runs.
func (r *replicas) RestartContext(ctx context.Context, crash bool, agents []string) error {
	for _, p := range r.procs {
		if agents != nil {
			p.SetAgents(agents)
		}
		if crash {
			if err := p.Kill(); err != nil {
				return err
			}
		} else {
			_ = p.Stop() // as for one process: how it ended is no invariant's business
		}
	}
	for i, p := range r.procs {
		if err := p.RestartContext(ctx); err != nil {
			return err
		}
		if err := r.repoint(i); err != nil {
			return err
		}
	}
	return nil
}

// RestartReplica restarts replica i alone.
func (r *replicas) RestartReplica(ctx context.Context, i int, crash bool) error {
	if i < 0 || i >= len(r.procs) {
		return fmt.Errorf("no replica %d: the server runs %d", i, len(r.procs))
	}
	p := r.procs[i]
	if crash {
		if err := p.Kill(); err != nil {
			return err
		}
	} else {
		_ = p.Stop()
	}
	if err := p.RestartContext(ctx); err != nil {
		return err
	}
	return r.repoint(i)
}

// Close stops every replica, then their proxies, and removes their data.
func (r *replicas) Close() error {
	var errs []error
	for _, p := range r.procs {
		errs = append(errs, p.Stop())
	}
	if r.links != nil {
		r.links.Close()
	}
	return errors.Join(append(errs, r.store.stop(), os.RemoveAll(r.dir))...)
}
