package e2e

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/rdma/transferclient"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestAgentEndpointsRefuseWrongRoles: against a real agent and the worker
// it started (with a certificate its node CA signed), another node's
// agent is refused by the worker and another node's worker by the
// agent's transfer endpoint, each with an error naming the certificate
// and the roles accepted, and each refusal is logged; a frontend's
// certificate is served by both. The agent's etcd user cannot write
// another node's registration.
func TestAgentEndpointsRefuseWrongRoles(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t)
	const id = "n1-decode-tiny-0"
	reg := n.WaitRegistration(t, id, 0)
	otherAgent, err := n.Env.Identity(pki.Agent("n2"))
	if err != nil {
		t.Fatal(err)
	}
	otherWorker := filepath.Join(t.TempDir(), "w")
	if err := pki.IssueWorker(otherAgent, otherWorker, "n2-decode-tiny-0"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	health := func(certs string) error {
		conf, err := workerclient.ClientTLS(certs)
		if err != nil {
			t.Fatal(err)
		}
		c, err := workerclient.Dial(ctx, reg.Addr, conf, id, reg.Generation)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Health(ctx)
		return err
	}
	if err := health(n.Env.Certs); err != nil {
		t.Fatalf("a frontend's certificate at the worker: %v", err)
	}
	err = health(otherAgent)
	if !errors.Is(err, pki.ErrRefused) || !strings.Contains(err.Error(), "refused this certificate, agent:n2; it accepts frontend, agent of node n1") {
		t.Fatalf("agent n2 at n1's worker: %v", err)
	}
	pull := func(certs string) error {
		conf, err := transferclient.TLS(certs)
		if err != nil {
			t.Fatal(err)
		}
		d := transferclient.NewDialer(conf)
		defer d.Close()
		_, err = d.Pull(ctx, reg.KVAddr, &transferpb.Pull{Binding: &transferpb.Binding{RequestId: "roles"}})
		return err
	}
	if err := pull(n.Env.Certs); errors.Is(err, pki.ErrRefused) {
		t.Fatalf("a frontend's certificate at the transfer endpoint: %v", err)
	}
	err = pull(otherWorker)
	if !errors.Is(err, pki.ErrRefused) || !strings.Contains(err.Error(), "refused this certificate, worker:n2/n2-decode-tiny-0") {
		t.Fatalf("n2's worker at n1's transfer endpoint: %v", err)
	}
	proctest.WaitFor(t, 10*time.Second, "both refusals logged", func() (bool, string) {
		log := n.Log.String()
		refused := `"msg":"refused a connection","instance_id":"` + id + `"`
		return strings.Contains(log, refused) &&
			strings.Contains(log, "pki: peer presented agent:n2; this endpoint accepts frontend, agent of node n1") &&
			strings.Contains(log, "peer presented worker:n2/n2-decode-tiny-0; this endpoint accepts agent, frontend, worker of node n1"), log
	})
	// etcd: n1's agent certificate cannot touch n2's keys.
	conf, err := pki.EtcdClientTLS(n.Options.CertDir)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{n.Env.Etcd.Endpoint}, DialTimeout: 5 * time.Second, TLS: conf})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, schema.InstancesPrefix+"n2-decode-tiny-0", "{}"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("n1's agent wrote n2's registration: %v", err)
	}
}
