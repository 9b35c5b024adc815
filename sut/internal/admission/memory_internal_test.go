package admission

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJSONTextLenIsWhatJSONWrites: a model call's history is charged by
// its length as encoding/json writes it, which escapes "<" in six bytes.
func TestJSONTextLenIsWhatJSONWrites(t *testing.T) {
	for _, s := range []string{"", "plain", "<b>&</b>", "tab\tnew\nline\r\"q\"\\", "\x00\x1f", "héllo 世界", "\u2028\u2029", "bad \xff\xfe utf-8"} {
		b, err := json.Marshal(s)
		require.NoError(t, err)
		assert.Equal(t, int64(len(b)-2), jsonTextLen(s), "%q", s)
	}
}

// TestDefaultMaxMemoryReadsTheMachine: the physical memory of
// /proc/meminfo, and a cgroup limit (v2 or v1), or none when it says
// there is none.
func TestDefaultMaxMemoryReadsTheMachine(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
		return path
	}
	n, ok := memTotal(write("meminfo", "MemTotal:       24684012 kB\nMemFree:        23191576 kB\n"))
	assert.True(t, ok)
	assert.Equal(t, int64(24684012)<<10, n)
	_, ok = memTotal(write("nomem", "MemFree: 1 kB\n"))
	assert.False(t, ok)
	_, ok = memTotal(filepath.Join(dir, "missing"))
	assert.False(t, ok)

	n, ok = cgroupLimit(write("memory.max", "536870912\n"))
	assert.True(t, ok)
	assert.Equal(t, int64(512<<20), n)
	for _, none := range []string{"max\n", "9223372036854771712\n", "0\n", ""} {
		_, ok = cgroupLimit(write("none", none))
		assert.False(t, ok, "%q", none)
	}

	budget, from := DefaultMaxMemory()
	assert.Positive(t, budget)
	assert.NotEmpty(t, from)
}
