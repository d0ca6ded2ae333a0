//go:build linux

package model

import (
	"os"
	"syscall"
)

// mapFile maps the first size bytes of f read-only and shared with the
// page cache, prefaulted (every page is read at start-up anyway: the
// weights are validated and hashed).
func mapFile(f *os.File, size int) ([]byte, error) {
	return syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_SHARED|syscall.MAP_POPULATE)
}

func unmapFile(b []byte) error { return syscall.Munmap(b) }
