package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// drainedNode asserts that n comes back (or stays) drained: `nodectl
// status` says so, its share of the disruption budget is held under the
// agent's current lease, and for a while no worker process runs and
// nothing of it is registered.
func drainedNode(t *testing.T, n *clustertest.Node, kvSock string) controlapi.Status {
	t.Helper()
	var st controlapi.Status
	proctest.WaitFor(t, 30*time.Second, "the node drained, holding its budget share under its lease", func() (bool, string) {
		var err error
		if st, err = n.Status(t.Context()); err != nil || st.Drain == nil {
			return false, fmt.Sprint(err)
		}
		resp, err := n.Env.Client.Get(t.Context(), schema.DrainHoldersPrefix+n.Options.NodeID)
		if err != nil || len(resp.Kvs) != 1 {
			return false, fmt.Sprintf("drain %+v, holder %v %v", st.Drain, resp, err)
		}
		lease := resp.Kvs[0].Lease
		return st.Drain.Phase == controlapi.DrainDrained && st.Drain.BudgetHeld && lease == st.Etcd.LeaseID && lease != 0,
			fmt.Sprintf("drain %+v, holder under lease %x, agent lease %x", st.Drain, lease, st.Etcd.LeaseID)
	})
	if out := n.Nodectl(t, "status"); !strings.Contains(out, "drain (nodectl): drained") {
		t.Fatalf("nodectl status does not say drained:\n%s", out)
	}
	proctest.Never(t, 3*time.Second, "a worker started or a registration written on the drained node", func() (bool, string) {
		resp, err := n.Env.Client.Get(t.Context(), schema.InstancesPrefix, clientv3.WithPrefix())
		pids := proctest.WorkerPIDs(kvSock)
		return err != nil || len(resp.Kvs) != 0 || len(pids) != 0, fmt.Sprintf("registrations %v (%v), workers %v", resp.Kvs, err, pids)
	})
	for _, w := range n.NodectlWorkers(t) {
		if w.PID != 0 || w.Ready || w.State != "drained" {
			t.Fatalf("instance of the drained node: %+v", w)
		}
	}
	return st
}

// TestAgentDrainSurvivesRestart: a node drained with `nodectl drain`
// (agent up, instances stopped) whose agent is SIGKILLed comes back
// drained on the same data dir: no worker, nothing registered, its share
// of the disruption budget moved under the new agent's lease (held past
// the old lease's expiry), `nodectl status` says drained; a SIGTERM
// restart of the drained node (systemctl restart) keeps it drained.
// `nodectl undrain` starts the instance at a higher generation and gives
// the budget back; a SIGTERM restart of a serving node then comes back
// serving, not drained.
func TestAgentDrainSurvivesRestart(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, func(o *clustertest.Config) { o.DrainSettle = agent.Duration(100 * time.Millisecond) })
	const id = "n1-decode-tiny-0"
	kvSock := filepath.Join(n.Dir, "data", "kv.sock")
	reg := n.WaitRegistration(t, id, 0)
	if out := n.Nodectl(t, "drain", "--deadline", "2s"); !strings.Contains(out, "drained in") {
		t.Fatalf("nodectl drain: %s", out)
	}
	before := drainedNode(t, n, kvSock)

	n.Signal(syscall.SIGKILL)
	<-n.Exited()
	n.Restart(t)
	after := drainedNode(t, n, kvSock)
	if after.Etcd.LeaseID == before.Etcd.LeaseID || !after.Drain.DrainedAt.Equal(before.Drain.DrainedAt) {
		t.Fatalf("after the SIGKILL restart: lease %x (was %x), drained at %v (was %v)", after.Etcd.LeaseID, before.Etcd.LeaseID,
			after.Drain.DrainedAt, before.Drain.DrainedAt)
	}
	// The share the killed agent held was under its lease: still held
	// once that lease has expired.
	proctest.WaitFor(t, 30*time.Second, "the killed agent's lease to expire", func() (bool, string) {
		ttl, err := n.Env.Client.TimeToLive(t.Context(), clientv3.LeaseID(before.Etcd.LeaseID))
		return err == nil && ttl.TTL == -1, fmt.Sprint(ttl, err)
	})
	drainedNode(t, n, kvSock)

	n.Signal(syscall.SIGTERM)
	<-n.Exited()
	n.Restart(t)
	drainedNode(t, n, kvSock)

	if out := n.Nodectl(t, "undrain"); !strings.Contains(out, "undraining") {
		t.Fatalf("nodectl undrain: %s", out)
	}
	next := n.WaitRegistration(t, id, reg.Generation)
	proctest.WaitFor(t, 30*time.Second, "the disruption budget given back", func() (bool, string) {
		resp, err := n.Env.Client.Get(t.Context(), schema.DrainHoldersPrefix, clientv3.WithPrefix())
		st, serr := n.Status(t.Context())
		return err == nil && len(resp.Kvs) == 0 && serr == nil && st.Drain == nil, fmt.Sprintf("holders %v, drain %+v", resp.Kvs, st.Drain)
	})
	t.Logf("undrained: %s back at generation %d (was %d before the drain)", id, next.Generation, reg.Generation)

	n.Signal(syscall.SIGTERM)
	<-n.Exited()
	n.Restart(t)
	again := n.WaitRegistration(t, id, next.Generation)
	if st := n.NodectlStatus(t); st.Drain != nil {
		t.Fatalf("a SIGTERM restart of a serving node came back with a drain: %+v", st.Drain)
	}
	t.Logf("SIGTERM restart: serving again at generation %d", again.Generation)
}
