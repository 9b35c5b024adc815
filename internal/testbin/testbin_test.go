package testbin

import (
	"debug/elf"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTheServerStartsWithoutALoader: the binary the tests start hundreds
// of times is linked statically, with no dynamic loader to run first.
func TestTheServerStartsWithoutALoader(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the check reads the binary as ELF, and runs on Linux alone")
	}
	f, err := elf.Open(Turncheck(t))
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		assert.NotEqual(t, elf.PT_INTERP, p.Type, "the binary names a dynamic loader")
	}
}
