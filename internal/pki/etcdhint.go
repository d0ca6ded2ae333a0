package pki

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// EtcdHint turns an etcd client's error at a process's start into one
// that says what to do: an identity without an etcd user or role names
// the `lifeline certs etcd-setup` command that adds it; a certificate
// chain from another CA names both CAs; an etcd that does not answer
// names the endpoints tried. permanent says retrying cannot help (the
// first two). Any other error is returned as it is, not permanent.
func EtcdHint(err error, endpoints []string, certDir string, id Identity) (hint error, permanent bool) {
	if err == nil {
		return nil, false
	}
	msg := err.Error()
	eps := strings.Join(endpoints, ",")
	if certDir != "" && len(endpoints) > 0 && !strings.Contains(msg, "certificate signed by unknown authority") &&
		(errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "deadline exceeded") || strings.Contains(msg, "Unavailable")) {
		// gRPC retries a failed handshake until the deadline and reports
		// only that: try one handshake here to see why.
		if conf, cerr := EtcdClientTLS(certDir); cerr == nil {
			if herr := CertRefused(endpoints[0], conf, 2*time.Second); herr != nil && strings.Contains(herr.Error(), "unknown authority") {
				err, msg = herr, herr.Error()
			}
		}
	}
	switch {
	case strings.Contains(msg, "permission denied") || strings.Contains(msg, "user name not found") || strings.Contains(msg, "authentication failed"):
		flag := "--frontend " + id.Name
		if id.Role == RoleAgent {
			flag = "--node " + id.Name
		}
		return fmt.Errorf("etcd at %s refused %s (%v): its etcd user and role are missing or wrong; as an admin run: lifeline certs etcd-setup --etcd %s --certs ADMIN_CERT_DIR %s",
			eps, id, err, eps, flag), true
	case strings.Contains(msg, "certificate signed by unknown authority"):
		ours := caName(filepath.Join(certDir, CAFile))
		theirs := "unknown"
		if len(endpoints) > 0 {
			theirs = peerIssuer(endpoints[0])
		}
		return fmt.Errorf("etcd at %s presents a certificate issued by %s, but %s trusts only %s (%s): issue this identity from the CA etcd's certificates come from (lifeline certs issue)",
			eps, theirs, certDir, ours, err), true
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "context deadline exceeded") || strings.Contains(msg, "connection refused") || strings.Contains(msg, "Unavailable"):
		return fmt.Errorf("etcd does not answer at %s (%v): check the endpoints, that etcd runs, and that this host reaches it", eps, err), false
	}
	return err, false
}

// caName names the CA certificate in file: its subject and fingerprint.
func caName(file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Sprintf("the CA in %s (unreadable: %v)", file, err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return fmt.Sprintf("the CA in %s (not PEM)", file)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return fmt.Sprintf("the CA in %s (%v)", file, err)
	}
	return certName(c)
}

func certName(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return fmt.Sprintf("%q (sha256 %x…)", c.Subject.CommonName, sum[:8])
}

// peerIssuer names the issuer of the certificate addr presents (read
// without verifying it: only to name it).
func peerIssuer(addr string) string {
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) // naming it, not trusting it
	if err != nil {
		return fmt.Sprintf("an unknown CA (%v)", err)
	}
	defer conn.Close()
	chain := conn.ConnectionState().PeerCertificates
	if len(chain) == 0 {
		return "an unknown CA (no certificate)"
	}
	last := chain[len(chain)-1]
	if len(chain) > 1 && last.IsCA {
		return certName(last)
	}
	return fmt.Sprintf("%q", last.Issuer.CommonName)
}

// CheckDir says why dir does not hold a usable certificate of id (nil
// when it does): files missing, a certificate its directory's CA did not
// sign or that has expired, or one of another identity.
func CheckDir(dir string, id Identity) error {
	conf, err := Load(dir, "")
	if err != nil {
		return fmt.Errorf("certificates %s: %w (issue them: lifeline certs issue --role %s --name %s)", dir, err, id.Role, id.Name)
	}
	leaf, err := x509.ParseCertificate(conf.Certificates[0].Certificate[0])
	if err != nil {
		return fmt.Errorf("certificates %s: %w", dir, err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: conf.RootCAs, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("certificates %s: %s is not signed by %s, or has expired: %w", dir, CertFile, caName(filepath.Join(dir, CAFile)), err)
	}
	got, err := CertIdentity(leaf)
	if err != nil {
		return fmt.Errorf("certificates %s: %w", dir, err)
	}
	if got != id {
		return fmt.Errorf("certificates %s are %s's, not %s's", dir, got, id)
	}
	return nil
}

// h2Preface is an HTTP/2 client's connection preface and an empty
// SETTINGS frame: what makes etcd's listener answer at once.
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"

// CertRefused reports, within timeout, whether a TLS session with the
// server at addr as conf is impossible: the server refuses conf's client
// certificate (its alert: a certificate from a CA it does not trust), or
// conf does not trust the server's (another CA), which gRPC would only
// retry until its deadline. nil when both sides accept, or when it
// cannot tell (no answer, no connection): the caller's own call says
// why then.
func CertRefused(addr string, conf *tls.Config, timeout time.Duration) error {
	conf = conf.Clone()
	conf.NextProtos = []string{"h2"}
	d := &net.Dialer{Timeout: timeout}
	conn, err := tls.DialWithDialer(d, "tcp", addr, conf)
	if err != nil {
		return refusal(err)
	}
	defer conn.Close()
	// With TLS 1.3 the server checks the client's certificate after the
	// handshake has completed on this side: its alert comes with the
	// first read.
	conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte(h2Preface)); err != nil {
		return refusal(err)
	}
	var b [1]byte
	_, err = conn.Read(b[:])
	return refusal(err)
}

// refusal is err if it is the peer's TLS alert or a certificate this
// side did not verify, else nil.
func refusal(err error) error {
	if _, unverified := errors.AsType[*tls.CertificateVerificationError](err); unverified {
		return err
	}
	if err != nil && strings.Contains(err.Error(), "remote error: tls:") {
		return err
	}
	return nil
}
