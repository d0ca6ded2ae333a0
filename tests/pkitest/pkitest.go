// Package pkitest issues a test cluster's certificates by identity and
// runs real QUIC handshakes against an endpoint's TLS configuration, for
// tests of role checks.
package pkitest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/internal/pki"
)

// Certs is one cluster CA and the certificate directories issued from it.
type Certs struct {
	root string
	mu   sync.Mutex
	dirs map[pki.Identity]string
}

// New makes a fresh CA.
func New(t testing.TB) *Certs {
	t.Helper()
	root := t.TempDir()
	if err := pki.Init(filepath.Join(root, "ca")); err != nil {
		t.Fatal(err)
	}
	return &Certs{root: root, dirs: map[pki.Identity]string{}}
}

// Dir is id's certificate directory, issued on first use; a worker's is
// signed by its node's agent (whose directory is issued too).
func (c *Certs) Dir(t testing.TB, id pki.Identity) string {
	t.Helper()
	if id.Role == pki.RoleWorker {
		agent := c.Dir(t, pki.Agent(id.Node()))
		c.mu.Lock()
		defer c.mu.Unlock()
		if d, ok := c.dirs[id]; ok {
			return d
		}
		d := filepath.Join(c.root, id.DirName())
		if err := pki.IssueWorker(agent, d, id.Instance()); err != nil {
			t.Fatal(err)
		}
		c.dirs[id] = d
		return d
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.dirs[id]; ok {
		return d
	}
	d := filepath.Join(c.root, id.DirName())
	if err := pki.Issue(filepath.Join(c.root, "ca"), d, id, nil); err != nil {
		t.Fatal(err)
	}
	c.dirs[id] = d
	return d
}

// Serve runs a QUIC endpoint with conf on loopback until the test ends;
// accepted receives the identity of each peer it accepted.
func Serve(t testing.TB, conf *tls.Config) (addr string, accepted <-chan pki.Identity) {
	t.Helper()
	ln, err := quic.ListenAddr("127.0.0.1:0", conf, &quic.Config{HandshakeIdleTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan pki.Identity, 16)
	go func() {
		for {
			c, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			id, _ := pki.ChainIdentity(c.ConnectionState().TLS.VerifiedChains[0])
			ch <- id
		}
	}()
	return ln.Addr().String(), ch
}

// Handshake dials addr with conf and returns nil once the endpoint
// accepted the connection, or the error that ended it: the dial's, or
// the one the endpoint closed it with.
func Handshake(addr string, conf *tls.Config, accepted <-chan pki.Identity) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := quic.DialAddr(ctx, addr, conf, &quic.Config{HandshakeIdleTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer c.CloseWithError(0, "")
	select {
	case <-accepted:
		return nil
	case <-c.Context().Done():
		return context.Cause(c.Context())
	case <-ctx.Done():
		return errors.New("pkitest: neither accepted nor closed within 10s")
	}
}

// Refused reports whether err is a refusal of a handshake, not a timeout.
func Refused(err error) bool {
	var te *quic.TransportError
	return errors.As(err, &te) || errors.Is(err, pki.ErrRefused)
}

// Describe is err for test messages.
func Describe(err error) string { return fmt.Sprintf("%T: %v", err, err) }
