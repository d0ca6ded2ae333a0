package frontend

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// recorder is an acknowledgement store that records what it was given.
type recorder struct {
	mu     sync.Mutex
	writes []int64
	fail   bool
}

func (r *recorder) put(_ context.Context, rev int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail {
		return context.DeadlineExceeded
	}
	r.writes = append(r.writes, rev)
	return nil
}

func (r *recorder) got() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.writes...)
}

func waitWrites(t *testing.T, r *recorder, want []int64) {
	t.Helper()
	proctest.WaitFor(t, 5*time.Second, fmt.Sprintf("acknowledgements %v", want), func() (bool, string) {
		got := r.got()
		return slices.Equal(got, want), fmt.Sprint(got)
	})
}

func TestAckerCoalescesAndWritesOnlyChanges(t *testing.T) {
	r := &recorder{}
	// A long window: every apply below lands within one.
	a := newAcker(r.put, 50*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.run(ctx)
	for rev := int64(1); rev <= 100; rev++ {
		a.apply(rev)
	}
	waitWrites(t, r, []int64{100})
	// Older or equal revisions change nothing: no write.
	a.apply(100)
	a.apply(42)
	a.signal()
	proctest.Never(t, 200*time.Millisecond, "a write of an unchanged acknowledgement (four windows)", func() (bool, string) {
		got := r.got()
		return len(got) != 1, fmt.Sprint(got)
	})
	a.apply(101)
	waitWrites(t, r, []int64{100, 101})
}

func TestAckerHeldBackBySendsUnderAnOlderView(t *testing.T) {
	r := &recorder{}
	a := newAcker(r.put, time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.run(ctx)
	a.apply(10)
	waitWrites(t, r, []int64{10})
	done := a.send() // checked the view at 10
	a.apply(20)
	if rev, _ := a.ack(); rev != 10 {
		t.Fatalf("ack %d while a send under revision 10 is on its way, want 10", rev)
	}
	done()
	waitWrites(t, r, []int64{10, 20})
}

func TestAckerRetriesAFailedWriteAndRewritesALostRecord(t *testing.T) {
	r := &recorder{fail: true}
	a := newAcker(r.put, time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.run(ctx)
	a.apply(7)
	proctest.WaitFor(t, 5*time.Second, "a failed write", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.stale, "not yet"
	})
	r.mu.Lock()
	r.fail = false
	r.mu.Unlock()
	waitWrites(t, r, []int64{7}) // the retry after syncRetry
	a.rewrite()                  // the lease went, and the record with it
	waitWrites(t, r, []int64{7, 7})
}

// TestFrontendKeyKeepsOneLease: a record write that fails for any reason
// but the lease keeps the lease (a new one granted on every timeout was
// one more lease kept alive for good); a lease that is gone (revoked) is
// replaced, the record is written under the new one, and one lease is
// left in etcd either way.
func TestFrontendKeyKeepsOneLease(t *testing.T) {
	cli := testEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var goes owned
	defer func() {
		cancel()
		if left := goes.wait(5 * time.Second); left != 0 {
			t.Errorf("%d keepalive goroutines outlived the context", left)
		}
	}()
	k := &frontendKey{goes: &goes, etcd: cli, id: "f1"}
	leases := func() []clientv3.LeaseID {
		t.Helper()
		r, err := cli.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []clientv3.LeaseID
		for _, l := range r.Leases {
			ids = append(ids, l.ID)
		}
		return ids
	}
	if err := k.put(ctx, 1); err != nil {
		t.Fatal(err)
	}
	first := leases()
	if len(first) != 1 {
		t.Fatalf("after the first write: leases %v", first)
	}
	// Writes that fail on their deadline, as while etcd elects a leader.
	for rev := int64(2); rev < 5; rev++ {
		dead, stop := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		if err := k.put(dead, rev); err == nil {
			t.Fatal("a write past its deadline succeeded")
		}
		stop()
	}
	if err := k.put(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if got := leases(); !slices.Equal(got, first) {
		t.Fatalf("after three failed writes and one more: leases %v, want still %v", got, first)
	}
	// The lease goes: the next write fails, the one after that is under a
	// new lease, and the old one's keep-alive is gone with it.
	if _, err := cli.Revoke(ctx, first[0]); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, 10*time.Second, "the record under a new lease", func() (bool, string) {
		err := k.put(ctx, 6)
		got := leases()
		return err == nil && len(got) == 1 && got[0] != first[0], fmt.Sprintf("write: %v, leases %v", err, got)
	})
	r, err := cli.Get(ctx, schema.FrontendsPrefix+"f1")
	if err != nil || len(r.Kvs) != 1 || r.Kvs[0].Lease != int64(leases()[0]) {
		t.Fatalf("the record: %v %+v", err, r)
	}
}
