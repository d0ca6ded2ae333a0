package embedetcd

import (
	"fmt"
	"path/filepath"
	"slices"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/lifeline-llm/lifeline/internal/pki"
)

// lockDown serves both of cfg's ports with the etcd identity in certDir:
// clients need a certificate of the cluster CA; the peer port (lease
// renewals, membership: state-changing without etcd auth) needs the
// certificate of an etcd member, this one's common name only, since this
// member has no peers.
func lockDown(cfg *embed.Config, certDir string, members []string) error {
	self, err := pki.DirIdentity(certDir)
	if err != nil {
		return fmt.Errorf("embedetcd: %w", err)
	}
	if self.Role != pki.RoleEtcd {
		return fmt.Errorf("embedetcd: %s holds the certificate of %s, not an etcd member's", certDir, self)
	}
	info := transport.TLSInfo{
		CertFile: filepath.Join(certDir, pki.CertFile), KeyFile: filepath.Join(certDir, pki.KeyFile),
		TrustedCAFile: filepath.Join(certDir, pki.CAFile), ClientCertAuth: true,
	}
	cfg.ClientTLSInfo = info
	// The peer port takes the members' certificates only: this one's,
	// and those of the members the initial cluster names (one host's
	// certificate each on separate machines).
	info.AllowedCNs = []string{self.String()}
	for _, m := range members {
		if cn := pki.Etcd(m).String(); !slices.Contains(info.AllowedCNs, cn) {
			info.AllowedCNs = append(info.AllowedCNs, cn)
		}
	}
	cfg.PeerTLSInfo = info
	return nil
}

// PeerEndpoint is the member's peer URL.
func (s *Server) PeerEndpoint() string { return s.peer }
