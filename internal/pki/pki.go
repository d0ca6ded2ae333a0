// Package pki makes and loads the cluster's certificates: one CA, and for
// each component a certificate signed by it that serves as both server and
// client certificate, so that every connection between components is
// mutually authenticated TLS. `lifeline certs init --dir D` writes them.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// ErrNoCerts means the certificate directory lacks a file.
var ErrNoCerts = errors.New("pki: certificates missing")

// File names inside a certificate directory.
const (
	CAFile   = "ca.pem"
	CAKey    = "ca-key.pem"
	CertFile = "node.pem"
	KeyFile  = "node-key.pem"
)

// Init creates a CA and a node certificate in dir (mode 0700) unless they
// exist. hosts are extra DNS names or IPs for the node certificate;
// localhost and 127.0.0.1 are always included.
func Init(dir string, hosts []string) error {
	if _, err := os.Stat(filepath.Join(dir, CertFile)); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "lifeline cluster CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "lifeline node"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(2, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	write := func(name, typ string, b []byte) error {
		return os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600)
	}
	caKeyDER, _ := x509.MarshalECPrivateKey(caKey)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	for _, f := range []struct {
		name, typ string
		b         []byte
	}{{CAFile, "CERTIFICATE", caDER}, {CAKey, "EC PRIVATE KEY", caKeyDER}, {KeyFile, "EC PRIVATE KEY", keyDER}, {CertFile, "CERTIFICATE", der}} {
		if err := write(f.name, f.typ, f.b); err != nil {
			return fmt.Errorf("pki: write %s: %w", f.name, err)
		}
	}
	return nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// Load returns a TLS config for both sides of mutual TLS: it presents the
// node certificate and verifies peers against the cluster CA only.
func Load(dir string, nextProto string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoCerts, err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoCerts, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%w: %s holds no certificate", ErrNoCerts, CAFile)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ServerName:   "localhost",
		NextProtos:   []string{nextProto},
		MinVersion:   tls.VersionTLS13,
	}, nil
}
