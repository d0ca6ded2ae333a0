package model

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// RevisionCache is a directory of the revisions of checkpoint files
// already hashed, each under the identity of its file (device, inode,
// size, modification and change times) and of this engine's revision
// rules. A checkpoint whose file is found there is ready without the hash
// pass: the pass runs in the background instead (Model.Verify), and a
// mismatch forgets the entry. Change time cannot be set back by a user:
// a file written in place, truncated or replaced gets a new identity. The
// zero RevisionCache keeps nothing.
type RevisionCache struct {
	Dir string
}

// ErrRevisionChanged is wrapped by Verify's error when a checkpoint's
// weights are not the ones its cached revision was computed from.
var ErrRevisionChanged = errors.New("model: weights differ from their cached revision")

// entry is the file the revision of the checkpoint of identity key is
// kept in; "" when there is no cache or no identity.
func (rc RevisionCache) entry(key string) string {
	if rc.Dir == "" || key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s;chunk=%d;%s", EngineVersion, revisionChunk, key)))
	return filepath.Join(rc.Dir, hex.EncodeToString(sum[:16])+".rev")
}

// lookup is the cached revision of the checkpoint of identity key.
func (rc RevisionCache) lookup(key string) (string, bool) {
	path := rc.entry(key)
	if path == "" {
		return "", false
	}
	b, err := os.ReadFile(path)
	rev := strings.TrimSpace(string(b))
	if err != nil || len(rev) != 32 {
		return "", false
	}
	return rev, true
}

// store records rev for the checkpoint of identity key, atomically; a
// cache that cannot be written only costs the next start its hash pass.
func (rc RevisionCache) store(key, rev string) {
	path := rc.entry(key)
	if path == "" || os.MkdirAll(rc.Dir, 0o700) != nil {
		return
	}
	tmp, err := os.CreateTemp(rc.Dir, ".rev-*")
	if err != nil {
		return
	}
	_, err = tmp.WriteString(rev + "\n")
	if cerr := tmp.Close(); err == nil && cerr == nil && os.Rename(tmp.Name(), path) == nil {
		return
	}
	os.Remove(tmp.Name())
}

// forget removes the entry of identity key.
func (rc RevisionCache) forget(key string) {
	if path := rc.entry(key); path != "" {
		os.Remove(path)
	}
}

// unverified is a model made from a cached revision: what Verify checks.
type unverified struct {
	cache RevisionCache
	key   string
}

// Verify runs the hash pass a cached revision let the model skip at
// load: nil when the weights are finite and their revision is the cached
// one (and for a model that was hashed at load). On a mismatch the cache
// entry is forgotten, so the next load hashes again; the model must not
// serve (it is not the function its revision names).
func (m *Model) Verify() error {
	if m.unverified == nil {
		return nil
	}
	rev, err := revision(m.Config, &m.W)
	if err == nil && rev != m.Revision {
		err = fmt.Errorf("%w: revision %s, cached %s", ErrRevisionChanged, rev, m.Revision)
	}
	if err != nil {
		m.unverified.cache.forget(m.unverified.key)
		return err
	}
	return nil
}

// Unverified says whether the model's revision came from a cache and
// Verify has work to do.
func (m *Model) Unverified() bool { return m.unverified != nil }

// FileRevision is the content hash of the file at path (a GGUF model's
// revision: 32 hex digits of SHA-256), taken from rc under the file's
// identity when it was hashed before, else computed and kept there. A
// file changed in place has another identity (its change time cannot be
// set back), so a kept hash is never one of other bytes.
func FileRevision(path string, rc RevisionCache) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("model: revision of %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("model: revision of %s: %w", path, err)
	}
	key := fileIdentity(st)
	if key != "" {
		key = "file;" + key
	}
	if rev, ok := rc.lookup(key); ok {
		return rev, nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("model: revision of %s: %w", path, err)
	}
	rev := hex.EncodeToString(h.Sum(nil)[:16])
	rc.store(key, rev)
	return rev, nil
}

// newCached is newModel with the revision of the checkpoint of identity
// key taken from rc when it is there (the model then Verifies later),
// else computed and kept there.
func newCached(c Config, w *Weights, rc RevisionCache, key string) (*Model, error) {
	known, _ := rc.lookup(key)
	m, err := newModel(c, w, known)
	if err != nil {
		return nil, err
	}
	if known != "" {
		m.unverified = &unverified{cache: rc, key: key}
	} else {
		rc.store(key, m.Revision)
	}
	return m, nil
}
