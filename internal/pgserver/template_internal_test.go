package pgserver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClustersAfterTheFirstAreCopies: the first start makes its cluster
// with initdb and keeps it as the template; the next is a copy of it, made
// without initdb, and takes connections as the first did.
func TestClustersAfterTheFirstAreCopies(t *testing.T) {
	if err := Installed(); err != nil {
		t.Skip(err)
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir()) // a cache of its own: no template yet
	ranInitdb := func(s *Server) bool {
		return strings.Contains(s.log.String(), "The files belonging to this database system")
	}
	first, err := Start()
	require.NoError(t, err)
	defer func() { require.NoError(t, first.Stop()) }()
	assert.True(t, ranInitdb(first), "the first cluster was made without initdb:\n%s", first.log)
	bin, err := findBin()
	require.NoError(t, err)
	attr, err := procAttr()
	require.NoError(t, err)
	tmpl, err := templateDir(bin, attr)
	require.NoError(t, err, "no template was kept")

	second, err := Start()
	require.NoError(t, err)
	defer func() { require.NoError(t, second.Stop()) }()
	assert.False(t, ranInitdb(second), "the second cluster was made by initdb, not copied:\n%s", second.log)
	require.NoError(t, second.Exec("postgres", "CREATE TABLE t (n int)"))
	_, err = os.Stat(filepath.Join(tmpl, "postmaster.pid"))
	assert.ErrorIs(t, err, os.ErrNotExist, "the template is a cluster that was never started")
}
