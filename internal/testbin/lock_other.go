//go:build !unix

package testbin

// lock does nothing where flock is missing: test binaries that start at
// once may then each link cmd/turncheck, into the same cache entry.
func lock(string) (unlock func(), err error) { return func() {}, nil }
