package shm

import (
	"errors"
	"os"
	"syscall"
	"testing"
)

// TestReopenNarrowsTheMode: an arena left with a wider mode (created under
// an older release, or chmodded by hand) is 0600 again once its owner
// reopens it; a worker's Open leaves the mode alone.
func TestReopenNarrowsTheMode(t *testing.T) {
	path := tempArenaPath(t)
	g := Geometry{Slots: 2, PayloadSize: 4096}
	a, _, err := OpenOrCreate(path, g)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	w, err := OpenWorker(path)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o666 {
		t.Fatalf("a worker's open changed the mode to %v", st.Mode().Perm())
	}
	a, created, err := OpenOrCreate(path, g)
	if err != nil || created {
		t.Fatalf("reopen: %v (created %v)", err, created)
	}
	a.Close()
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("arena mode %v after the owner reopened it, want 0600", st.Mode().Perm())
	}
}

// TestOpenRefusesWhatAnotherUserPlanted: /dev/shm is writable by all, so
// a file of another uid, or a link, at the arena's path is refused with
// ErrNotOwned, by the owner and by workers alike.
func TestOpenRefusesWhatAnotherUserPlanted(t *testing.T) {
	g := Geometry{Slots: 2, PayloadSize: 4096}
	target := tempArenaPath(t)
	a, _, err := OpenOrCreate(target, g)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()

	link := tempArenaPath(t)
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenOrCreate(link, g); err == nil {
		t.Fatal("owner opened an arena through a symlink")
	}
	if _, err := OpenWorker(link); err == nil {
		t.Fatal("worker opened an arena through a symlink")
	}

	if os.Geteuid() != 0 {
		t.Skip("chown to another uid needs root")
	}
	if err := os.Chown(target, 12345, 12345); err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenOrCreate(target, g); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("owner reopening another uid's arena: %v, want ErrNotOwned", err)
	}
	if _, err := OpenWorker(target); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("worker opening another uid's arena: %v, want ErrNotOwned", err)
	}
	if st, _ := os.Stat(target); st.Sys().(*syscall.Stat_t).Uid != 12345 {
		t.Fatal("refusing changed the file's owner")
	}
}
