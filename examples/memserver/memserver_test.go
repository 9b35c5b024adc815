package memserver_test

import (
	"net/http"
	"testing"

	"github.com/turncheck/turncheck/examples/memserver"
	"github.com/turncheck/turncheck/scenarios"
)

// TestConversations is the README's snippet, whole: the server checks
// itself from its own go test, one subtest per invariant.
func TestConversations(t *testing.T) {
	scenarios.Run(t, scenarios.Handler(scenarios.Profile{Model: "my-agent"},
		func(modelURL, dataDir string) (http.Handler, error) { return memserver.New(modelURL), nil }),
		scenarios.Options{Checks: 20, Seed: 1})
}
