package transferclient

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
	"github.com/lifeline-llm/lifeline/tests/pkitest"
)

// TestTransferEndpointRoleChecks: an agent's transfer endpoint accepts
// agents, frontends and its own node's workers only; workers of another
// node, etcd and admin certificates are refused with an error naming the
// certificate and the accepted roles, which the agent hears too. Clients
// refuse a server that is not an agent.
func TestTransferEndpointRoleChecks(t *testing.T) {
	certs := pkitest.New(t)
	var (
		mu       sync.Mutex
		refusals []string
	)
	conf, err := ServerTLS(certs.Dir(t, pki.Agent("n1")), func(err error) {
		mu.Lock()
		defer mu.Unlock()
		refusals = append(refusals, err.Error())
	})
	if err != nil {
		t.Fatal(err)
	}
	addr, accepted := pkitest.Serve(t, conf)
	// Each client asks for a pull as the frontend and workers do.
	pull := func(id pki.Identity) error {
		c, err := TLS(certs.Dir(t, id))
		if err != nil {
			t.Fatal(err)
		}
		d := NewDialer(c)
		defer d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := d.Pull(ctx, addr, &transferpb.Pull{}); done <- err }()
		select {
		case <-accepted:
			return nil
		case err := <-done:
			return err
		}
	}
	for _, id := range []pki.Identity{pki.Agent("n1"), pki.Agent("n2"), pki.Frontend("f1"), pki.Worker("n1", "n1-decode-tiny-0")} {
		if err := pull(id); err != nil {
			t.Errorf("%s refused: %v", id, err)
		}
	}
	for _, id := range []pki.Identity{pki.Worker("n2", "n2-decode-tiny-0"), pki.Etcd("e"), pki.Admin("a")} {
		err := pull(id)
		if !errors.Is(err, pki.ErrRefused) || !strings.Contains(err.Error(), "refused this certificate, "+id.String()+"; it accepts agent, frontend, worker") {
			t.Errorf("%s: %s", id, pkitest.Describe(err))
		}
	}
	mu.Lock()
	if len(refusals) != 3 || !strings.Contains(refusals[0], "peer presented worker:n2/n2-decode-tiny-0; this endpoint accepts agent, frontend, worker of node n1") {
		t.Errorf("the agent heard %d refusals: %v", len(refusals), refusals)
	}
	mu.Unlock()
	// A client dialing a transfer endpoint expects an agent.
	for _, server := range []pki.Identity{pki.Frontend("f2"), pki.Worker("n1", "n1-decode-tiny-0"), pki.Etcd("e")} {
		sconf, err := pki.Load(certs.Dir(t, server), ALPN) // accepts anyone: only the client's check can refuse
		if err != nil {
			t.Fatal(err)
		}
		saddr, sacc := pkitest.Serve(t, sconf)
		c, _ := TLS(certs.Dir(t, pki.Frontend("f1")))
		err = pkitest.Handshake(saddr, c, sacc)
		if err == nil || !strings.Contains(err.Error(), "peer presented "+server.String()+"; this endpoint accepts agent") {
			t.Errorf("server %s: %s", server, pkitest.Describe(err))
		}
	}
}
