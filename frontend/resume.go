package frontend

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// ErrBadResumeToken is wrapped by every resume token rejection.
var ErrBadResumeToken = errors.New("frontend: bad resume token")

// tokenVersion is the first byte of a token: the format below.
const tokenVersion = 2

// resumeKeys signs and checks resume tokens: HMAC-SHA256 under a key of
// the ring over the key id, the request id and an expiry, so a token
// authorises exactly one request for a while, at any frontend that holds
// the key. A token is base64url(version, key id length, key id, expiry
// (8 bytes, Unix seconds), MAC). It signs with the ring's first key and
// accepts any key in it.
type resumeKeys struct {
	mu   sync.RWMutex
	keys []schema.ResumeKey
	// static: the keys came from a configured secret, not from the
	// cluster's ring.
	static bool
	// maxAge caps a token's lifetime, at issue and at check (0: the
	// default).
	maxAge time.Duration
}

// DefaultResumeTokenMaxAge is the longest lifetime a resume token is
// accepted with.
const DefaultResumeTokenMaxAge = 24 * time.Hour

func (k *resumeKeys) maxLifetime() time.Duration {
	if k.maxAge > 0 {
		return k.maxAge
	}
	return DefaultResumeTokenMaxAge
}

// decoyKey stands in for a key id the ring does not hold, so that such a
// token is checked the way a known key's is (one MAC, one comparison):
// the time of a refusal tells nothing about which key ids exist.
var decoyKey = newResumeKey()

// newResumeKeys holds a static key of secret, or (with none) a random
// one until the cluster's ring is loaded.
func newResumeKeys(secret []byte) *resumeKeys {
	if len(secret) == 0 {
		return &resumeKeys{keys: []schema.ResumeKey{newResumeKey()}}
	}
	return &resumeKeys{keys: []schema.ResumeKey{{ID: "static", Secret: secret}}, static: true}
}

// newResumeKey is a fresh random key.
func newResumeKey() schema.ResumeKey {
	secret := make([]byte, 32)
	rand.Read(secret)
	var id [6]byte
	rand.Read(id[:])
	return schema.ResumeKey{ID: hex.EncodeToString(id[:]), Secret: secret, CreatedUnixNano: time.Now().UnixNano()}
}

// set replaces the keys with the ring's.
func (k *resumeKeys) set(ring schema.ResumeKeyRing) {
	k.mu.Lock()
	k.keys = ring.Keys
	k.mu.Unlock()
}

func mac(key schema.ResumeKey, id string, expiry int64) []byte {
	m := hmac.New(sha256.New, key.Secret)
	m.Write([]byte(key.ID))
	m.Write([]byte{0})
	m.Write([]byte(id))
	m.Write([]byte{0})
	m.Write(binary.BigEndian.AppendUint64(nil, uint64(expiry)))
	return m.Sum(nil)
}

// Issue returns a token for request id valid until expiry.
func (k *resumeKeys) Issue(id string, expiry time.Time) string {
	k.mu.RLock()
	key := k.keys[0]
	k.mu.RUnlock()
	e := expiry.Unix()
	b := append([]byte{tokenVersion, byte(len(key.ID))}, key.ID...)
	b = binary.BigEndian.AppendUint64(b, uint64(e))
	return base64.RawURLEncoding.EncodeToString(append(b, mac(key, id, e)...))
}

// Check verifies a token for request id at now.
func (k *resumeKeys) Check(token, id string, now time.Time) error {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimSpace(token))
	if err != nil || len(b) < 2 || b[0] != tokenVersion || len(b) != 2+int(b[1])+8+sha256.Size {
		return fmt.Errorf("%w: malformed", ErrBadResumeToken)
	}
	// The key id's length in int: 2+b[1] in byte arithmetic wraps for
	// lengths of 254 and 255.
	n := 2 + int(b[1])
	keyID := string(b[2:n])
	rest := b[n:]
	e := int64(binary.BigEndian.Uint64(rest[:8]))
	key, known := k.key(keyID)
	if !known {
		key = decoyKey
	}
	// hmac.Equal compares in constant time: no early exit on the first
	// byte that differs.
	good := hmac.Equal(rest[8:], mac(key, id, e))
	switch {
	case !known:
		return fmt.Errorf("%w: signed with an unknown key (rotated out?)", ErrBadResumeToken)
	case !good:
		return fmt.Errorf("%w: not issued for this request", ErrBadResumeToken)
	case now.Unix() > e:
		return fmt.Errorf("%w: expired", ErrBadResumeToken)
	case e > now.Add(k.maxLifetime()).Unix():
		// Signed, but for longer than any token this cluster issues: a
		// key holder cannot mint tokens that outlive the server's cap.
		return fmt.Errorf("%w: expiry beyond the maximum lifetime of %v", ErrBadResumeToken, k.maxLifetime())
	}
	return nil
}

// IssueFor returns the token of a request admitted at now: valid for the
// resume window and an hour (a stream resumed late still ends), within
// the maximum lifetime.
func (k *resumeKeys) IssueFor(id string, now time.Time, window time.Duration) string {
	return k.Issue(id, now.Add(min(window+time.Hour, k.maxLifetime())))
}

func (k *resumeKeys) key(id string) (schema.ResumeKey, bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	for _, key := range k.keys {
		if key.ID == id {
			return key, true
		}
	}
	return schema.ResumeKey{}, false
}

// rotated is ring with a fresh key first and its current key second;
// anything older is dropped.
func rotated(ring schema.ResumeKeyRing) schema.ResumeKeyRing {
	keys := []schema.ResumeKey{newResumeKey()}
	if len(ring.Keys) > 0 {
		keys = append(keys, ring.Keys[0])
	}
	return schema.ResumeKeyRing{Keys: keys}
}
