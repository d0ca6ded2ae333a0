// Package private checks that a directory or file is one only this
// process's user controls before it is trusted: a data directory, a CA
// directory, a lock file. Another local user who pre-creates such a path
// (in /tmp, say) could otherwise plant a CA, or a symbolic link that
// turns a write into the truncation of a file they cannot write.
//
// A path is private when it is not a symbolic link, belongs to this
// process's effective uid, and is not writable by group or others.
package private

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrNotPrivate is wrapped by every refusal.
var ErrNotPrivate = errors.New("not private to this user")

// check says why fi (of path) is not private, or nil.
func check(path string, fi fs.FileInfo) error {
	if fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%w: %s is a symbolic link: name the real path", ErrNotPrivate, path)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%w: %s: no owner", ErrNotPrivate, path)
	}
	if uid := os.Geteuid(); int(st.Uid) != uid {
		return fmt.Errorf("%w: %s belongs to uid %d, not to this user (uid %d): another user may have planted it; use a path of your own", ErrNotPrivate, path, st.Uid, uid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by group or others (mode %#o): what is in it may have been planted; use a fresh path, or check its contents and chmod go-w it", ErrNotPrivate, path, fi.Mode().Perm())
	}
	return nil
}

// Check says why the existing path is not private (nil when it is); it
// does not follow a final symbolic link.
func Check(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	return check(path, fi)
}

// Dir makes path a private directory of mode 0700: created when absent
// (with its parents), else checked (private, a directory) and narrowed.
func Dir(path string) error {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if err := check(path, fi); err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", path)
	}
	return os.Chmod(path, 0o700)
}

// OpenFile is os.OpenFile that never follows a final symbolic link
// (O_NOFOLLOW) and refuses a file that is not private.
func OpenFile(path string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|unix.O_NOFOLLOW, perm)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%w: %s is a symbolic link: remove it", ErrNotPrivate, path)
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		err = check(path, fi)
	}
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%w: %s is not a regular file", ErrNotPrivate, path)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
