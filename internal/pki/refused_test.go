package pki

import (
	"crypto/tls"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestCertRefused: a TLS session that cannot be had is told at once, on
// either side's refusal: the server's alert for a client certificate
// from another CA (TLS 1.3 sends it after this side's handshake is done,
// so only a read sees it), or this side's own refusal of the server's
// certificate. A session both sides accept is no refusal.
func TestCertRefused(t *testing.T) {
	t.Parallel()
	issue := func(ca string, id Identity) *tls.Config {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "id")
		if err := Issue(ca, dir, id, []string{"localhost", "127.0.0.1"}); err != nil {
			t.Fatal(err)
		}
		conf, err := Load(dir, "h2")
		if err != nil {
			t.Fatal(err)
		}
		return conf
	}
	newCA := func() string {
		t.Helper()
		ca := filepath.Join(t.TempDir(), "ca")
		if err := Init(ca); err != nil {
			t.Fatal(err)
		}
		return ca
	}
	ours, theirs := newCA(), newCA()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", issue(ours, Etcd("e")))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				// Answer the preface as an HTTP/2 server does.
				var b [len(h2Preface)]byte
				if _, err := c.Read(b[:]); err == nil {
					c.Write([]byte{0})
				}
			})
		}
	})
	addr := ln.Addr().String()
	good := issue(ours, Admin("ops"))
	stranger := issue(theirs, Admin("ops"))
	strangerTrustingUs := stranger.Clone()
	strangerTrustingUs.RootCAs = good.RootCAs
	for _, c := range []struct {
		name    string
		conf    *tls.Config
		refused bool
	}{
		{"our CA's certificate", good, false},
		{"another CA's certificate (the server refuses it)", strangerTrustingUs, true},
		{"trusting another CA (we refuse the server)", stranger, true},
	} {
		start := time.Now()
		err := CertRefused(addr, c.conf, 5*time.Second)
		if (err != nil) != c.refused || time.Since(start) > 3*time.Second {
			t.Errorf("%s: %v after %v", c.name, err, time.Since(start))
		}
		t.Logf("%s: %v", c.name, err)
	}
	if err := CertRefused("127.0.0.1:1", good, time.Second); err != nil {
		t.Errorf("nobody listening is no refusal: %v", err)
	}
}
