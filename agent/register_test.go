package agent

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/shm"
)

func keysOf(ws []regWrite) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.key)
	}
	return out
}

func TestRegistrarSendsOnlyChanges(t *testing.T) {
	const nodeKey = schema.NodesPrefix + "n1"
	node := schema.NodeRecord{Node: "n1", KVAddr: "127.0.0.1:7100", Transport: "quic"}
	want := []regWrite{{key: "a", val: "A1"}, {key: "b", del: true}}
	var r registrar
	t0 := time.Unix(1000, 0)

	first := r.changes(1, want, nodeKey, node, t0)
	if got := keysOf(first); len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != nodeKey {
		t.Fatalf("first refresh writes %v, want a, b and the node record", got)
	}
	var stamped schema.NodeRecord
	if err := json.Unmarshal([]byte(first[2].val), &stamped); err != nil || stamped.UpdatedUnixNano != t0.UnixNano() {
		t.Fatalf("node record %s (%v): want it stamped %d", first[2].val, err, t0.UnixNano())
	}
	r.wrote(first)

	if got := r.changes(1, want, nodeKey, node, t0.Add(nodeRefresh/2)); len(got) != 0 {
		t.Fatalf("nothing changed, yet the refresh writes %v", keysOf(got))
	}
	if got := keysOf(r.changes(1, want, nodeKey, node, t0.Add(nodeRefresh))); len(got) != 1 || got[0] != nodeKey {
		t.Fatalf("a stale node stamp: refresh writes %v, want the node record alone", got)
	}
	t1 := t0.Add(nodeRefresh)
	r.wrote(r.changes(1, want, nodeKey, node, t1))

	changed := []regWrite{{key: "a", val: "A2"}, {key: "b", val: "B1"}}
	node.Prefixes = []string{"0011223344556677"}
	got := r.changes(1, changed, nodeKey, node, t1)
	if k := keysOf(got); len(k) != 3 {
		t.Fatalf("a, b and the node's summary changed: refresh writes %v", k)
	}
	// A write that failed is not remembered: the next refresh sends it again.
	if again := keysOf(r.changes(1, changed, nodeKey, node, t1)); len(again) != 3 {
		t.Fatalf("after a failed write the refresh writes %v, want all three again", again)
	}
	r.wrote(got)

	// A death deleted a; a failed delete of b leaves b unknown.
	r.deleted("a")
	r.forget("b")
	afterDeath := []regWrite{{key: "a", del: true}, {key: "b", val: "B1"}}
	if k := keysOf(r.changes(1, afterDeath, nodeKey, node, t1)); len(k) != 1 || k[0] != "b" {
		t.Fatalf("after a's deregistration and b's failed one: refresh writes %v, want b", k)
	}

	// A new lease: every key again, whatever was written under the old one.
	fresh := r.changes(2, afterDeath, nodeKey, node, t1)
	if k := keysOf(fresh); len(k) != 3 {
		t.Fatalf("under a new lease the refresh writes %v, want every key", k)
	}
	r.wrote(fresh)

	// Every resync, every key again: what was changed behind the agent's
	// back is repaired.
	if k := keysOf(r.changes(2, afterDeath, nodeKey, node, t1.Add(resync-time.Millisecond))); len(k) != 1 || k[0] != nodeKey {
		t.Fatalf("before the resync the refresh writes %v, want the stale node record alone", k)
	}
	if k := keysOf(r.changes(2, afterDeath, nodeKey, node, t1.Add(resync))); len(k) != 3 {
		t.Fatalf("at the resync the refresh writes %v, want every key", k)
	}
}

// testAgent is an agent with an etcd client on a fresh embedded etcd and a
// KV owner, nothing started.
func testAgent(t *testing.T) (*Agent, *clientv3.Client) {
	t.Helper()
	_, cli := testEtcd(t)
	dir := t.TempDir()
	owner, err := kv.Open(kv.Options{ArenaPath: filepath.Join(dir, "arena"), Geometry: shm.Geometry{Slots: 16, PayloadSize: 4096},
		DBDir: filepath.Join(dir, "kv"), LeaseTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close() })
	a := &Agent{opts: Options{NodeID: "n1"}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), etcd: cli, kvOwner: owner,
		metrics: newMetrics(), events: newEventLog(), instances: map[string]*instance{}}
	return a, cli
}

func grant(t *testing.T, cli *clientv3.Client) clientv3.LeaseID {
	t.Helper()
	g, err := cli.Grant(context.Background(), 30)
	if err != nil {
		t.Fatal(err)
	}
	return g.ID
}

// TestRegisterAllOneTransactionOfChanges: each refresh is one etcd
// transaction (one revision) of what changed, and none when nothing did.
func TestRegisterAllOneTransactionOfChanges(t *testing.T) {
	a, cli := testAgent(t)
	ctx := context.Background()
	a.instances["n1-decode-tiny-0"] = &instance{id: "n1-decode-tiny-0", spec: InstanceSpec{Role: "decode"}, gen: 3, pid: 100, addr: "127.0.0.1:9000", ready: true}
	a.instances["n1-decode-tiny-1"] = &instance{id: "n1-decode-tiny-1", spec: InstanceSpec{Role: "decode"}, gen: 1}
	a.lease = grant(t, cli)
	revision := func() int64 {
		t.Helper()
		resp, err := cli.Get(ctx, "/lifeline/v1/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	registration := func(id string) *schema.Registration {
		t.Helper()
		resp, err := cli.Get(ctx, schema.InstancesPrefix+id)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		var r schema.Registration
		json.Unmarshal(resp.Kvs[0].Value, &r)
		if resp.Kvs[0].Lease != int64(a.lease) {
			t.Fatalf("%s registered under lease %x, not the agent's %x", id, resp.Kvs[0].Lease, a.lease)
		}
		return &r
	}

	// A fixed clock: a refresh is a function of what changed, not of how
	// long the test took.
	now := time.Now()
	before := revision()
	a.registerAt(ctx, now)
	if r := registration("n1-decode-tiny-0"); r == nil || r.Generation != 3 {
		t.Fatalf("ready instance registered as %+v", r)
	}
	if r := registration("n1-decode-tiny-1"); r != nil {
		t.Fatalf("instance that is not ready registered: %+v", r)
	}
	if rev := revision(); rev != before+1 {
		t.Fatalf("first refresh took revisions %d..%d, want one transaction", before, rev)
	}

	a.registerAt(ctx, now)
	if rev := revision(); rev != before+1 {
		t.Fatalf("a refresh with nothing changed wrote (revision %d, was %d)", rev, before+1)
	}

	a.mu.Lock()
	a.instances["n1-decode-tiny-0"].running = 2
	a.instances["n1-decode-tiny-1"].ready, a.instances["n1-decode-tiny-1"].pid = true, 101
	a.mu.Unlock()
	a.registerAt(ctx, now)
	if rev := revision(); rev != before+2 {
		t.Fatalf("two changed instances took revisions %d..%d, want one transaction", before+1, rev)
	}
	if r := registration("n1-decode-tiny-0"); r == nil || r.Running != 2 {
		t.Fatalf("changed load not written: %+v", r)
	}

	// A stale node stamp is refreshed on its own.
	nodeKey := schema.NodesPrefix + "n1"
	last := a.reg.written[nodeKey]
	last.at = last.at.Add(-nodeRefresh)
	a.reg.written[nodeKey] = last
	a.registerAt(ctx, now)
	resp, err := cli.Get(ctx, nodeKey)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].ModRevision != before+3 {
		t.Fatalf("stale node record not refreshed: %v %v", resp, err)
	}
	if rev := revision(); rev != before+3 {
		t.Fatalf("node refresh took revisions %d..%d", before+2, rev)
	}

	// A new lease: everything again, under it.
	a.lease = grant(t, cli)
	a.registerAt(ctx, now)
	for _, id := range []string{"n1-decode-tiny-0", "n1-decode-tiny-1"} {
		if r := registration(id); r == nil {
			t.Fatalf("%s not registered again under the new lease", id)
		}
	}
}
