package frontend

import (
	"crypto/tls"
	"fmt"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// frontendID is the frontend's id. Its certificate must be a frontend's.
// With etcd over mutual TLS, etcd lets the certificate write only its own
// record (schema.FrontendsPrefix + its name): the id defaults to the
// certificate's name, and another id is refused here rather than by
// every write later.
func frontendID(opts Options, conf *tls.Config) (string, error) {
	self, err := pki.Self(conf)
	if err != nil {
		return "", fmt.Errorf("frontend: certs: %w", err)
	}
	if self.Role != pki.RoleFrontend {
		return "", fmt.Errorf("frontend: certs: %s holds the certificate of %s, not a frontend's", opts.CertDir, self)
	}
	switch {
	case !opts.EtcdTLS && opts.ID == "":
		return defaultFrontendID(), nil
	case !opts.EtcdTLS, opts.ID == self.Name:
		return opts.ID, nil
	case opts.ID == "":
		return self.Name, nil
	}
	return "", fmt.Errorf("frontend: --id %q, but the certificate is %s: etcd lets it write %s%s only", opts.ID, self, schema.FrontendsPrefix, self.Name)
}
