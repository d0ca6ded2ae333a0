package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// budgetTimeout bounds each etcd exchange about the disruption budget.
const budgetTimeout = 2 * time.Second

// budgetAnswer is the outcome of an attempt to take a share of the
// cluster's disruption budget.
type budgetAnswer struct {
	taken bool
	// max is max_unavailable; holders are the nodes holding shares.
	max     int
	holders []schema.DrainHolder
	// mineLease and mineRev are the lease and ModRevision of this node's
	// own share, if it holds one.
	mineLease clientv3.LeaseID
	mineRev   int64
}

func (b budgetAnswer) String() string {
	var names []string
	for _, h := range b.holders {
		names = append(names, fmt.Sprintf("%s (%s, since %s)", h.Node, h.Trigger, time.Unix(0, h.SinceUnixNano).Format(time.TimeOnly)))
	}
	return fmt.Sprintf("max_unavailable %d, held by %s", b.max, strings.Join(names, ", "))
}

// takeBudget takes a share of the disruption budget for this node, under
// its lease, unless max_unavailable nodes hold one already. The share is
// added with a transaction that fails if any holder was added since the
// holders were counted (a removed one only frees room); a lost race is
// counted again. Taking a share the node already holds succeeds; one held
// under another lease (a previous agent process's, which expires) is
// moved under this one.
func (a *Agent) takeBudget(ctx context.Context, trigger string) (budgetAnswer, error) {
	a.mu.Lock()
	lease := a.lease
	a.mu.Unlock()
	if lease == 0 {
		return budgetAnswer{}, fmt.Errorf("agent: no etcd lease: cannot take a share of the disruption budget")
	}
	ctx, cancel := context.WithTimeout(ctx, budgetTimeout)
	defer cancel()
	mine := schema.DrainHoldersPrefix + a.opts.NodeID
	for {
		ans, rev, err := a.readBudget(ctx)
		if err != nil {
			return ans, err
		}
		b, _ := json.Marshal(schema.DrainHolder{Node: a.opts.NodeID, Trigger: trigger, SinceUnixNano: time.Now().UnixNano()})
		var cmp []clientv3.Cmp
		switch {
		case ans.mineRev != 0 && ans.mineLease == lease:
			ans.taken = true
			return ans, nil
		case ans.mineRev != 0:
			cmp = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(mine), "=", ans.mineRev)}
		case len(ans.holders) >= ans.max:
			return ans, nil
		default:
			cmp = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(schema.DrainHoldersPrefix), "<", rev+1).WithPrefix(),
				clientv3.Compare(clientv3.ModRevision(schema.MaxUnavailableKey), "<", rev+1)}
		}
		resp, err := a.etcd.Txn(ctx).If(cmp...).Then(clientv3.OpPut(mine, string(b), clientv3.WithLease(lease))).Commit()
		if err != nil {
			return ans, fmt.Errorf("agent: disruption budget: %w", err)
		}
		if resp.Succeeded {
			ans.taken = true
			return ans, nil
		}
	}
}

// readBudget reads max_unavailable and the holders, and the revision they
// were read at.
func (a *Agent) readBudget(ctx context.Context) (budgetAnswer, int64, error) {
	resp, err := a.etcd.Txn(ctx).Then(clientv3.OpGet(schema.MaxUnavailableKey),
		clientv3.OpGet(schema.DrainHoldersPrefix, clientv3.WithPrefix())).Commit()
	if err != nil {
		return budgetAnswer{}, 0, fmt.Errorf("agent: disruption budget: %w", err)
	}
	ans := budgetAnswer{max: 1}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		n, err := strconv.Atoi(strings.TrimSpace(string(kvs[0].Value)))
		if err != nil || n < 1 {
			return ans, 0, fmt.Errorf("agent: %s is %q: want a positive integer", schema.MaxUnavailableKey, kvs[0].Value)
		}
		ans.max = n
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var h schema.DrainHolder
		if json.Unmarshal(kv.Value, &h) != nil || h.Node == "" {
			h.Node = strings.TrimPrefix(string(kv.Key), schema.DrainHoldersPrefix)
		}
		if string(kv.Key) == schema.DrainHoldersPrefix+a.opts.NodeID {
			ans.mineLease, ans.mineRev = clientv3.LeaseID(kv.Lease), kv.ModRevision
		}
		ans.holders = append(ans.holders, h)
	}
	sort.Slice(ans.holders, func(i, j int) bool { return ans.holders[i].Node < ans.holders[j].Node })
	return ans, resp.Header.Revision, nil
}

// releaseBudget gives the node's share of the disruption budget back.
func (a *Agent) releaseBudget(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, budgetTimeout)
	defer cancel()
	if _, err := a.etcd.Delete(ctx, schema.DrainHoldersPrefix+a.opts.NodeID); err != nil {
		return fmt.Errorf("agent: give back the disruption budget: %w", err)
	}
	return nil
}
