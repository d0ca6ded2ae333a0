package private

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// other is a uid with no passwd entry: another local user.
const other = 12345

// TestDir: a directory is made, or narrowed to 0700, when it is this
// user's and nobody else can write into it; a link, another user's, or
// one others can write into is refused.
func TestDir(t *testing.T) {
	root := t.TempDir()
	fresh := filepath.Join(root, "fresh", "a")
	if err := Dir(fresh); err != nil {
		t.Fatal(err)
	}
	wide := filepath.Join(root, "wide")
	os.Mkdir(wide, 0o755)
	os.Chmod(wide, 0o755)
	if err := Dir(wide); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{fresh, wide} {
		if fi, _ := os.Stat(d); fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, want 0700", d, fi.Mode())
		}
	}
	open := filepath.Join(root, "open")
	os.Mkdir(open, 0o700)
	os.Chmod(open, 0o777)
	link := filepath.Join(root, "link")
	os.Symlink(fresh, link)
	cases := map[string]string{open: "writable by group or others", link: "symbolic link"}
	if os.Geteuid() == 0 {
		theirs := filepath.Join(root, "theirs")
		os.Mkdir(theirs, 0o700)
		os.Chown(theirs, other, other)
		cases[theirs] = "belongs to uid 12345"
	}
	for d, want := range cases {
		err := Dir(d)
		if !errors.Is(err, ErrNotPrivate) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", d, err, want)
		}
	}
	if fi, _ := os.Stat(open); fi.Mode().Perm() != 0o777 {
		t.Errorf("a refused directory was changed: %v", fi.Mode())
	}
}

// TestOpenFile: a link is never followed (its target keeps its bytes);
// another user's file is refused.
func TestOpenFile(t *testing.T) {
	root := t.TempDir()
	victim := filepath.Join(root, "victim")
	os.WriteFile(victim, []byte("precious"), 0o600)
	link := filepath.Join(root, "up.lock")
	os.Symlink(victim, link)
	if _, err := OpenFile(link, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600); !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("a link: %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("the link's target now holds %q", b)
	}
	f, err := OpenFile(filepath.Join(root, "mine"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if os.Geteuid() == 0 {
		theirs := filepath.Join(root, "theirs")
		os.WriteFile(theirs, nil, 0o600)
		os.Chown(theirs, other, other)
		if _, err := OpenFile(theirs, os.O_RDWR, 0); !errors.Is(err, ErrNotPrivate) {
			t.Fatalf("another user's file: %v", err)
		}
	}
}
