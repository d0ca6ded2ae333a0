package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/internal/etcdlog"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

// startEtcd connects to etcd (mutual TLS when configured) and starts
// holding the agent's lease.
func (a *Agent) startEtcd(ctx context.Context) error {
	// gRPC keep-alives: a member cut off without closing its
	// connections (a host's link down) is left for another within
	// seconds; TCP alone waits minutes.
	ecfg := clientv3.Config{Endpoints: a.opts.Etcd, DialTimeout: 2 * time.Second, Logger: etcdlog.New(a.log),
		DialKeepAliveTime: etcdlog.KeepAliveTime, DialKeepAliveTimeout: etcdlog.KeepAliveTimeout}
	if a.opts.EtcdTLS {
		var err error
		if ecfg.TLS, err = pki.EtcdClientTLS(a.opts.CertDir); err != nil {
			return fmt.Errorf("agent: etcd_tls: %w", err)
		}
	}
	cli, err := clientv3.New(ecfg)
	if err != nil {
		return fmt.Errorf("agent: etcd: %w", err)
	}
	a.etcd = cli
	a.track(func() { a.keepLease(ctx) })
	return nil
}

// keepLease holds the agent's etcd lease and keeps every ready instance
// registered under it. When renewals fail for longer than the TTL the
// agent can no longer prove it is routable and says so; when etcd answers
// again it takes a new lease and registers again.
func (a *Agent) keepLease(ctx context.Context) {
	ttl := time.Duration(a.opts.LeaseTTL)
	// last is the lease whose renewals failed for longer than its TTL:
	// etcd may still hold it. A new leader extends every lease by an
	// election timeout when it takes over, so an election that outlasts
	// the TTL (a leader killed on a loaded machine: 3.6 s against 3 s
	// was seen) loses no lease; only the renewals stopped meanwhile.
	var last clientv3.LeaseID
	for ctx.Err() == nil {
		id, kept, err := a.acquireLease(ctx, last, ttl)
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			if errors.Is(err, errLeaseExpired) {
				last = 0
			}
			continue
		}
		last = 0
		a.mu.Lock()
		wasLost := a.lease == 0 && !a.leaseAlive.IsZero()
		a.lease, a.leaseAlive = id, time.Now()
		a.mu.Unlock()
		switch {
		case kept:
			a.emit(controlapi.Event{Kind: controlapi.EventLeaseKept, Detail: "etcd renewed the lease again after a gap longer than its TTL: routable, at the same generations"})
			a.log.Info("etcd lease kept", "recovery_action", "workers accept again")
			a.unfenceAll(ctx)
			// Every registration written again, unchanged: the put tells
			// frontends that avoided a fenced worker that it accepts.
			a.regMu.Lock()
			a.reg.forgetAll()
			a.regMu.Unlock()
		case wasLost:
			a.reregister(ctx)
		}
		a.registerAll(ctx)
		if !a.holdLease(ctx, id, ttl) {
			return
		}
		a.mu.Lock()
		last, a.lease = a.lease, 0
		a.mu.Unlock()
		a.metrics.leaseLost.Inc()
		a.emit(controlapi.Event{Kind: controlapi.EventLeaseLost, Detail: "etcd lease could not be renewed within its TTL; not routable"})
		a.log.Warn("etcd lease lost", "recovery_action", "workers stop accepting; re-register when etcd answers")
		a.fenceAll(ctx)
	}
}

// holdLease renews lease id until a renewal fails for longer than ttl
// (it returns true) or ctx ends (false), registering the instances every
// second meanwhile.
func (a *Agent) holdLease(ctx context.Context, id clientv3.LeaseID, ttl time.Duration) bool {
	kctx, kcancel := context.WithCancel(ctx)
	ch, err := a.etcd.KeepAlive(kctx, id)
	if err != nil {
		kcancel()
		return true
	}
	tick := time.NewTicker(time.Second)
alive:
	for {
		select {
		case <-ctx.Done():
			tick.Stop()
			kcancel()
			return false
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
			a.registerAll(ctx) // load figures, and the node record's stamp
			for state, n := range a.kvOwner.Stats().ByState {
				a.metrics.slots.WithLabelValues(state).Set(float64(n))
			}
		}
	}
	tick.Stop()
	kcancel()
	return true
}

// errLeaseExpired: etcd no longer holds the lease the agent had.
var errLeaseExpired = errors.New("agent: the lease expired")

// acquireLease renews last when there is one (kept: etcd still held it)
// or grants a new lease.
func (a *Agent) acquireLease(ctx context.Context, last clientv3.LeaseID, ttl time.Duration) (clientv3.LeaseID, bool, error) {
	if last != 0 {
		id, kept, err := a.renewOnce(ctx, last, ttl)
		if err != nil || kept {
			return id, kept, err
		}
	}
	gctx, cancel := context.WithTimeout(ctx, ttl)
	defer cancel()
	grant, err := a.etcd.Grant(gctx, int64(ttl/time.Second))
	if err != nil {
		if last != 0 {
			// The old one is gone: the next try grants, it renews no more.
			return 0, false, fmt.Errorf("%w; granting a new one: %w", errLeaseExpired, err)
		}
		return 0, false, err
	}
	return grant.ID, false, nil
}

// renewOnce renews lease once: kept when etcd still holds it, not kept
// (no error) when etcd says it expired; an error when etcd did not answer.
func (a *Agent) renewOnce(ctx context.Context, lease clientv3.LeaseID, ttl time.Duration) (clientv3.LeaseID, bool, error) {
	rctx, cancel := context.WithTimeout(ctx, ttl)
	defer cancel()
	resp, err := a.etcd.KeepAliveOnce(rctx, lease)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	case resp.TTL <= 0:
		return 0, false, nil
	}
	return lease, true, nil
}

// unfenceAll lets every running worker accept new requests again, at its
// generation: the lease it is registered under was never lost. A worker
// that cannot be told is re-registered at a new generation instead (or
// killed, and restarted at one): it must not stay fenced under a
// registration that says it is ready.
func (a *Agent) unfenceAll(ctx context.Context) {
	for _, inst := range a.running() {
		if _, err := a.admin(ctx, inst, true, 0); err != nil {
			a.log.Warn("cannot unfence worker; re-registering it", "instance_id", inst.id, "err", err)
			a.reregisterOne(ctx, inst)
		}
	}
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

// fenceAll tells every running worker to refuse new requests: the agent can
// no longer prove it is routable, so nothing should be routed to it, and a
// frontend with a stale view must be told so. In-flight work continues.
func (a *Agent) fenceAll(ctx context.Context) {
	for _, inst := range a.running() {
		if _, err := a.admin(ctx, inst, false, 0); err != nil {
			a.log.Warn("cannot fence worker", "instance_id", inst.id, "err", err)
		}
	}
}

// reregister gives every running instance a new generation after a lost
// lease: whatever happened while the agent was cut off, the instance comes
// back as a new endpoint, and frames of its old generation are stale.
func (a *Agent) reregister(ctx context.Context) {
	a.metrics.reregisters.Inc()
	for _, inst := range a.running() {
		a.reregisterOne(ctx, inst)
	}
}

// reregisterOne gives one running instance a new generation. An instance
// whose worker cannot be told is killed: a fenced worker must never be
// registered again at its old generation, and its restart brings it back
// at a new one.
func (a *Agent) reregisterOne(ctx context.Context, inst *instance) {
	a.mu.Lock()
	pid := inst.pid
	a.mu.Unlock()
	gen, err := a.nextGeneration(ctx, inst.id)
	if err == nil {
		_, err = a.admin(ctx, inst, true, gen)
	}
	a.mu.Lock()
	if inst.pid != pid {
		a.mu.Unlock()
		return // the worker changed meanwhile; the new one has its own generation
	}
	if err != nil {
		a.mu.Unlock()
		a.log.Warn("re-register failed; restarting the worker", "instance_id", inst.id, "err", err, "recovery_action", "restart")
		if p, ferr := os.FindProcess(pid); ferr == nil && pid != 0 {
			p.Kill()
		}
		return
	}
	inst.gen = max(inst.gen, gen)
	rec := inst.recordLocked()
	a.mu.Unlock()
	// In order, after the unlock: a save from a goroutine could land after
	// the worker's death had forgotten it.
	if st, err := processStartTime(rec.PID); err == nil {
		rec.StartTime = st
		a.saveWorker(rec)
	}
	a.emit(controlapi.Event{Kind: controlapi.EventReregistered, InstanceID: inst.id, Generation: gen})
}

func (a *Agent) running() []*instance {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*instance
	for _, inst := range a.instances {
		if inst.pid != 0 && inst.addr != "" {
			out = append(out, inst)
		}
	}
	return out
}

// admin sends an Admin request to an instance's worker.
// A worker a drain told to refuse new requests keeps refusing them.
func (a *Agent) admin(ctx context.Context, inst *instance, accepting bool, gen uint64) (*wire.HealthReply, error) {
	a.mu.Lock()
	refusing, draining := inst.refusing, inst.draining
	a.mu.Unlock()
	return a.callWorker(ctx, inst, func(ctx context.Context, c *workerclient.Client, cur uint64) (*wire.HealthReply, error) {
		return c.AdminWith(ctx, &wire.Admin{InstanceId: inst.id, CurrentGeneration: cur, Accepting: accepting && !refusing, Generation: gen,
			Draining: draining && refusing})
	})
}

// health asks an instance's worker for its state.
func (a *Agent) health(ctx context.Context, inst *instance) (*wire.HealthReply, error) {
	return a.callWorker(ctx, inst, func(ctx context.Context, c *workerclient.Client, _ uint64) (*wire.HealthReply, error) {
		return c.Health(ctx)
	})
}

// callWorker dials an instance's worker at the endpoint and generation the
// agent believes it has, so that a reused address never reaches another
// worker, and makes one call within 3 s.
func (a *Agent) callWorker(ctx context.Context, inst *instance, call func(context.Context, *workerclient.Client, uint64) (*wire.HealthReply, error)) (*wire.HealthReply, error) {
	a.mu.Lock()
	addr, cur := inst.addr, inst.gen
	a.mu.Unlock()
	if addr == "" {
		return nil, fmt.Errorf("agent: %s has no endpoint yet", inst.id)
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c, err := workerclient.DialFrom(cctx, net.ParseIP(a.opts.BindAddress), addr, a.tlsConf, inst.id, cur)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return call(cctx, c, cur)
}
