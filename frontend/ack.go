package frontend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
)

// The frontend tells draining agents what its routing view holds: under
// its own lease it keeps a FrontendRecord whose AppliedRevision is the etcd
// revision up to which it applied the instances' registrations and has no
// request picked under an older view still on its way to a worker. An
// agent that marked its registrations draining at revision R knows that,
// once every frontend reports R or more, nothing new comes its way.

// ackEvery coalesces acknowledgements: a burst of watch events costs one
// write, at most every ackEvery.
const ackEvery = 5 * time.Millisecond

// frontendTTL is the frontend key's lease: a frontend gone this long is no
// longer waited for.
const frontendTTL = 5

// acker computes and writes the frontend's acknowledgement.
type acker struct {
	mu      sync.Mutex
	applied int64
	// sending counts the dispatches on their way to a worker by the
	// revision applied when they checked the view.
	sending map[int64]int
	kick    chan struct{}
	// write stores an acknowledgement; written is the last stored.
	write   func(ctx context.Context, rev int64) error
	written int64
	// stale: the stored record is gone (its lease was lost); write again.
	stale bool
	every time.Duration
}

func newAcker(write func(ctx context.Context, rev int64) error, every time.Duration) *acker {
	return &acker{sending: map[int64]int{}, kick: make(chan struct{}, 1), write: write, every: every}
}

// apply records that the view holds every registration up to rev.
func (a *acker) apply(rev int64) {
	a.mu.Lock()
	if rev > a.applied {
		a.applied = rev
	}
	a.mu.Unlock()
	a.signal()
}

// send registers a dispatch about to check the view and call a worker; the
// acknowledgement stays below the revision it saw until done is called.
func (a *acker) send() (done func()) {
	a.mu.Lock()
	rev := a.applied
	a.sending[rev]++
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		if a.sending[rev]--; a.sending[rev] <= 0 {
			delete(a.sending, rev)
		}
		a.mu.Unlock()
		a.signal()
	}
}

// rewrite makes the next acknowledgement a write even if unchanged: the
// record went with a lost lease.
func (a *acker) rewrite() {
	a.mu.Lock()
	a.stale = true
	a.mu.Unlock()
	a.signal()
}

func (a *acker) signal() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// ack is what the frontend may acknowledge now: the applied revision,
// held back by the oldest dispatch still on its way, and whether the
// record must be written even if unchanged (it clears that flag).
func (a *acker) ack() (int64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	rev := a.applied
	for r := range a.sending {
		rev = min(rev, r)
	}
	stale := a.stale
	a.stale = false
	return rev, stale
}

// run writes the acknowledgement when it changed, coalescing changes
// within a.every, until ctx ends. A failed write is retried.
func (a *acker) run(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.kick:
		case <-retry.C:
		}
		if sleep(ctx, a.every) != nil {
			return
		}
		rev, stale := a.ack()
		if rev == a.written && !stale {
			continue
		}
		if err := a.write(ctx, rev); err != nil {
			a.mu.Lock()
			a.stale = true
			a.mu.Unlock()
			retry.Reset(syncRetry)
			continue
		}
		a.written = rev
	}
}

// frontendKey keeps the frontend's record in etcd under its own lease.
type frontendKey struct {
	goes *owned // the server's
	etcd *clientv3.Client
	id   string
	// lost is called when the lease is lost: the record went with it.
	lost  func()
	mu    sync.Mutex
	lease clientv3.LeaseID
	// stopAlive ends the keep-alive of lease.
	stopAlive context.CancelFunc
}

// put stores the record at rev, granting a lease (and keeping it alive)
// first if there is none or it was lost.
func (k *frontendKey) put(ctx context.Context, rev int64) error {
	b, err := json.Marshal(schema.FrontendRecord{ID: k.id, AppliedRevision: rev, UpdatedUnixNano: time.Now().UnixNano()})
	if err != nil {
		return err
	}
	lease, err := k.leaseID(ctx)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if _, err := k.etcd.Put(pctx, schema.FrontendsPrefix+k.id, string(b), clientv3.WithLease(lease)); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			k.drop(lease) // expired or revoked: grant another on the retry
		}
		// Any other failure (a timeout while etcd elects a leader) keeps
		// the lease: it is still kept alive, and a new one granted on
		// every failure would be one more lease kept alive for good.
		return fmt.Errorf("frontend: acknowledge revision %d: %w", rev, err)
	}
	return nil
}

// drop forgets lease, if it is still the current one, and stops keeping
// it alive.
func (k *frontendKey) drop(lease clientv3.LeaseID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lease == lease {
		k.lease = 0
		k.stopAlive()
	}
}

func (k *frontendKey) leaseID(ctx context.Context) (clientv3.LeaseID, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lease != 0 {
		return k.lease, nil
	}
	gctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	g, err := k.etcd.Grant(gctx, frontendTTL)
	if err != nil {
		return 0, fmt.Errorf("frontend: lease: %w", err)
	}
	actx, stop := context.WithCancel(ctx)
	alive, err := k.etcd.KeepAlive(actx, g.ID)
	if err != nil {
		stop()
		return 0, fmt.Errorf("frontend: keep the lease alive: %w", err)
	}
	k.lease, k.stopAlive = g.ID, stop
	k.goes.Go(func() {
		for range alive {
		}
		stop()
		if ctx.Err() != nil {
			// The frontend stops: the lease stays the current one, for
			// revoke to take the record with it (forgotten here, the
			// record stayed its TTL and draining agents waited for a
			// frontend that was gone).
			return
		}
		k.mu.Lock()
		mine := k.lease == g.ID
		if mine {
			k.lease = 0
		}
		k.mu.Unlock()
		if mine && k.lost != nil {
			k.lost()
		}
	})
	return g.ID, nil
}

// revoke removes the record at once when the frontend stops, so agents
// stop waiting for it.
func (k *frontendKey) revoke() {
	k.mu.Lock()
	lease := k.lease
	k.mu.Unlock()
	if lease == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	k.etcd.Revoke(ctx, lease)
}

// defaultFrontendID names a frontend that was given no id: host, process
// and a random suffix, unique among replicas.
func defaultFrontendID() string {
	host, _ := os.Hostname()
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
