package store

import (
	"path/filepath"
	"strconv"
	"testing"
)

// BenchmarkOpenStore: what a server start pays for its SQLite store,
// opened and closed: new, in an empty data dir (a check's first start, a
// replay's), and again (a restart's).
func BenchmarkOpenStore(b *testing.B) {
	b.Run("new", func(b *testing.B) {
		dir := b.TempDir()
		for i := range b.N {
			openClose(b, filepath.Join(dir, strconv.Itoa(i)))
		}
	})
	b.Run("again", func(b *testing.B) {
		dir := b.TempDir()
		for range b.N {
			openClose(b, dir)
		}
	})
}

func openClose(b *testing.B, dir string) {
	s, err := OpenStore(dir)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
}
