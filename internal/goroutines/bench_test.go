package goroutines

import (
	"testing"
)

// BenchmarkSnapshot is what one look at the process's goroutines costs,
// with 100 of them parked beside the benchmark's own.
func BenchmarkSnapshot(b *testing.B) {
	stop := make(chan struct{})
	for range 100 {
		labelled("bench", func() { <-stop })
	}
	defer close(stop)
	for b.Loop() {
		States(Snapshot(), key, []string{"bench"})
	}
}
