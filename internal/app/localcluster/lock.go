package localcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/lifeline-llm/lifeline/internal/private"
)

// lockDataDir takes dir/up.lock with an exclusive, non-blocking flock and
// writes this process's pid into it; a second `lifeline up` on the same
// directory fails at once, naming the process that holds it, instead of
// blocking on etcd's data file. The lock goes with the process, however
// it ends.
func lockDataDir(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, "up.lock")
	f, err := private.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("up: lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := strings.TrimSpace(string(b))
			if _, perr := strconv.Atoi(holder); perr != nil {
				holder = "unknown"
			}
			return nil, fmt.Errorf("up: data dir %s is in use by another lifeline up (pid %s): stop it or pass another --data-dir", dir, holder)
		}
		return nil, fmt.Errorf("up: lock %s: %w", path, err)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, nil
}
