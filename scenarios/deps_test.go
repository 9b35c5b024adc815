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

// TestFlowReadsTopToBottom: each package of the harness imports only the
// packages before it in the flow, so that a change to one stage (a new
// protocol, a new report) touches that stage and what comes after, never
// what comes before; and the reference target alone imports the server.
func TestFlowReadsTopToBottom(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go list needs the go tool on PATH: ", err)
	}
	const mod = "github.com/turncheck/turncheck/"
	flow := []string{"targets", "plan", "protocol", "history", "validate", "report", "execute", "traffic", "shrink", ""}
	out, err := exec.Command(goTool, "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", mod+"scenarios/...").CombinedOutput()
	require.NoError(t, err, string(out))
	place := map[string]int{}
	for i, p := range flow {
		place[strings.TrimSuffix(mod+"scenarios/"+p, "/")] = i
	}
	seen := 0
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		pkg, imports := fields[0], fields[1:]
		if pkg == mod+"scenarios/reference" {
			for _, imp := range imports {
				if strings.HasPrefix(imp, mod+"scenarios") {
					assert.Equal(t, mod+"scenarios/targets", imp, "the reference target imports more of the harness than its targets")
				}
			}
			continue
		}
		at, ok := place[pkg]
		if !assert.True(t, ok, "%s has no place in the flow: add it to this test", pkg) {
			continue
		}
		seen++
		for _, imp := range imports {
			if imp == mod+"sut" {
				t.Errorf("%s imports the reference server", pkg)
			}
			if i, ok := place[imp]; ok && i >= at {
				t.Errorf("%s imports %s, which comes after it in the flow", pkg, imp)
			}
		}
	}
	assert.Equal(t, len(flow), seen, "go list listed every package of the flow")
}
