package procs

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestChildren: a child that runs is listed, and once it has been waited
// for it is not.
func TestChildren(t *testing.T) {
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep command")
	}
	before, err := Children()
	require.NoError(t, err)
	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	kids, err := Children()
	require.NoError(t, err)
	if before == nil && kids == nil {
		t.Skip("no /proc here")
	}
	want := strconv.Itoa(cmd.Process.Pid) + " (sleep)"
	assert.Contains(t, kids, want)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	kids, err = Children()
	require.NoError(t, err)
	assert.NotContains(t, strings.Join(kids, ","), want)
}
