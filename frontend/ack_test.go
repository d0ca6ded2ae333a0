package frontend

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/internal/proctest"
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
