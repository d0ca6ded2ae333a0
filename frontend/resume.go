package frontend

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrBadResumeToken is wrapped by every resume token rejection.
var ErrBadResumeToken = errors.New("frontend: bad resume token")

// resumeKeys signs and checks resume tokens: HMAC-SHA256 over the request
// id and an expiry, so a token authorises exactly one request for a while.
type resumeKeys struct{ secret []byte }

func newResumeKeys(secret []byte) resumeKeys {
	if len(secret) == 0 {
		secret = make([]byte, 32)
		rand.Read(secret)
	}
	return resumeKeys{secret: secret}
}

func (k resumeKeys) mac(id string, expiry int64) []byte {
	m := hmac.New(sha256.New, k.secret)
	m.Write([]byte(id))
	m.Write([]byte{0})
	m.Write(binary.BigEndian.AppendUint64(nil, uint64(expiry)))
	return m.Sum(nil)
}

// Issue returns a token for request id valid until expiry.
func (k resumeKeys) Issue(id string, expiry time.Time) string {
	e := expiry.Unix()
	payload := binary.BigEndian.AppendUint64(nil, uint64(e))
	return base64.RawURLEncoding.EncodeToString(append(payload, k.mac(id, e)...))
}

// Check verifies a token for request id at now.
func (k resumeKeys) Check(token, id string, now time.Time) error {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimSpace(token))
	if err != nil || len(b) != 8+sha256.Size {
		return fmt.Errorf("%w: malformed", ErrBadResumeToken)
	}
	e := int64(binary.BigEndian.Uint64(b[:8]))
	if !hmac.Equal(b[8:], k.mac(id, e)) {
		return fmt.Errorf("%w: not issued for this request", ErrBadResumeToken)
	}
	if now.Unix() > e {
		return fmt.Errorf("%w: expired", ErrBadResumeToken)
	}
	return nil
}
