package worker

import (
	"crypto/tls"
	"fmt"

	"github.com/lifeline-llm/lifeline/decode/workerclient"
)

// serverTLS is the endpoint's mutual TLS: the certificate must be this
// instance's worker certificate, and peers frontends or this node's agent
// (workerclient.ServerTLS). A refused peer is logged: it named a role
// this endpoint does not serve.
func serverTLS(opts Options) (*tls.Config, error) {
	conf, self, err := workerclient.ServerTLS(opts.CertDir, func(err error) {
		opts.Log.Warn("refused a connection", "err", err)
	})
	if err != nil {
		return nil, fmt.Errorf("worker: certs: %w", err)
	}
	if self.Instance() != opts.InstanceID {
		return nil, fmt.Errorf("worker: certs: %s holds the certificate of %s, not of instance %s", opts.CertDir, self, opts.InstanceID)
	}
	return conf, nil
}
