package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// acks is what a drain learnt from the frontends: how many were live,
// how many acknowledged its draining registrations, and how long that
// took.
type acks struct {
	frontends, acked int
	all              bool
	took             time.Duration
}

func (k acks) String() string {
	if k.all {
		return fmt.Sprintf("%d/%d frontends acknowledged in %v", k.acked, k.frontends, k.took.Round(time.Millisecond))
	}
	return fmt.Sprintf("%d/%d frontends acknowledged within the settle bound %v", k.acked, k.frontends, k.took.Round(time.Millisecond))
}

// drainingRevision is the etcd revision of this node's newest draining
// registration: a frontend whose acknowledged revision reaches it routes
// nothing new here. 0 when none is in etcd.
func (a *Agent) drainingRevision(ctx context.Context) (int64, error) {
	resp, err := a.etcd.Get(ctx, schema.InstancesPrefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("read the registrations: %w", err)
	}
	var rev int64
	for _, kv := range resp.Kvs {
		var r schema.Registration
		if json.Unmarshal(kv.Value, &r) == nil && r.Node == a.opts.NodeID && r.Draining {
			rev = max(rev, kv.ModRevision)
		}
	}
	return rev, nil
}

// awaitAcks waits, at most bound, until every live frontend acknowledged
// revision rev. Frontends that go meanwhile are not waited for; with none
// it returns at once.
func (a *Agent) awaitAcks(ctx context.Context, rev int64, bound time.Duration) acks {
	began := time.Now()
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	applied := map[string]int64{}
	k := acks{}
	count := func() bool {
		k.frontends, k.acked = len(applied), 0
		for _, r := range applied {
			if r >= rev {
				k.acked++
			}
		}
		k.all, k.took = k.acked == k.frontends, time.Since(began)
		return k.all
	}
	resp, err := a.etcd.Get(wctx, schema.FrontendsPrefix, clientv3.WithPrefix())
	if err != nil {
		<-wctx.Done() // cannot tell: the bound it is
		k.took = time.Since(began)
		return k
	}
	for _, kv := range resp.Kvs {
		applied[string(kv.Key)] = appliedRevision(kv.Value)
	}
	if count() {
		return k
	}
	for wr := range a.etcd.Watch(wctx, schema.FrontendsPrefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				delete(applied, string(ev.Kv.Key))
			} else {
				applied[string(ev.Kv.Key)] = appliedRevision(ev.Kv.Value)
			}
		}
		if count() {
			return k
		}
	}
	count()
	k.all, k.took = false, time.Since(began)
	return k
}

func appliedRevision(b []byte) int64 {
	var r schema.FrontendRecord
	if json.Unmarshal(b, &r) != nil {
		return 0
	}
	return r.AppliedRevision
}

// settleWait is the settle step's wait: until every live frontend has
// acknowledged the draining registrations, at most bound. Without a
// draining registration in etcd there is nothing to acknowledge; when the
// registrations cannot be read the bound is waited out.
func (a *Agent) settleWait(ctx context.Context, bound time.Duration) acks {
	began := time.Now()
	rctx, cancel := context.WithTimeout(ctx, bound)
	rev, err := a.drainingRevision(rctx)
	cancel()
	switch {
	case err != nil:
		a.log.Warn("drain: cannot tell which revision frontends must acknowledge; waiting the settle bound", "err", err)
		sleepCtx(ctx, time.Until(began.Add(bound)))
		return acks{took: time.Since(began)}
	case rev == 0:
		return acks{all: true}
	}
	k := a.awaitAcks(ctx, rev, time.Until(began.Add(bound)))
	k.took = time.Since(began)
	return k
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
