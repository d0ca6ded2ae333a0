package pki

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func mode(t *testing.T, p string) os.FileMode {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

func files(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func leaf(t testing.TB, dir string) (*x509.Certificate, []*x509.Certificate) {
	t.Helper()
	conf, err := Load(dir, "x")
	if err != nil {
		t.Fatal(err)
	}
	var chain []*x509.Certificate
	for _, der := range conf.Certificates[0].Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		chain = append(chain, c)
	}
	return conf.Certificates[0].Leaf, chain
}

// verify checks dir's certificate chain against the CA as a peer would.
func verify(t *testing.T, dir string, usage x509.ExtKeyUsage) ([]*x509.Certificate, error) {
	t.Helper()
	conf, err := Load(dir, "x")
	if err != nil {
		t.Fatal(err)
	}
	l, chain := leaf(t, dir)
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	chains, err := l.Verify(x509.VerifyOptions{Roots: conf.RootCAs, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return nil, err
	}
	return chains[0], nil
}

// TestIssueLayout: the CA directory is 0700 with its key 0600; each
// component's directory holds the CA certificate and its own certificate
// and key only (an agent's also its node CA), keys 0600, and never the
// root key.
func TestIssueLayout(t *testing.T) {
	root := t.TempDir()
	ca := filepath.Join(root, "ca")
	if err := Init(ca); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, ca); m != 0o700 {
		t.Fatalf("CA directory mode %o", m)
	}
	if m := mode(t, filepath.Join(ca, CAKey)); m != 0o600 {
		t.Fatalf("CA key mode %o", m)
	}
	for _, tc := range []struct {
		id   Identity
		want []string
	}{
		{Agent("node-0"), []string{CAFile, CertFile, KeyFile, NodeCAFile, NodeCAKey}},
		{Frontend("frontend-0"), []string{CAFile, CertFile, KeyFile}},
		{Worker("node-0", "node-0-decode-tiny-0"), []string{CAFile, CertFile, KeyFile}},
		{Etcd("e0"), []string{CAFile, CertFile, KeyFile}},
		{Admin("ops"), []string{CAFile, CertFile, KeyFile}},
	} {
		dir := filepath.Join(root, tc.id.DirName())
		if err := Issue(ca, dir, tc.id, []string{"node0.example", "10.0.0.7"}); err != nil {
			t.Fatalf("%s: %v", tc.id, err)
		}
		got := files(t, dir)
		slices.Sort(got)
		slices.Sort(tc.want)
		if !slices.Equal(got, tc.want) {
			t.Fatalf("%s: files %v, want %v", tc.id, got, tc.want)
		}
		for _, f := range got {
			if m := mode(t, filepath.Join(dir, f)); m != 0o600 {
				t.Fatalf("%s: %s mode %o", tc.id, f, m)
			}
		}
		if m := mode(t, dir); m != 0o700 {
			t.Fatalf("%s: directory mode %o", tc.id, m)
		}
		l, _ := leaf(t, dir)
		if l.Subject.CommonName != tc.id.String() || len(l.URIs) != 1 || l.URIs[0].String() != "lifeline://"+string(tc.id.Role)+"/"+tc.id.Name {
			t.Fatalf("%s: CN %q URIs %v", tc.id, l.Subject.CommonName, l.URIs)
		}
		if !slices.Contains(l.DNSNames, "node0.example") || !slices.Contains(l.DNSNames, "localhost") || len(l.IPAddresses) != 3 {
			t.Fatalf("%s: SANs %v %v", tc.id, l.DNSNames, l.IPAddresses)
		}
		got1, err := DirIdentity(dir)
		if err != nil || got1 != tc.id {
			t.Fatalf("DirIdentity = %v, %v; want %v", got1, err, tc.id)
		}
	}
}

// TestKeyUsagePerRole: servers and clients get serverAuth and clientAuth;
// an admin is a client only.
func TestKeyUsagePerRole(t *testing.T) {
	root := t.TempDir()
	for _, id := range []Identity{Agent("n1"), Frontend("f"), Worker("n1", "n1-decode-tiny-0"), Etcd("e"), Admin("a")} {
		dir, err := InitIdentity(root, id)
		if err != nil {
			t.Fatal(err)
		}
		_, cerr := verify(t, dir, x509.ExtKeyUsageClientAuth)
		_, serr := verify(t, dir, x509.ExtKeyUsageServerAuth)
		if cerr != nil {
			t.Errorf("%s: not a client: %v", id, cerr)
		}
		if wantServer := id.Role != RoleAdmin; (serr == nil) != wantServer {
			t.Errorf("%s: server usage %v, want %v", id, serr == nil, wantServer)
		}
	}
}

// TestWorkersSignedByTheirNodeCA: an agent's node CA signs its own node's
// workers, and peers refuse anything else it could sign: another node's
// worker, another role, a worker certificate straight from the root.
func TestWorkersSignedByTheirNodeCA(t *testing.T) {
	root := t.TempDir()
	a0, err := InitIdentity(root, Agent("node-0"))
	if err != nil {
		t.Fatal(err)
	}
	w := filepath.Join(root, "w")
	if err := IssueWorker(a0, w, "node-0-decode-tiny-3"); err != nil {
		t.Fatal(err)
	}
	chain, err := verify(t, w, x509.ExtKeyUsageServerAuth)
	if err != nil {
		t.Fatal(err)
	}
	id, err := ChainIdentity(chain)
	if err != nil || id != Worker("node-0", "node-0-decode-tiny-3") || id.Node() != "node-0" || id.Instance() != "node-0-decode-tiny-3" {
		t.Fatalf("ChainIdentity = %v, %v", id, err)
	}
	if m := mode(t, filepath.Join(w, KeyFile)); m != 0o600 {
		t.Fatalf("worker key mode %o", m)
	}
	// The agent cannot name another node's instance.
	if err := IssueWorker(a0, filepath.Join(root, "w2"), "node-1-decode-tiny-0"); !errors.Is(err, ErrIdentity) {
		t.Fatalf("another node's instance: %v", err)
	}
	// Certificates the node CA could sign by hand are refused by peers.
	nodeCA, err := loadSigner(filepath.Join(a0, NodeCAFile), filepath.Join(a0, NodeCAKey))
	if err != nil {
		t.Fatal(err)
	}
	for _, forged := range []Identity{Worker("node-1", "x"), Agent("node-0"), Frontend("f")} {
		dir := filepath.Join(root, "forged-"+forged.DirName())
		os.MkdirAll(dir, 0o700)
		copyFile(filepath.Join(a0, CAFile), filepath.Join(dir, CAFile))
		if err := issueLeaf(nodeCA, dir, forged, nil); err != nil {
			t.Fatal(err)
		}
		chain, err := verify(t, dir, x509.ExtKeyUsageClientAuth)
		if err != nil {
			t.Fatal(err) // the chain itself is valid...
		}
		if _, err := ChainIdentity(chain); !errors.Is(err, ErrIdentity) || !strings.Contains(err.Error(), "nodeca:node-0") && !strings.Contains(err.Error(), "cluster CA itself") {
			t.Fatalf("%s signed by node-0's CA: %v", forged, err) // ...the identity is not
		}
	}
	// A worker certificate must come from its node's CA, not the root.
	rootSigned := filepath.Join(root, "rootsigned")
	rootCA, _ := loadSigner(filepath.Join(root, "ca", CAFile), filepath.Join(root, "ca", CAKey))
	os.MkdirAll(rootSigned, 0o700)
	copyFile(filepath.Join(a0, CAFile), filepath.Join(rootSigned, CAFile))
	issueLeaf(rootCA, rootSigned, Worker("node-0", "node-0-decode-tiny-0"), nil)
	chain, err = verify(t, rootSigned, x509.ExtKeyUsageClientAuth)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ChainIdentity(chain); !errors.Is(err, ErrIdentity) {
		t.Fatalf("root-signed worker: %v", err)
	}
}

// TestIdentityNames: one parser for every common name; node ids that
// would make node-scoped key prefixes overlap are refused.
func TestIdentityNames(t *testing.T) {
	for cn, want := range map[string]Identity{
		"agent:node-0":                    Agent("node-0"),
		"worker:n1/n1-prefill-tiny-2":     Worker("n1", "n1-prefill-tiny-2"),
		"worker:n1/decode-7":              Worker("n1", "decode-7"),
		"frontend:frontend-0":             Frontend("frontend-0"),
		"etcd:local":                      Etcd("local"),
		"admin:ops":                       Admin("ops"),
		"worker:a.b/a.b-both-tiny-0":      Worker("a.b", "a.b-both-tiny-0"),
		"agent:node_7":                    Agent("node_7"),
		"frontend:fe-1":                   Frontend("fe-1"),
		"worker:n-1/n-1-decode-small-12":  Worker("n-1", "n-1-decode-small-12"),
		"agent:x-decoder":                 Agent("x-decoder"),
		"agent:prefill":                   Agent("prefill"),
		"worker:n1/n1-decode-tiny-0.tiny": Worker("n1", "n1-decode-tiny-0.tiny"),
	} {
		got, err := ParseIdentity(cn)
		if err != nil || got != want {
			t.Errorf("ParseIdentity(%q) = %v, %v; want %v", cn, got, err, want)
		}
	}
	for _, cn := range []string{
		"lifeline node", "agent:", "agent:a/b", "agent:x-decode-y", "agent:x-decode", "agent:x-prefill", "agent:x-both-1",
		"worker:n1", "worker:n2/n1-decode-tiny-0", "worker:n1/", "root:x", "frontend:a b", "agent:-x", "frontend:" + strings.Repeat("a", 64),
	} {
		if id, err := ParseIdentity(cn); !errors.Is(err, ErrIdentity) {
			t.Errorf("ParseIdentity(%q) = %v, %v; want ErrIdentity", cn, id, err)
		}
	}
	if n, ok := InstanceNode("node-0-decode-tiny-3"); !ok || n != "node-0" {
		t.Fatalf("InstanceNode = %q %v", n, ok)
	}
}

// BenchmarkCheck is the role check a handshake adds on each end, on a
// worker's chain (the longest: leaf, node CA, root).
func BenchmarkCheck(b *testing.B) {
	root := b.TempDir()
	a, err := InitIdentity(root, Agent("n1"))
	if err != nil {
		b.Fatal(err)
	}
	w := filepath.Join(root, "w")
	if err := IssueWorker(a, w, "n1-decode-tiny-0"); err != nil {
		b.Fatal(err)
	}
	_, chain := leaf(b, w)
	rootCA, _ := loadSigner(filepath.Join(root, "ca", CAFile), filepath.Join(root, "ca", CAKey))
	chain = append(chain, rootCA.cert)
	peers := []Peer{{Role: RoleFrontend}, {Role: RoleWorker, Instance: "n1-decode-tiny-0"}}
	b.ResetTimer()
	for range b.N {
		if _, err := Check(chain, peers...); err != nil {
			b.Fatal(err)
		}
	}
}
