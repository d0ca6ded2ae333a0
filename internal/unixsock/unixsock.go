// Package unixsock listens on unix sockets that nobody but their owner
// (and root) can connect to at any moment of their life: a socket bound
// at its final path and chmodded afterwards is reachable, for a moment,
// with the mode the process umask leaves (connect needs write
// permission). Here the socket is bound inside a fresh private directory,
// chmodded there, and renamed into place.
package unixsock

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// Listener is a unix listener at a fixed path; Close removes the path.
type Listener struct {
	*net.UnixListener
	path string
}

// Listen binds a unix socket at path with mode (e.g. 0o600), replacing a
// stale socket there, whatever the umask.
func Listen(path string, mode os.FileMode) (*Listener, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(path), ".s")
	if err != nil {
		return nil, fmt.Errorf("unixsock: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("unixsock: %w", err)
	}
	name := filepath.Join(tmp, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("unixsock: listen %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false) // it is unlinked at its final path
	if err := os.Chmod(name, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("unixsock: chmod %s: %w", path, err)
	}
	if err := os.Rename(name, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("unixsock: listen %s: %w", path, err)
	}
	return &Listener{UnixListener: ln, path: path}, nil
}

// Close stops listening and removes the socket.
func (l *Listener) Close() error {
	err := l.UnixListener.Close()
	os.Remove(l.path)
	return err
}
