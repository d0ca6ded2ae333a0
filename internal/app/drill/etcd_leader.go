package drill

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
)

// leaderKill is what drill 8 saw of an etcd leader's SIGKILL.
type leaderKill struct {
	leader                    string
	killed, elected, rejoined time.Time
	bumped                    int
}

// killLeader SIGKILLs the etcd leader once every stream of l (running
// steadily) is under way, waits for the others to elect a new one, lets a
// load's worth of streams start and end on the smaller cluster, starts the
// killed member again (it rejoins) and returns the streams and how many
// registrations moved to a higher generation (a lost lease: none may).
func (c *Cluster) killLeader(ctx context.Context, l *Load, r *Recorder) (k leaderKill, _ []*Stream, err error) {
	gens, err := c.generations(ctx)
	if err != nil {
		return k, nil, err
	}
	rounds := l.CountRounds()
	under := allUnderWay(l)
	stop := l.Steady(ctx)
	defer func() {
		if err != nil {
			stop()
		}
	}()
	select {
	case <-under:
	case <-time.After(time.Minute):
		return k, nil, fmt.Errorf("drill: the load's streams did not all get under way within a minute")
	}
	leader, id, err := c.etcdLeader(ctx, c.env.Members)
	if err != nil {
		return k, nil, err
	}
	k.leader, k.killed = leader.Name, time.Now()
	rounds.Mark(k.killed)
	leader.Kill()
	r.Event(k.killed, EvFault, "SIGKILL the etcd leader %s", leader.Name)
	var rest []*localcluster.EtcdMember
	for _, m := range c.env.Members {
		if m != leader {
			rest = append(rest, m)
		}
	}
	if k.elected, err = c.newLeader(ctx, rest, id); err != nil {
		return k, nil, err
	}
	r.Event(k.elected, EvRecovered, "a new etcd leader elected")
	select {
	case <-rounds.Enough():
	case <-time.After(time.Minute):
		return k, nil, fmt.Errorf("drill: %d streams started after the leader's kill did not end within a minute", l.Spec().Streams)
	}
	if err := leader.Restart(); err != nil {
		return k, nil, err
	}
	k.rejoined = time.Now()
	r.Event(k.rejoined, EvRecovered, "%s started again and serving", leader.Name)
	streams := stop()
	now, err := c.generations(ctx)
	if err != nil {
		return k, nil, err
	}
	for id, g := range now {
		if g > gens[id] {
			k.bumped++
		}
	}
	return k, streams, nil
}

// newLeader waits until one of ms leads, other than old (30 s at most).
func (c *Cluster) newLeader(ctx context.Context, ms []*localcluster.EtcdMember, old uint64) (time.Time, error) {
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, id, err := c.etcdLeader(ctx, ms); err == nil && id != old {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("drill: no new etcd leader 30 s after the old one was killed")
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// etcdLeader is the member of ms that leads, with its member id.
func (c *Cluster) etcdLeader(ctx context.Context, ms []*localcluster.EtcdMember) (*localcluster.EtcdMember, uint64, error) {
	var last error
	for _, m := range ms {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := c.Etcd.Status(sctx, m.Endpoint)
		cancel()
		if err != nil {
			last = err
			continue
		}
		if st.Leader == 0 {
			last = fmt.Errorf("%s knows no leader", m.Name)
			continue
		}
		if st.Header.MemberId == st.Leader {
			return m, st.Leader, nil
		}
		last = fmt.Errorf("%s follows %x", m.Name, st.Leader)
	}
	return nil, 0, fmt.Errorf("drill: no etcd leader among %d members: %v", len(ms), last)
}

// generations reads every registration's generation.
func (c *Cluster) generations(ctx context.Context) (map[string]uint64, error) {
	resp, err := c.Etcd.Get(ctx, schema.InstancesPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("drill: etcd: %w", err)
	}
	gens := map[string]uint64{}
	for _, kv := range resp.Kvs {
		var reg schema.Registration
		if json.Unmarshal(kv.Value, &reg) == nil {
			gens[reg.InstanceID] = reg.Generation
		}
	}
	return gens, nil
}

// allUnderWay installs l.OnToken to close the returned channel once
// every stream of l received a token.
func allUnderWay(l *Load) <-chan struct{} {
	var (
		mu       sync.Mutex
		underWay = map[int]bool{}
		all      = make(chan struct{})
	)
	l.OnToken = func(s *Stream, t Tok) {
		mu.Lock()
		defer mu.Unlock()
		if !underWay[s.Index] {
			if underWay[s.Index] = true; len(underWay) == l.Spec().Streams {
				close(all)
			}
		}
	}
	return all
}
