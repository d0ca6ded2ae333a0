//go:build linux

package model

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps the first size bytes of f read-only and shared with the
// page cache; populate prefaults every page (when the weights are to be
// validated and hashed at start-up, every page is read anyway).
func mapFile(f *os.File, size int, populate bool) ([]byte, error) {
	flags := syscall.MAP_SHARED
	if populate {
		flags |= syscall.MAP_POPULATE
	}
	return syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, flags)
}

func unmapFile(b []byte) error { return syscall.Munmap(b) }

// fileIdentity names the file content st describes: device, inode, size
// and modification and change times (ns).
func fileIdentity(st os.FileInfo) string {
	s, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return ""
	}
	return fmt.Sprintf("dev=%d;ino=%d;size=%d;mtime=%d.%09d;ctime=%d.%09d", s.Dev, s.Ino, s.Size, s.Mtim.Sec, s.Mtim.Nsec, s.Ctim.Sec, s.Ctim.Nsec)
}
