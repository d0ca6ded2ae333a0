package agent

import (
	"crypto/tls"
	"fmt"
	"path/filepath"

	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// agentTLS loads the certificate the agent dials its workers with: it
// must be this node's agent certificate (its directory also holds the
// node CA that signs the workers' certificates).
func agentTLS(opts Options) (*tls.Config, error) {
	conf, err := workerclient.ClientTLS(opts.CertDir)
	if err != nil {
		return nil, fmt.Errorf("agent: certs: %w", err)
	}
	self, err := pki.Self(conf)
	if err != nil {
		return nil, fmt.Errorf("agent: certs: %w", err)
	}
	if self != pki.Agent(opts.NodeID) {
		return nil, fmt.Errorf("agent: certs: %s holds the certificate of %s, want %s", opts.CertDir, self, pki.Agent(opts.NodeID))
	}
	return conf, nil
}

// workerCertDir is where the certificate of instance's worker lives: the
// worker gets this directory, never the agent's (which holds the node CA's
// key).
func (a *Agent) workerCertDir(instance string) string {
	return filepath.Join(a.opts.DataDir, "workers", instance)
}

// issueWorkerCert signs a fresh certificate for instance's worker with the
// node CA: a new key per start, naming the node and the instance.
func (a *Agent) issueWorkerCert(instance string) error {
	if err := pki.IssueWorker(a.opts.CertDir, a.workerCertDir(instance), instance); err != nil {
		return fmt.Errorf("agent: certificate of worker %s: %w", instance, err)
	}
	return nil
}
