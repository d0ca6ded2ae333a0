package agent

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// nodeRefresh is how old the node record's stamp may be before a refresh
// writes the record again though nothing in it changed. Routers ignore a
// record older than a few seconds and the lease loop refreshes once a
// second: at half that period timer jitter never skips a tick's write
// (the stamp stays about a second old at most), while the refreshes in
// between (canary results, GPU faults) leave an unchanged record alone.
const nodeRefresh = 500 * time.Millisecond

// resync is how often a refresh writes every key again, changed or not:
// a key changed behind the agent's back (an operator's etcdctl, an etcd
// restore) is repaired within it.
const resync = 10 * time.Second

// maxTxnOps is etcd's default limit on the operations of one transaction
// (--max-txn-ops). More changes than that go in consecutive transactions.
const maxTxnOps = 128

// registrar remembers what the agent last wrote to etcd under its lease,
// so that a refresh sends only what changed. Agent.regMu guards it.
type registrar struct {
	lease clientv3.LeaseID // the lease the remembered writes were under
	// since is when the memory was last cleared.
	since time.Time
	// written is the last successful write of each key; a key that is not
	// here is unknown and is written by the next refresh.
	written map[string]written
}

// written is what a write left in a key: a value or nothing. For the node
// record, val is the record without its stamp and at when it was put.
type written struct {
	val     string
	deleted bool
	at      time.Time
}

// regWrite is one change: put val (under the lease) or delete the key;
// memo is what the registrar remembers once it is written.
type regWrite struct {
	key  string
	val  string
	del  bool
	memo written
}

// changes returns the writes that bring etcd from what was last written
// to want (a write per instance key) and the node record node (stamped
// now when written). Under a new lease nothing written before stands, nor
// after resync: every key counts as changed.
func (r *registrar) changes(lease clientv3.LeaseID, want []regWrite, nodeKey string, node schema.NodeRecord, now time.Time) []regWrite {
	if lease != r.lease || r.written == nil || now.Sub(r.since) >= resync {
		r.lease, r.written, r.since = lease, map[string]written{}, now
	}
	var out []regWrite
	for _, w := range want {
		if last, ok := r.written[w.key]; ok && last.deleted == w.del && last.val == w.val {
			continue
		}
		w.memo = written{val: w.val, deleted: w.del}
		out = append(out, w)
	}
	node.UpdatedUnixNano = 0
	content, _ := json.Marshal(node)
	if last, ok := r.written[nodeKey]; !ok || last.val != string(content) || now.Sub(last.at) >= nodeRefresh {
		node.UpdatedUnixNano = now.UnixNano()
		stamped, _ := json.Marshal(node)
		out = append(out, regWrite{key: nodeKey, val: string(stamped), memo: written{val: string(content), at: now}})
	}
	return out
}

// wrote records writes that etcd took.
func (r *registrar) wrote(ws []regWrite) {
	for _, w := range ws {
		r.written[w.key] = w.memo
	}
}

// deleted records that key was deleted outside a refresh.
func (r *registrar) deleted(key string) {
	if r.written != nil {
		r.written[key] = written{deleted: true}
	}
}

// forget makes key unknown: the next refresh writes it whatever it holds.
func (r *registrar) forget(key string) { delete(r.written, key) }

// forgetAll makes every key unknown: the next refresh writes them all.
func (r *registrar) forgetAll() { r.written = nil }

// ops is ws as etcd operations, puts under lease.
func ops(ws []regWrite, lease clientv3.LeaseID) []clientv3.Op {
	out := make([]clientv3.Op, 0, len(ws))
	for _, w := range ws {
		if w.del {
			out = append(out, clientv3.OpDelete(w.key))
		} else {
			out = append(out, clientv3.OpPut(w.key, w.val, clientv3.WithLease(lease)))
		}
	}
	return out
}

// registerAll brings etcd up to date with the agent: every ready instance
// registered, every other one not, and the node record fresh. Only what
// changed since the last successful write is sent, in one transaction.
// It is sent after a.mu is released but under regMu, so that it can never
// land after a death's deregistration; a failed one is sent again by the
// next refresh.
func (a *Agent) registerAll(ctx context.Context) { a.registerAt(ctx, time.Now()) }

// registerAt is registerAll at the time now.
func (a *Agent) registerAt(ctx context.Context, now time.Time) {
	a.regMu.Lock()
	defer a.regMu.Unlock()
	lease, want := a.registrations()
	if lease == 0 {
		return
	}
	writes := a.reg.changes(lease, want, schema.NodesPrefix+a.opts.NodeID, a.nodeRecord(), now)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for len(writes) > 0 {
		batch := writes[:min(len(writes), maxTxnOps)]
		writes = writes[len(batch):]
		if _, err := a.etcd.Txn(rctx).Then(ops(batch, lease)...).Commit(); err != nil {
			if ctx.Err() == nil { // not the agent stopping
				a.etcdWriteFailed(opRegister, err, "keys", len(batch), "lease", int64(lease))
			}
			return
		}
		a.reg.wrote(batch)
	}
}

// registrations is the agent's lease and what etcd should hold for every
// instance: the registration of a ready one (or of one that was ready when
// a drain began, marked draining, until its worker stops), nothing for the
// others. The
// snapshot is taken under a.mu, the values encoded after.
func (a *Agent) registrations() (clientv3.LeaseID, []regWrite) {
	a.mu.Lock()
	lease := a.lease
	var ready []schema.Registration
	var others []string
	for _, inst := range a.instances {
		if (inst.ready || inst.drainRegistered) && inst.pid != 0 {
			ready = append(ready, a.registrationLocked(inst))
		} else {
			others = append(others, inst.id)
		}
	}
	a.mu.Unlock()
	want := make([]regWrite, 0, len(ready)+len(others))
	for _, r := range ready {
		b, _ := json.Marshal(r)
		want = append(want, regWrite{key: schema.InstancesPrefix + r.InstanceID, val: string(b)})
	}
	for _, id := range others {
		want = append(want, regWrite{key: schema.InstancesPrefix + id, del: true})
	}
	sort.Slice(want, func(i, j int) bool { return want[i].key < want[j].key })
	return lease, want
}

func (a *Agent) registrationLocked(inst *instance) schema.Registration {
	return schema.Registration{InstanceID: inst.id, Generation: inst.gen, Node: a.opts.NodeID, Role: inst.spec.Role, Model: inst.model,
		ModelRevision: inst.revision, NumericsID: inst.numerics, Addr: inst.addr, Ready: inst.ready && !inst.draining, Draining: inst.draining,
		Running: inst.running, Queued: inst.queued, FreeBlocks: inst.freeBlocks, KVAddr: a.kvAddr, KVIdentity: inst.kvIdentity,
		ContextLen: inst.contextLen, TokenizerHash: inst.tokenizerHash, Capacity: inst.capacity, BatchCapacity: inst.batchCapacity,
		Continuation: inst.continuation}
}
