package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// The cluster's resume key ring lives at schema.ResumeKeysKey. The first
// frontend creates it (a transaction that creates only if missing, so
// racing frontends agree on one); every frontend loads it and watches it.

// ErrKeyRing is wrapped by failures to load or rotate the key ring.
var ErrKeyRing = errors.New("frontend: resume key ring")

// loadKeyRing creates the ring if it is absent, loads it into s.keys and
// returns the etcd revision it was read at.
func (s *Server) loadKeyRing(ctx context.Context) (int64, error) {
	b, _ := json.Marshal(schema.ResumeKeyRing{Keys: []schema.ResumeKey{newResumeKey()}})
	resp, err := s.etcd.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(schema.ResumeKeysKey), "=", 0)).
		Then(clientv3.OpPut(schema.ResumeKeysKey, string(b))).
		Else(clientv3.OpGet(schema.ResumeKeysKey)).Commit()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrKeyRing, err)
	}
	raw := b
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) != 1 {
			return 0, fmt.Errorf("%w: vanished while read", ErrKeyRing)
		}
		raw = kvs[0].Value
	}
	ring, err := schema.DecodeResumeKeyRing(raw)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrKeyRing, err)
	}
	s.keys.set(ring)
	return resp.Header.Revision, nil
}

// watchKeyRing applies every change of the ring from rev on until ctx
// ends; a broken watch is re-established (a compacted one re-reads).
func (s *Server) watchKeyRing(ctx context.Context, rev int64) {
	for ctx.Err() == nil {
		wch := s.etcd.Watch(clientv3.WithRequireLeader(ctx), schema.ResumeKeysKey, clientv3.WithRev(rev+1))
		for resp := range wch {
			if resp.CompactRevision != 0 || resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				ring, err := schema.DecodeResumeKeyRing(ev.Kv.Value)
				if err != nil {
					s.log.Error("frontend: ignoring a bad resume key ring", "err", err)
					continue
				}
				s.keys.set(ring)
			}
			rev = resp.Header.Revision
		}
		if sleep(ctx, syncRetry) != nil {
			return
		}
		gctx, cancel := context.WithTimeout(ctx, syncTimeout)
		r, err := s.loadKeyRing(gctx)
		cancel()
		if err == nil {
			rev = r
		}
	}
}

// RotateResumeKey puts a fresh key first in the cluster's ring and keeps
// the current one second (a compare-and-swap on the ring's revision):
// tokens signed with the previous key stay valid until the next rotation.
// It returns the new ring's key ids.
func RotateResumeKey(ctx context.Context, cli *clientv3.Client) ([]string, error) {
	for attempt := 0; attempt < 10; attempt++ {
		resp, err := cli.Get(ctx, schema.ResumeKeysKey)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrKeyRing, err)
		}
		var ring schema.ResumeKeyRing
		cmp := clientv3.Compare(clientv3.CreateRevision(schema.ResumeKeysKey), "=", 0)
		if len(resp.Kvs) == 1 {
			if ring, err = schema.DecodeResumeKeyRing(resp.Kvs[0].Value); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrKeyRing, err)
			}
			cmp = clientv3.Compare(clientv3.ModRevision(schema.ResumeKeysKey), "=", resp.Kvs[0].ModRevision)
		}
		next := rotated(ring)
		b, _ := json.Marshal(next)
		t, err := cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(schema.ResumeKeysKey, string(b))).Commit()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrKeyRing, err)
		}
		if t.Succeeded {
			ids := make([]string, len(next.Keys))
			for i, k := range next.Keys {
				ids[i] = k.ID
			}
			return ids, nil
		}
		time.Sleep(10 * time.Millisecond) // another rotation won: read again
	}
	return nil, fmt.Errorf("%w: rotation kept losing to concurrent ones", ErrKeyRing)
}
