package model

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestRevisionCacheSkipsTheHashPass: the first load of a checkpoint
// hashes it and records the revision; the next load of the same file
// takes the revision from the cache, unverified, and Verify confirms it.
func TestRevisionCacheSkipsTheHashPass(t *testing.T) {
	if !mapsHere {
		t.Skip("checkpoints are not mapped on this host: no revision is cached")
	}
	path, _, want := writeCheckpoint(t, false)
	rc := RevisionCache{Dir: filepath.Join(t.TempDir(), "revisions")}
	first, err := LoadLlama2CCached(path, rc)
	if err != nil {
		t.Fatal(err)
	}
	if first.Unverified() || first.Revision != want.Revision {
		t.Fatalf("first load: unverified %v, revision %s, want hashed %s", first.Unverified(), first.Revision, want.Revision)
	}
	again, err := LoadLlama2CCached(path, rc)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Unverified() || again.Revision != want.Revision {
		t.Fatalf("second load: unverified %v, revision %s, want cached %s", again.Unverified(), again.Revision, want.Revision)
	}
	if err := again.Verify(); err != nil {
		t.Fatalf("verify: %v", err)
	}
}

// TestRevisionCacheMissesAFileWrittenInPlace: a weight rewritten in place
// changes the file's identity: the revision is computed again, not taken
// from the cache.
func TestRevisionCacheMissesAFileWrittenInPlace(t *testing.T) {
	if !mapsHere {
		t.Skip("checkpoints are not mapped on this host: no revision is cached")
	}
	path, data, want := writeCheckpoint(t, false)
	rc := RevisionCache{Dir: t.TempDir()}
	if _, err := LoadLlama2CCached(path, rc); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	at := int64(len(data) - 4) // the last weight
	if _, err := f.WriteAt([]byte{0, 0, 0x80, 0x3f}, at); err != nil {
		t.Fatal(err)
	}
	f.Close()
	m, err := LoadLlama2CCached(path, rc)
	if err != nil {
		t.Fatal(err)
	}
	if m.Unverified() || m.Revision == want.Revision {
		t.Fatalf("after an in-place write: unverified %v, revision %s (was %s)", m.Unverified(), m.Revision, want.Revision)
	}
}

// TestVerifyCatchesAWrongCachedRevision: a cache entry that names another
// revision for the file (weights changed under an unchanged identity, or
// a planted entry) is caught by Verify, typed, and forgotten: the next
// load hashes the file again.
func TestVerifyCatchesAWrongCachedRevision(t *testing.T) {
	if !mapsHere {
		t.Skip("checkpoints are not mapped on this host: no revision is cached")
	}
	path, _, want := writeCheckpoint(t, false)
	rc := RevisionCache{Dir: t.TempDir()}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	wrong := "0123456789abcdef0123456789abcdef"
	rc.store(fileIdentity(st), wrong)
	m, err := LoadLlama2CCached(path, rc)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Unverified() || m.Revision != wrong {
		t.Fatalf("load: unverified %v, revision %s, want the planted %s", m.Unverified(), m.Revision, wrong)
	}
	if err := m.Verify(); !errors.Is(err, ErrRevisionChanged) {
		t.Fatalf("verify: %v, want ErrRevisionChanged", err)
	}
	m, err = LoadLlama2CCached(path, rc)
	if err != nil {
		t.Fatal(err)
	}
	if m.Unverified() || m.Revision != want.Revision {
		t.Fatalf("load after the mismatch: unverified %v, revision %s, want hashed %s", m.Unverified(), m.Revision, want.Revision)
	}
}
