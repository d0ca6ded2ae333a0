package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/embedetcd"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestCertsCommands: `certs init` makes a private CA directory, `certs
// issue` a directory per component without the CA key, and `certs
// etcd-setup` (with an admin certificate, twice) locks an existing etcd
// down: an agent writes its node's keys only, a frontend no registration.
func TestCertsCommands(t *testing.T) {
	t.Parallel()
	ca := clustertest.CADir(t)
	if st, err := os.Stat(ca); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("CA directory: %v %v", st.Mode(), err)
	}
	// It says what it wrote, and what comes next (it used to print
	// nothing).
	fresh := filepath.Join(t.TempDir(), "ca")
	for _, want := range []string{"cluster CA created: " + filepath.Join(fresh, pki.CAFile), "cluster CA kept (it was there)"} {
		out, errOut, err := proctest.Run(t, "certs", "init", "--dir", fresh)
		if err != nil || !strings.Contains(out, want) || !strings.Contains(out, "next: lifeline certs issue --ca "+fresh) {
			t.Fatalf("certs init: %v, said %q %q; want %q", err, out, errOut, want)
		}
	}
	if _, _, err := proctest.Run(t, "certs", "issue", "--ca", ca, "--role", "agent", "--name", "x-decode-y"); err == nil {
		t.Fatal("an ambiguous node id was issued")
	}
	dirs := map[string]string{}
	for _, rn := range [][2]string{{"etcd", "e"}, {"admin", "ops"}, {"agent", "n1"}, {"frontend", "f1"}} {
		dirs[rn[0]] = clustertest.Issue(t, ca, rn[0], rn[1])
		if _, err := os.Stat(filepath.Join(dirs[rn[0]], pki.CAKey)); !os.IsNotExist(err) {
			t.Fatalf("%s's directory holds the CA key", rn[0])
		}
	}
	e, err := embedetcd.Start(t.TempDir(), 0, dirs["etcd"])
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for range 2 {
		out, errOut, err := proctest.Run(t, "certs", "etcd-setup", "--etcd", e.Endpoint, "--certs", dirs["admin"], "--node", "n1", "--frontend", "f1")
		if err != nil || !strings.Contains(out, "etcd auth on (admin admin:ops); users: agent:n1, frontend:f1") {
			t.Fatalf("etcd-setup: %v %s %s", err, out, errOut)
		}
	}
	// A new admin identity, from the same CA: etcd knows no user by its
	// name. Without the CA, etcd-setup says how to add it; with it, it
	// adds it (as etcd's root user) and goes on.
	dirs["new admin"] = clustertest.Issue(t, ca, "admin", "newops")
	_, errOut, err := proctest.Run(t, "certs", "etcd-setup", "--etcd", e.Endpoint, "--certs", dirs["new admin"], "--frontend", "f2")
	if err == nil || !strings.Contains(errOut, "admin:newops is not an etcd user yet") || !strings.Contains(errOut, "--admin newops") || !strings.Contains(errOut, "--ca CA-DIR") {
		t.Fatalf("etcd-setup as a new admin without the CA: %v %s", err, errOut)
	}
	out, errOut, err := proctest.Run(t, "certs", "etcd-setup", "--etcd", e.Endpoint, "--certs", dirs["new admin"], "--ca", ca, "--frontend", "f2")
	if err != nil || !strings.Contains(out, "admin:newops added as an etcd user with the CA") || !strings.Contains(out, "etcd auth on (admin admin:newops); users: frontend:f2") {
		t.Fatalf("etcd-setup as a new admin with the CA: %v %s %s", err, out, errOut)
	}
	// A CA that did not issue etcd's certificates is refused by etcd.
	other := clustertest.CADir(t)
	dirs["stranger"] = clustertest.Issue(t, ca, "admin", "stranger")
	// It says so at once (it waited out its 30 s deadline, saying only
	// that the deadline was exceeded).
	start := time.Now()
	if _, errOut, err := proctest.Run(t, "certs", "etcd-setup", "--etcd", e.Endpoint, "--certs", dirs["stranger"], "--ca", other); err == nil {
		t.Fatalf("etcd-setup with another CA added the admin: %s", errOut)
	} else if took := time.Since(start); !strings.Contains(errOut, "--ca must be the CA that issued etcd's certificates") || took > 10*time.Second {
		t.Fatalf("etcd-setup with another CA, after %v: %s", took, errOut)
	}
	client := func(dir string) *clientv3.Client {
		conf, err := pki.EtcdClientTLS(dir)
		if err != nil {
			t.Fatal(err)
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second, TLS: conf})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	agent, fe := client(dirs["agent"]), client(dirs["frontend"])
	if _, err := agent.Put(ctx, schema.InstancesPrefix+"n1-decode-tiny-0", "{}"); err != nil {
		t.Fatalf("n1's agent, its registration: %v", err)
	}
	for name, put := range map[string]func() error{
		"n1's agent, n2's registration": func() error { _, err := agent.Put(ctx, schema.InstancesPrefix+"n2-decode-tiny-0", "{}"); return err },
		"f1, a registration":            func() error { _, err := fe.Put(ctx, schema.InstancesPrefix+"n1-decode-tiny-0", "{}"); return err },
		"f1, deleting a registration":   func() error { _, err := fe.Delete(ctx, schema.InstancesPrefix+"n1-decode-tiny-0"); return err },
	} {
		if err := put(); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("%s: %v", name, err)
		}
	}
}
