//go:build !linux

package tmpfs

func use() {}
