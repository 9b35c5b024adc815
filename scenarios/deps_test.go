package scenarios_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestScenariosCompilesNoServer: a Go server's test that imports package
// scenarios compiles the harness only, not turncheck's reference server
// nor SQLite with it, which took minutes of a cold build.
func TestScenariosCompilesNoServer(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go list needs the go tool on PATH: ", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/turncheck/turncheck/scenarios").CombinedOutput()
	require.NoError(t, err, string(out))
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "pgregory.net/rapid", "go list listed the dependencies")
	for _, dep := range deps {
		assert.False(t, strings.HasPrefix(dep, "modernc.org/"), "scenarios depends on %s", dep)
		assert.NotEqual(t, "github.com/turncheck/turncheck/sut", dep, "scenarios depends on the reference server")
	}
}
