package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"github.com/dgraph-io/badger/v4"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/failpoint"
)

// FailBeforeGenerationPersist is hit after etcd granted a generation and
// before the agent's Badger records it.
const FailBeforeGenerationPersist = "agent.before-generation-persist"

func genKey(instance string) []byte { return []byte("gen/" + instance) }

func (a *Agent) localGeneration(instance string) (uint64, error) {
	var g uint64
	err := a.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(genKey(instance))
		if err == badger.ErrKeyNotFound {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if len(v) == 8 {
				g = binary.BigEndian.Uint64(v)
			}
			return nil
		})
	})
	return g, err
}

// nextGeneration returns a generation strictly higher than any this
// instance ever had, here or on another host: max(local, etcd) + 1,
// written to etcd with a compare-and-swap on the key's revision and then
// to Badger.
func (a *Agent) nextGeneration(ctx context.Context, instance string) (uint64, error) {
	local, err := a.localGeneration(instance)
	if err != nil {
		return 0, fmt.Errorf("agent: read generation of %s: %w", instance, err)
	}
	key := schema.GenerationsPrefix + instance
	var next uint64
	for attempt := 0; ; attempt++ {
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := a.etcd.Get(tctx, key)
		if err != nil {
			cancel()
			return 0, fmt.Errorf("agent: generation of %s: %w", instance, err)
		}
		var remote uint64
		rev := int64(0)
		if len(resp.Kvs) == 1 {
			if remote, err = strconv.ParseUint(string(resp.Kvs[0].Value), 10, 64); err != nil {
				cancel()
				return 0, fmt.Errorf("agent: generation of %s in etcd is %q: %w", instance, resp.Kvs[0].Value, err)
			}
			rev = resp.Kvs[0].ModRevision
		}
		next = max(local, remote) + 1
		txn, err := a.etcd.Txn(tctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, strconv.FormatUint(next, 10))).
			Commit()
		cancel()
		if err != nil {
			return 0, fmt.Errorf("agent: bump generation of %s: %w", instance, err)
		}
		if txn.Succeeded {
			break
		}
		if attempt > 100 {
			return 0, fmt.Errorf("agent: bump generation of %s: too much contention", instance)
		}
	}
	failpoint.Hit(FailBeforeGenerationPersist)
	// Only ever raise the local record, even if two bumps race.
	err = a.db.Update(func(txn *badger.Txn) error {
		if item, err := txn.Get(genKey(instance)); err == nil {
			var cur uint64
			item.Value(func(v []byte) error {
				if len(v) == 8 {
					cur = binary.BigEndian.Uint64(v)
				}
				return nil
			})
			if cur >= next {
				return nil
			}
		}
		return txn.Set(genKey(instance), binary.BigEndian.AppendUint64(nil, next))
	})
	if err != nil {
		return 0, fmt.Errorf("agent: persist generation of %s: %w", instance, err)
	}
	return next, nil
}
