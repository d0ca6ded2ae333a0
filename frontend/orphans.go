package frontend

import (
	"context"
	"encoding/json"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// A background response runs to its end with nobody following it, so no
// client's resume would take it over when its frontend dies. The other
// frontends do: each watches the frontend keys, and when one is deleted
// (its lease expired: the frontend is gone, or it stopped) every frontend
// tries to take over that frontend's running background responses from
// their records, one transaction each, so exactly one wins each; the
// winner attaches to the sequence still running on its worker (or
// regenerates it bit-identically) and drives it to its end, writing its
// record as the owner did. A frontend that comes back under the same id
// before its key expired adopts its own at start.

// watchOrphans follows the frontend keys from rev on until ctx ends.
func (s *Server) watchOrphans(ctx context.Context, rev int64) {
	for ctx.Err() == nil {
		wch := s.etcd.Watch(clientv3.WithRequireLeader(ctx), schema.FrontendsPrefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterPut())
		for resp := range wch {
			if resp.CompactRevision != 0 {
				// Deletions were lost: look at every running background
				// response whose owner has no key.
				rev = resp.CompactRevision - 1
				s.adoptOrphans(ctx, func(owner string) bool { return !s.ownerAlive(ctx, owner) })
				break
			}
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					gone := strings.TrimPrefix(string(ev.Kv.Key), schema.FrontendsPrefix)
					if gone != s.opts.ID {
						s.adoptOrphans(ctx, func(owner string) bool { return owner == gone })
					}
				}
			}
			rev = resp.Header.Revision
		}
		if sleep(ctx, syncRetry) != nil {
			return
		}
	}
}

// adoptOrphans takes over and drives every running background response
// whose owner orphaned says is gone.
func (s *Server) adoptOrphans(ctx context.Context, orphaned func(owner string) bool) {
	gctx, cancel := context.WithTimeout(ctx, syncTimeout)
	resp, err := s.etcd.Get(gctx, schema.RequestsPrefix, clientv3.WithPrefix())
	cancel()
	if err != nil {
		s.log.Warn("frontend: background responses of a gone frontend not read", "err", err)
		return
	}
	for _, kv := range resp.Kvs {
		rec, err := schema.DecodeRequestRecord(string(kv.Key), kv.Value)
		if err != nil || rec.Done || !background(rec) || !orphaned(rec.Owner) {
			continue
		}
		tctx, cancel := context.WithTimeout(ctx, takeoverTimeout)
		rs, won, err := s.recs.takeover(tctx, rec, kv.ModRevision)
		cancel()
		if err != nil || !won {
			continue // another frontend adopted it (or will)
		}
		if _, err := s.adopt(rs); err != nil {
			continue // ended for good, with its error in the record
		}
		s.metrics.takeovers.WithLabelValues("orphan").Inc()
		s.log.Info("frontend: adopted a background response", "request_id", rec.ID, "former_owner", rec.Owner)
	}
}

// background: rec is a background response's.
func background(rec schema.RequestRecord) bool {
	var b struct {
		Response *struct {
			Background bool `json:"background"`
		} `json:"response"`
	}
	return json.Unmarshal(rec.Body, &b) == nil && b.Response != nil && b.Response.Background
}
