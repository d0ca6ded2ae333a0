package frontend

import (
	"context"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Admission records are written in groups: an admission queues its put,
// and admitWriters writers each take the puts queued (up to
// admitBatchOps puts and admitBatchBytes bytes) into one etcd
// transaction. An idle frontend's put goes alone at once; under load the
// puts that queue while transactions are in flight share the next one,
// so that etcd sees a transaction (one revision, one raft entry) per
// round trip instead of a request per admission. Each record is its own
// key under its own lease, as if put alone; the transaction's revision is
// each key's ModRevision.
const (
	admitWriters    = 4
	admitBatchOps   = 128     // etcd's default --max-txn-ops
	admitBatchBytes = 1 << 20 // under etcd's default request limit (1.5 MiB)
)

// queuedPut is one admission write waiting for a transaction.
type queuedPut struct {
	ctx  context.Context // the admission's: a put it gave up on is not sent
	key  string
	op   clientv3.Op
	size int
	done chan struct{}
	rev  int64
	err  error
}

// admitQueue holds admission puts for the writers.
type admitQueue struct {
	mu     sync.Mutex
	puts   []*queuedPut
	notify chan struct{} // holds a token while puts may not be empty
}

func newAdmitQueue() *admitQueue { return &admitQueue{notify: make(chan struct{}, 1)} }

func (q *admitQueue) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// put queues a write of key and waits for its transaction (or ctx).
func (q *admitQueue) put(ctx context.Context, key, val string, lease clientv3.LeaseID) (int64, error) {
	p := &queuedPut{ctx: ctx, key: key, op: clientv3.OpPut(key, val, clientv3.WithLease(lease)), size: len(key) + len(val), done: make(chan struct{})}
	q.mu.Lock()
	q.puts = append(q.puts, p)
	q.mu.Unlock()
	q.wake()
	select {
	case <-p.done:
		return p.rev, p.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// take removes the next group of puts whose admissions still wait: no
// key twice (etcd refuses a transaction that puts a key twice).
func (q *admitQueue) take() []*queuedPut {
	q.mu.Lock()
	defer q.mu.Unlock()
	var group []*queuedPut
	keys := map[string]bool{}
	size, n := 0, 0
	for _, p := range q.puts {
		if len(group) == admitBatchOps || keys[p.key] || (len(group) > 0 && size+p.size > admitBatchBytes) {
			break
		}
		n++
		if p.ctx.Err() != nil {
			continue // given up: its stream runs without a record
		}
		group, size, keys[p.key] = append(group, p), size+p.size, true
	}
	q.puts = q.puts[n:]
	if len(q.puts) > 0 {
		q.wake() // for another writer
	}
	return group
}

// write sends queued puts, a group per transaction, until ctx ends.
func (q *admitQueue) write(ctx context.Context, kv clientv3.KV) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.notify:
		}
		group := q.take()
		if len(group) == 0 {
			continue
		}
		ops := make([]clientv3.Op, len(group))
		for i, p := range group {
			ops[i] = p.op
		}
		tctx, cancel := context.WithTimeout(ctx, recordTimeout)
		resp, err := kv.Txn(tctx).Then(ops...).Commit()
		cancel()
		for _, p := range group {
			if p.err = err; err == nil {
				p.rev = resp.Header.Revision
			}
			close(p.done)
		}
	}
}
