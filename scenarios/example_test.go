package scenarios_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/turncheck/turncheck/scenarios"
	"github.com/turncheck/turncheck/sut"
)

// Conform checks a server and gives a verdict per invariant. Here the
// server is the reference server as an http.Handler, as a Go server would
// give its own: Handler starts it on a loopback port for each check,
// pointed at the fake model, on a fresh data directory. A held model call
// times out on the server's own clock, so its timeout is kept short.
func ExampleConform() {
	target := scenarios.Handler(scenarios.Profile{Model: "turncheck", ModelTimeout: time.Second},
		func(modelURL, dataDir string) (http.Handler, error) {
			return sut.New(sut.Config{ModelURL: modelURL, DataDir: dataDir, RequestTimeout: time.Second})
		})
	c, err := scenarios.Conform(target, scenarios.Options{Checks: 4, Seed: 1})
	if err != nil {
		fmt.Println("could not run:", err)
		return
	}
	for _, v := range c.Verdicts[:6] {
		fmt.Println(v.Invariant, v.Status)
	}
	fmt.Println("conforms:", c.Passed())
	// Output:
	// T1 pass
	// T2 pass
	// T3 pass
	// T4 pass
	// T5 pass
	// T6 pass
	// conforms: true
}
