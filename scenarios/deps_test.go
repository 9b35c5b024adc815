package scenarios

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGoUseStaysLight: a Go test of one handler imports scenarios, and
// compiles what scenarios imports: never the proxies or the database
// driver that only replicated servers need (package fleet brings those).
func TestGoUseStaysLight(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list the imports with")
	}
	out, err := exec.Command(goCmd, "list", "-deps", "github.com/turncheck/turncheck/scenarios").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/turncheck/turncheck/scenarios/targets", "the listing is of scenarios")
	for _, heavy := range []string{"github.com/Shopify/toxiproxy", "github.com/jackc/pgx", "github.com/prometheus/", "google.golang.org/protobuf",
		"github.com/rs/zerolog", "github.com/turncheck/turncheck/scenarios/fleet", "github.com/turncheck/turncheck/internal/pgserver"} {
		for _, d := range deps {
			assert.False(t, strings.HasPrefix(d, heavy), "scenarios imports %s", d)
		}
	}
}
