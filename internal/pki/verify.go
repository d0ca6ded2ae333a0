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
	"path/filepath"
	"strings"
	"time"

	"github.com/quic-go/quic-go"
)

// Peer is a kind of peer an endpoint accepts: a role and, when set, the
// node (agents, workers) and instance (workers) it must name.
type Peer struct {
	Role     Role
	Node     string
	Instance string
}

func (p Peer) String() string {
	s := string(p.Role)
	if p.Instance != "" {
		s += " " + p.Instance
	}
	if p.Node != "" {
		s += " of node " + p.Node
	}
	return s
}

func (p Peer) admits(id Identity) bool {
	return p.Role == id.Role && (p.Node == "" || p.Node == id.Node()) && (p.Instance == "" || p.Instance == id.Instance())
}

// ErrRefused is wrapped by every RefusedError.
var ErrRefused = errors.New("pki: peer refused")

// RefusedError is a verified peer whose identity an endpoint does not
// accept.
type RefusedError struct {
	// Presented is the identity the peer's certificate names (its common
	// name, when that is no identity).
	Presented string
	// Reason says why it is not one (empty when it is an identity).
	Reason   string
	Accepted []Peer
	// Remote: the other end refused this end's certificate (Presented);
	// Err is the error the handshake failed with here.
	Remote bool
	Err    error
}

func (e *RefusedError) Error() string {
	acc := make([]string, len(e.Accepted))
	for i, p := range e.Accepted {
		acc[i] = p.String()
	}
	what := e.Presented
	if e.Reason != "" {
		what += " (" + e.Reason + ")"
	}
	if e.Remote {
		return fmt.Sprintf("pki: the endpoint refused this certificate, %s; it accepts %s (%v)", what, strings.Join(acc, ", "), e.Err)
	}
	return fmt.Sprintf("pki: peer presented %s; this endpoint accepts %s", what, strings.Join(acc, ", "))
}

func (e *RefusedError) Unwrap() []error { return []error{ErrRefused, e.Err} }

// Check is the identity a verified chain proves, or a *RefusedError when
// that is none of peers.
func Check(chain []*x509.Certificate, peers ...Peer) (Identity, error) {
	id, err := ChainIdentity(chain)
	if err != nil {
		cn := "no certificate"
		if len(chain) > 0 {
			cn = chain[0].Subject.CommonName
		}
		return id, &RefusedError{Presented: fmt.Sprintf("%q", cn), Reason: strings.TrimPrefix(err.Error(), ErrIdentity.Error()+": "), Accepted: peers}
	}
	for _, p := range peers {
		if p.admits(id) {
			return id, nil
		}
	}
	return id, &RefusedError{Presented: id.String(), Accepted: peers}
}

// Accept returns a copy of conf that, once the peer's chain is verified,
// refuses a peer (on either side of the handshake) whose identity is none
// of peers: the handshake fails with a *RefusedError, which onRefuse
// (when not nil) hears too.
func Accept(conf *tls.Config, onRefuse func(error), peers ...Peer) *tls.Config {
	c := conf.Clone()
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		var err error = &RefusedError{Presented: "no verified certificate", Accepted: peers}
		for _, chain := range cs.VerifiedChains {
			if _, err = Check(chain, peers...); err == nil {
				return nil
			}
		}
		if onRefuse != nil {
			onRefuse(err)
		}
		return err
	}
	return c
}

// EtcdClientTLS loads dir's certificate for dialing etcd: the server must
// be an etcd member. etcd maps the certificate's common name to its user.
func EtcdClientTLS(dir string) (*tls.Config, error) {
	conf, err := Load(dir, "h2")
	if err != nil {
		return nil, err
	}
	return Accept(conf, nil, Peer{Role: RoleEtcd}), nil
}

// badCertificate is the QUIC error code of a TLS bad_certificate alert
// (0x100 + 42): what an endpoint sends when VerifyConnection refuses the
// peer's role. The alert carries no text; the endpoint logs its reason.
const badCertificate quic.TransportErrorCode = 0x100 + 42

// Explain turns err, when it is the other end's refusal of conf's
// certificate, into a *RefusedError naming the certificate presented and
// the peers that end accepts; any other err is returned as is.
func Explain(err error, conf *tls.Config, accepted ...Peer) error {
	var te *quic.TransportError
	if err == nil || !errors.As(err, &te) || !te.Remote || te.ErrorCode != badCertificate {
		return err
	}
	self, serr := Self(conf)
	presented := self.String()
	if serr != nil {
		presented = "a certificate that names no identity"
	}
	return &RefusedError{Presented: presented, Accepted: accepted, Remote: true, Err: err}
}

// EtcdRootTLS is a client configuration for etcd's root user: a
// certificate for common name "root", signed by the root CA in caDir,
// valid for ttl and held in memory only. It is how the CA's holder — who
// can issue any identity anyway — makes a new admin identity an etcd user
// once auth is on and no admin etcd knows is at hand. etcd is the only
// end that takes it: every lifeline endpoint requires a role:name.
func EtcdRootTLS(caDir string, ttl time.Duration) (*tls.Config, error) {
	root, err := loadSigner(filepath.Join(caDir, CAFile), filepath.Join(caDir, CAKey))
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "root"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(ttl),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root.cert, &key.PublicKey, root.key)
	if err != nil {
		return nil, fmt.Errorf("pki: issue etcd's root: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(root.cert)
	conf := &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		RootCAs:      pool, ServerName: "localhost", MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"},
	}
	return Accept(conf, nil, Peer{Role: RoleEtcd}), nil
}
