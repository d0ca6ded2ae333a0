// Package pki makes and loads the cluster's certificates. One root CA
// lives in a directory of its own (`lifeline certs init`); each component
// gets a directory with the CA certificate and its own certificate and key
// (`lifeline certs issue`), whose common name and URI SAN name its role and
// itself (identity.go). An agent's directory also holds its node's
// intermediate CA, with which the agent signs its workers' certificates.
// Every connection between components is mutual TLS, and each endpoint
// checks the peer's role after the chain (verify.go).
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/lifeline-llm/lifeline/internal/private"
)

// ErrNoCerts means a certificate directory lacks a file.
var ErrNoCerts = errors.New("pki: certificates missing")

// File names. A CA directory holds CAFile and CAKey; a component's
// directory holds CAFile, CertFile and KeyFile, and an agent's also
// NodeCAFile and NodeCAKey.
const (
	CAFile     = "ca.pem"
	CAKey      = "ca-key.pem"
	CertFile   = "cert.pem"
	KeyFile    = "key.pem"
	NodeCAFile = "node-ca.pem"
	NodeCAKey  = "node-ca-key.pem"
)

// Validity of what Issue makes.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	certValidity = 2 * 365 * 24 * time.Hour
)

// Init creates a root CA in caDir (mode 0700, the key 0600) unless one is
// there.
func Init(caDir string) error {
	// A CA directory another user owns or can write into may hold their
	// CA: trusting it hands them every identity, admin included.
	if err := private.Dir(caDir); err != nil {
		return fmt.Errorf("pki: CA directory: %w", err)
	}
	for _, f := range []string{CAKey, CAFile} {
		if err := private.Check(filepath.Join(caDir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("pki: CA: %w", err)
		}
	}
	if _, err := os.Stat(filepath.Join(caDir, CAKey)); err == nil {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := caTemplate("lifeline cluster CA", -1)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := writeKey(caDir, CAKey, key); err != nil {
		return err
	}
	return writePEM(caDir, CAFile, der)
}

// signer is a CA certificate and its key.
type signer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func caTemplate(cn string, maxPathLen int) *x509.Certificate {
	now := time.Now()
	t := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true, IsCA: true,
	}
	if maxPathLen == 0 {
		// A node CA signs leaves only, for servers and clients.
		t.MaxPathLen, t.MaxPathLenZero = 0, true
		t.NotAfter = now.Add(certValidity)
		t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	return t
}

// usage is the extended key usage of a role: admins are clients only;
// every other role serves and dials.
func usage(r Role) []x509.ExtKeyUsage {
	if r == RoleAdmin {
		return []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
}

// Issue writes id's certificate, signed by the root CA in caDir, into dir
// (mode 0700): the CA certificate, the certificate and its key (0600),
// replacing what is there (that is how a certificate is rotated). hosts
// are DNS names or IPs besides localhost and the loopback addresses. An
// agent's directory also gets a fresh intermediate CA for its node; a
// worker's certificate is signed by a throwaway one of its node (workers
// are normally issued by their agent: IssueWorker).
func Issue(caDir, dir string, id Identity, hosts []string) error {
	if err := id.Validate(); err != nil {
		return err
	}
	root, err := loadSigner(filepath.Join(caDir, CAFile), filepath.Join(caDir, CAKey))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := copyFile(filepath.Join(caDir, CAFile), filepath.Join(dir, CAFile)); err != nil {
		return err
	}
	by := root
	switch id.Role {
	case RoleAgent, RoleWorker:
		nodeCA, err := newNodeCA(root, id.Node())
		if err != nil {
			return err
		}
		if id.Role == RoleAgent {
			if err := writeKey(dir, NodeCAKey, nodeCA.key); err != nil {
				return err
			}
			if err := writePEM(dir, NodeCAFile, nodeCA.cert.Raw); err != nil {
				return err
			}
		} else {
			by = nodeCA
		}
	}
	return issueLeaf(by, dir, id, hosts)
}

// IssueWorker writes the certificate of instance's worker into dir,
// signed by the node CA in agentDir (an Issue'd agent directory): a worker
// of the agent's node only.
func IssueWorker(agentDir, dir, instance string) error {
	self, err := DirIdentity(agentDir)
	if err != nil {
		return err
	}
	if self.Role != RoleAgent {
		return fmt.Errorf("%w: %s holds %s, not an agent's certificate", ErrIdentity, agentDir, self)
	}
	id := Worker(self.Node(), instance)
	if err := id.Validate(); err != nil {
		return err
	}
	nodeCA, err := loadSigner(filepath.Join(agentDir, NodeCAFile), filepath.Join(agentDir, NodeCAKey))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := copyFile(filepath.Join(agentDir, CAFile), filepath.Join(dir, CAFile)); err != nil {
		return err
	}
	return issueLeaf(nodeCA, dir, id, nil)
}

func newNodeCA(root signer, node string) (signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return signer{}, err
	}
	der, err := x509.CreateCertificate(rand.Reader, caTemplate(nodeCAName(node), 0), root.cert, &key.PublicKey, root.key)
	if err != nil {
		return signer{}, fmt.Errorf("pki: node CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	return signer{cert, key}, err
}

// issueLeaf writes id's certificate (and its signer's, when that is an
// intermediate) and key into dir.
func issueLeaf(by signer, dir string, id Identity, hosts []string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: id.String()},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(certValidity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage(id.Role),
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		URIs:        []*url.URL{id.uri()},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, by.cert, &key.PublicKey, by.key)
	if err != nil {
		return fmt.Errorf("pki: issue %s: %w", id, err)
	}
	chain := [][]byte{der}
	if by.cert.Subject.CommonName != by.cert.Issuer.CommonName { // an intermediate: send it along
		chain = append(chain, by.cert.Raw)
	}
	if err := writeKey(dir, KeyFile, key); err != nil {
		return err
	}
	return writePEM(dir, CertFile, chain...)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// Load returns a TLS config for both sides of mutual TLS: it presents the
// directory's certificate and verifies peers against the cluster CA only.
// It checks no role: endpoints add that with Accept (verify.go).
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

// Self is the identity of the certificate conf presents.
func Self(conf *tls.Config) (Identity, error) {
	if len(conf.Certificates) == 0 || conf.Certificates[0].Leaf == nil {
		return Identity{}, fmt.Errorf("%w: no certificate loaded", ErrNoCerts)
	}
	return CertIdentity(conf.Certificates[0].Leaf)
}

// DirIdentity is the identity of the certificate in dir.
func DirIdentity(dir string) (Identity, error) {
	conf, err := Load(dir, "")
	if err != nil {
		return Identity{}, err
	}
	return Self(conf)
}

// InitIdentity makes a CA in root/ca (unless there) and issues id from it
// into root/<role>-<name>, returning that directory: a one-machine
// cluster's, a test's or a benchmark's certificates in one call.
func InitIdentity(root string, id Identity) (string, error) {
	ca := filepath.Join(root, "ca")
	if err := Init(ca); err != nil {
		return "", err
	}
	dir := filepath.Join(root, id.DirName())
	return dir, Issue(ca, dir, id, nil)
}
