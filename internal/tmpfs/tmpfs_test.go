package tmpfs

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestUseKeepsAChosenTMPDIR: a TMPDIR the user set stands; one unset
// becomes /dev/shm only where that is a tmpfs with room.
func TestUseKeepsAChosenTMPDIR(t *testing.T) {
	t.Setenv("TMPDIR", "/somewhere/chosen")
	Use()
	assert.Equal(t, "/somewhere/chosen", os.Getenv("TMPDIR"))

	t.Setenv("TMPDIR", "")
	Use()
	if got := os.Getenv("TMPDIR"); got != "" {
		assert.Equal(t, dir, got)
		probe, err := os.MkdirTemp("", "tmpfs-probe-*")
		assert.NoError(t, err, "the tmpfs chosen takes a temporary directory")
		assert.NoError(t, os.Remove(probe))
	}
}
