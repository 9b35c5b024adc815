package scenarios_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/sut"
)

// restartable is a Target for a Go server whose Server the harness can
// restart (scenarios.Restarter): durability (T7) is checked on it.
// scenarios.Handler's servers cannot be restarted.
type restartable struct{}

func (restartable) Profile() scenarios.Profile {
	// An in-process server cannot be killed as kill -9 kills: it
	// declares what a graceful restart keeps.
	return scenarios.Profile{Model: "turncheck", ModelTimeout: time.Second,
		Durability: scenarios.Durability{Restart: true}}
}

func (restartable) Start(modelURL string) (scenarios.Server, error) {
	dir, err := os.MkdirTemp("", "myserver-*")
	if err != nil {
		return nil, err
	}
	s := &restartableServer{modelURL: modelURL, dir: dir}
	if err := s.start(); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	return s, nil
}

// restartableServer serves the handler on loopback; Restart stops it and
// starts a new one on the same data dir.
type restartableServer struct {
	modelURL, dir string
	handler       *sut.Server
	srv           *http.Server
	url           string
}

func (s *restartableServer) start() error {
	h, err := sut.New(sut.Config{ModelURL: s.modelURL, DataDir: s.dir, RequestTimeout: time.Second})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return errors.Join(err, h.Close())
	}
	s.handler, s.srv, s.url = h, &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}, "http://"+ln.Addr().String()
	go func() { _ = s.srv.Serve(ln) }()
	return nil
}

func (s *restartableServer) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(s.srv.Shutdown(ctx), s.handler.Close())
}

func (s *restartableServer) URL() string { return s.url }

// Restart is what makes it a scenarios.Restarter. crash is never asked
// of a server that declares no crash durability; agents is nil for a
// server that loads no agent source (Profile.Agent).
func (s *restartableServer) Restart(crash bool, agents []string) error {
	if err := s.stop(); err != nil {
		return err
	}
	return s.start()
}

func (s *restartableServer) Close() error { return errors.Join(s.stop(), os.RemoveAll(s.dir)) }

// A Go server gets T7 checked when its target's Server can be restarted:
// it has a Restart(crash bool, agents []string) error method.
func Example_restarter() {
	c, err := scenarios.Conform(restartable{}, scenarios.Options{Checks: 3, Seed: 1, Steps: 15})
	if err != nil {
		fmt.Println("could not run:", err)
		return
	}
	fmt.Println("T7", c.Verdict("T7").Status)
	// Output:
	// T7 pass
}
