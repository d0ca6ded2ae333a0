package agent

import (
	"context"
	"encoding/json"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// keepLease holds the agent's etcd lease and keeps every ready instance
// registered under it. When renewals fail for longer than the TTL the
// agent can no longer prove it is routable and says so; when etcd answers
// again it takes a new lease and registers again.
func (a *Agent) keepLease(ctx context.Context) {
	ttl := time.Duration(a.opts.LeaseTTL)
	for ctx.Err() == nil {
		gctx, cancel := context.WithTimeout(ctx, ttl)
		grant, err := a.etcd.Grant(gctx, int64(ttl/time.Second))
		cancel()
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		a.mu.Lock()
		wasLost := a.lease == 0 && !a.leaseAlive.IsZero()
		a.lease, a.leaseAlive = grant.ID, time.Now()
		a.mu.Unlock()
		if wasLost {
			a.metrics.reregisters.Inc()
			a.emit(Event{Kind: EventReregistered})
		}
		a.registerAll(ctx)
		kctx, kcancel := context.WithCancel(ctx)
		ch, err := a.etcd.KeepAlive(kctx, grant.ID)
		if err != nil {
			kcancel()
			continue
		}
		tick := time.NewTicker(time.Second)
	alive:
		for {
			select {
			case <-ctx.Done():
				tick.Stop()
				kcancel()
				return
			case resp, ok := <-ch:
				if !ok || resp == nil {
					break alive
				}
				a.mu.Lock()
				a.leaseAlive = time.Now()
				a.mu.Unlock()
			case <-tick.C:
				a.mu.Lock()
				expired := time.Since(a.leaseAlive) > ttl
				a.mu.Unlock()
				if expired {
					break alive
				}
				a.registerAll(ctx) // refresh load figures
			}
		}
		tick.Stop()
		kcancel()
		a.mu.Lock()
		a.lease = 0
		a.mu.Unlock()
		a.metrics.leaseLost.Inc()
		a.emit(Event{Kind: EventLeaseLost, Detail: "etcd lease could not be renewed within its TTL; not routable"})
		a.log.Warn("etcd lease lost", "recovery_action", "re-register when etcd answers")
	}
}

// registerAll writes the registration of every ready instance and removes
// those that are not ready.
func (a *Agent) registerAll(ctx context.Context) {
	a.mu.Lock()
	lease := a.lease
	var puts []Registration
	var dels []string
	for _, inst := range a.instances {
		if inst.ready && inst.pid != 0 {
			puts = append(puts, a.registrationLocked(inst))
		} else {
			dels = append(dels, inst.id)
		}
	}
	a.mu.Unlock()
	if lease == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for _, r := range puts {
		b, _ := json.Marshal(r)
		a.etcd.Put(rctx, InstancesPrefix+r.InstanceID, string(b), clientv3.WithLease(lease))
	}
	for _, id := range dels {
		a.etcd.Delete(rctx, InstancesPrefix+id)
	}
}

func (a *Agent) registrationLocked(inst *instance) Registration {
	return Registration{InstanceID: inst.id, Generation: inst.gen, Node: a.opts.NodeID, Role: inst.spec.Role, Model: inst.model,
		ModelRevision: inst.revision, NumericsID: inst.numerics, Addr: inst.addr, Ready: inst.ready,
		Running: inst.running, Queued: inst.queued, FreeBlocks: inst.freeBlocks}
}

// routable reports whether the agent can prove its lease is live.
func (a *Agent) routableLocked() bool {
	return a.lease != 0 && time.Since(a.leaseAlive) <= time.Duration(a.opts.LeaseTTL)
}

func (a *Agent) revokeLease() {
	a.mu.Lock()
	lease := a.lease
	a.mu.Unlock()
	if lease == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	a.etcd.Revoke(ctx, lease)
}
