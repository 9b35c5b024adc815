//go:build unix

package scenarios

import (
	"errors"
	"os"

	"github.com/turncheck/turncheck/faults"
)

// Subprocess is a Target whose servers are processes started from a
// command template, in any language: every "{addr}", "{model_url}" and
// "{data_dir}" in an argument is replaced (see faults.ProcessConfig). Each
// check gets a fresh process on a fresh data dir, removed when it stops.
// Its servers report no activity and hold no deadlines of the harness's:
// bursts settle by a quiet period, and a held model call times out on the
// server's own clock.
type Subprocess struct {
	// Command is the command line template, one argument per element.
	Command []string
	// Env is added to the environment, KEY=VALUE.
	Env []string
	// Ready is the path polled until the server answers; "" is /healthz.
	Ready string
	// Reaches is how to talk to the servers.
	Reaches Profile
}

// Profile returns s.Reaches.
func (s Subprocess) Profile() Profile { return s.Reaches }

// Start starts a process pointed at modelURL on a fresh data dir.
func (s Subprocess) Start(modelURL string) (Server, error) {
	dir, err := os.MkdirTemp("", "turncheck-subprocess-*")
	if err != nil {
		return nil, err
	}
	p, err := faults.StartProcess(faults.ProcessConfig{Command: s.Command, ModelURL: modelURL, DataDir: dir,
		Env: s.Env, Ready: s.Ready})
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	return &subprocessServer{p: p, dir: dir}, nil
}

type subprocessServer struct {
	p   *faults.Process
	dir string
}

func (s *subprocessServer) URL() string { return s.p.URL() }

// Close stops the process gracefully (then kills it) and removes its data.
func (s *subprocessServer) Close() error {
	return errors.Join(s.p.Stop(), os.RemoveAll(s.dir))
}
