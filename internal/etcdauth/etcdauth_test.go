package etcdauth

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/embedetcd"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/tests/pkitest"
)

// cluster is a locked-down embedded etcd with users for agents n1 and n2
// and frontends f1 and f2.
type cluster struct {
	etcd  *embedetcd.Server
	certs *pkitest.Certs
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	certs := pkitest.New(t)
	e, err := embedetcd.Start(t.TempDir(), 0, certs.Dir(t, pki.Etcd("e")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	c := &cluster{etcd: e, certs: certs}
	admin := c.client(t, pki.Admin("ops"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Setup(ctx, admin, pki.Admin("ops"), pki.Agent("n1"), pki.Agent("n2"), pki.Frontend("f1"), pki.Frontend("f2")); err != nil {
		t.Fatal(err)
	}
	if err := Setup(ctx, admin, pki.Admin("ops"), pki.Agent("n1")); err != nil {
		t.Fatalf("a second setup: %v", err)
	}
	return c
}

func (c *cluster) client(t *testing.T, id pki.Identity) *clientv3.Client {
	t.Helper()
	conf, err := pki.EtcdClientTLS(c.certs.Dir(t, id))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.etcd.Endpoint}, DialTimeout: 5 * time.Second, TLS: conf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func denied(err error) bool { return errors.Is(err, rpctypes.ErrPermissionDenied) }

// TestAgentWritesOnlyItsNode: an agent writes its node's keys (node
// record, budget share, its instances' registrations, generations and
// failures) and none of another node's; it cannot delete another node's
// registration, nor renew or revoke the lease that holds it; it reads
// what it must (registrations, frontends' records, the budget) and no
// request record.
func TestAgentWritesOnlyItsNode(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	n1, n2 := c.client(t, pki.Agent("n1")), c.client(t, pki.Agent("n2"))
	lease, err := n1.Grant(ctx(t), 30)
	if err != nil {
		t.Fatal(err)
	}
	reg := schema.InstancesPrefix + "n1-decode-tiny-0"
	for _, k := range []string{reg, schema.NodesPrefix + "n1", schema.DrainHoldersPrefix + "n1", schema.GenerationsPrefix + "n1-prefill-tiny-3",
		schema.FailuresPrefix + "n1-both-tiny-0"} {
		if _, err := n1.Put(ctx(t), k, "v", clientv3.WithLease(lease.ID)); err != nil {
			t.Fatalf("n1 put %s: %v", k, err)
		}
	}
	for _, k := range []string{reg, schema.InstancesPrefix + "n1-x", schema.NodesPrefix + "n1", schema.DrainHoldersPrefix + "n1", schema.GenerationsPrefix + "n1-decode-tiny-0",
		schema.FailuresPrefix + "n1-decode-tiny-0", schema.MaxUnavailableKey, schema.RequestsPrefix + "r", schema.FrontendsPrefix + "f1", schema.ResumeKeysKey} {
		if _, err := n2.Put(ctx(t), k, "v"); !denied(err) {
			t.Errorf("n2 put %s: %v", k, err)
		}
	}
	if _, err := n2.Delete(ctx(t), reg); !denied(err) {
		t.Errorf("n2 deleted n1's registration: %v", err)
	}
	if _, err := n2.Delete(ctx(t), schema.InstancesPrefix, clientv3.WithPrefix()); !denied(err) {
		t.Errorf("n2 deleted every registration: %v", err)
	}
	if _, err := n2.Txn(ctx(t)).Then(clientv3.OpDelete(reg)).Commit(); !denied(err) {
		t.Errorf("n2 deleted n1's registration in a transaction: %v", err)
	}
	if _, err := n2.KeepAliveOnce(ctx(t), lease.ID); !denied(err) {
		t.Errorf("n2 renewed n1's lease: %v", err)
	}
	if _, err := n2.Revoke(ctx(t), lease.ID); !denied(err) {
		t.Errorf("n2 revoked n1's lease: %v", err)
	}
	if _, err := n1.KeepAliveOnce(ctx(t), lease.ID); err != nil {
		t.Errorf("n1 renewing its lease: %v", err)
	}
	for _, k := range []string{schema.InstancesPrefix, schema.FrontendsPrefix, "/lifeline/v1/drain/"} {
		if _, err := n2.Get(ctx(t), k, clientv3.WithPrefix()); err != nil {
			t.Errorf("n2 read %s: %v", k, err)
		}
	}
	if _, err := n2.Get(ctx(t), schema.RequestsPrefix, clientv3.WithPrefix()); !denied(err) {
		t.Errorf("n2 read request records: %v", err)
	}
	if _, err := n1.Delete(ctx(t), reg); err != nil {
		t.Errorf("n1 deleting its registration: %v", err)
	}
}

// TestFrontendWritesOnlyRecords: a frontend writes request records, the
// resume key ring and its own record; it cannot write or delete a
// registration, a generation, a failure or another frontend's record,
// nor renew an agent's lease.
func TestFrontendWritesOnlyRecords(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	n1, f1 := c.client(t, pki.Agent("n1")), c.client(t, pki.Frontend("f1"))
	lease, err := n1.Grant(ctx(t), 30)
	if err != nil {
		t.Fatal(err)
	}
	reg := schema.InstancesPrefix + "n1-decode-tiny-0"
	if _, err := n1.Put(ctx(t), reg, "v", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{schema.RequestsPrefix + "r1", schema.RequestsPrefix + "r1.0", schema.ResumeKeysKey, schema.FrontendsPrefix + "f1"} {
		if _, err := f1.Put(ctx(t), k, "v"); err != nil {
			t.Errorf("f1 put %s: %v", k, err)
		}
	}
	for _, k := range []string{reg, schema.InstancesPrefix + "f1-decode-x", schema.GenerationsPrefix + "n1-decode-tiny-0", schema.FailuresPrefix + "n1-decode-tiny-0",
		schema.NodesPrefix + "n1", schema.FrontendsPrefix + "f2", schema.MaxUnavailableKey, schema.DrainHoldersPrefix + "n1"} {
		if _, err := f1.Put(ctx(t), k, "v"); !denied(err) {
			t.Errorf("f1 put %s: %v", k, err)
		}
	}
	if _, err := f1.Delete(ctx(t), reg); !denied(err) {
		t.Errorf("f1 deleted a registration: %v", err)
	}
	if _, err := f1.KeepAliveOnce(ctx(t), lease.ID); !denied(err) {
		t.Errorf("f1 renewed an agent's lease: %v", err)
	}
	for _, k := range []string{schema.InstancesPrefix, schema.FailuresPrefix, schema.NodesPrefix, schema.RequestsPrefix, schema.FrontendsPrefix} {
		if _, err := f1.Get(ctx(t), k, clientv3.WithPrefix()); err != nil {
			t.Errorf("f1 read %s: %v", k, err)
		}
	}
}

// TestLeasesNeedACertificate: without a certificate nothing reaches etcd:
// not the client port (no lease renewal, no read), not the peer port (the
// HTTP lease renewal there that any local user could send before). The
// peer port takes the etcd member's certificate only: another cluster
// certificate is refused too, while etcd's own renews (the request is
// well-formed).
func TestLeasesNeedACertificate(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	n1 := c.client(t, pki.Agent("n1"))
	lease, err := n1.Grant(ctx(t), 30)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n1.Put(ctx(t), schema.NodesPrefix+"n1", "v", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	bare, err := clientv3.New(clientv3.Config{Endpoints: []string{c.etcd.Endpoint}, DialTimeout: 2 * time.Second,
		TLS: &tls.Config{InsecureSkipVerify: true}})
	if err == nil {
		// Its handshakes fail and the client retries them until the
		// deadline: 2 s is ample for a renewal a certificate allows.
		kctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = bare.KeepAliveOnce(kctx, lease.ID)
		cancel()
		bare.Close()
	}
	if err == nil {
		t.Fatal("a client without a certificate renewed a lease on the client port")
	}
	renew := func(conf *tls.Config) error {
		body, _ := proto.Marshal(&pb.LeaseKeepAliveRequest{ID: int64(lease.ID)})
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: conf}}
		defer hc.CloseIdleConnections()
		for _, u := range []string{c.etcd.PeerEndpoint(), strings.Replace(c.etcd.PeerEndpoint(), "https:", "http:", 1)} {
			resp, err := hc.Post(u+"/leases", "application/protobuf", bytes.NewReader(body))
			if err != nil {
				continue
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		return errors.New("refused")
	}
	if !strings.HasPrefix(c.etcd.PeerEndpoint(), "https://") {
		t.Fatalf("peer endpoint %s is not TLS", c.etcd.PeerEndpoint())
	}
	if renew(&tls.Config{InsecureSkipVerify: true}) == nil {
		t.Error("a client without a certificate renewed a lease on the peer port")
	}
	agentConf, _ := pki.Load(c.certs.Dir(t, pki.Agent("n1")), "http/1.1")
	if renew(agentConf) == nil {
		t.Error("an agent's certificate renewed a lease on the peer port")
	}
	etcdConf, _ := pki.Load(c.certs.Dir(t, pki.Etcd("e")), "http/1.1")
	if err := renew(etcdConf); err != nil {
		t.Errorf("the etcd member's certificate on the peer port: %v (the test's request is not a renewal)", err)
	}
}
