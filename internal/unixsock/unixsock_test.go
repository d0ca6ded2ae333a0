package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestListenModeWhateverTheUmask: with a umask that leaves everything
// open, the socket still appears at its path with the asked mode only,
// it replaces a stale socket, it serves, and Close removes it.
func TestListenModeWhateverTheUmask(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.sock")
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	ln, err := Listen(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want a socket with 0600", fi.Mode())
	}
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Write([]byte("ok"))
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil || string(buf) != "ok" {
		t.Fatalf("read %q, %v", buf, err)
	}
	c.Close()
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want the socket alone (no private directory left)", len(entries))
	}
	ln.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("socket still at %s after Close: %v", path, err)
	}
}

// TestListenInAMissingDirectory is a clear error, not a socket elsewhere.
func TestListenInAMissingDirectory(t *testing.T) {
	if _, err := Listen(filepath.Join(t.TempDir(), "no", "agent.sock"), 0o600); err == nil {
		t.Fatal("listen in a missing directory succeeded")
	}
}
