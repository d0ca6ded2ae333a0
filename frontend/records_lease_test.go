package frontend

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/internal/embedetcd"
)

// TestRecordLeasesHoldABoundedNumberOfRecords: etcd checks a put under a
// lease against every key the lease holds, so one lease per window/4
// made every admission write cost the records admitted before it in
// that window. No lease holds more than recordsPerLease records.
func TestRecordLeasesHoldABoundedNumberOfRecords(t *testing.T) {
	cli := testEtcd(t)
	ctx := context.Background()
	rc := &records{etcd: cli, window: time.Minute, m: newMetrics(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), owner: "f1"}
	const n = 3*recordsPerLease + 5
	for i := range n {
		if st := admitOne(ctx, rc, fmt.Sprintf("r%d", i)); st.rec.rev == 0 {
			t.Fatalf("record %d not written", i)
		}
	}
	ls, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, l := range ls.Leases {
		ttl, err := cli.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatal(err)
		}
		if len(ttl.Keys) > recordsPerLease {
			t.Errorf("lease %x holds %d records, want ≤ %d", l.ID, len(ttl.Keys), recordsPerLease)
		}
		total += len(ttl.Keys)
	}
	if want := (n + recordsPerLease - 1) / recordsPerLease; total != n || len(ls.Leases) != want {
		t.Fatalf("%d records under %d leases, want %d under %d", total, len(ls.Leases), n, want)
	}
}

// admitOne admits a resumable request id through rc and returns its
// stream (st.rec.rev is its record's revision, 0 if none was written).
func admitOne(ctx context.Context, rc *records, id string) *stream {
	st := newStream(id, CompletionRequest{Model: "m", Prompt: "p"}, false, true, func(error) {})
	st.rec = &recordState{stored: make(chan struct{})}
	now := time.Now()
	rc.admit(ctx, st, rc.newRecord(st, now.Add(time.Minute), now))
	return st
}

// testEtcd is a client of a real etcd (one member, in this process) that
// the test's cleanup stops.
func testEtcd(t *testing.T) *clientv3.Client {
	cli, _ := testEtcdServer(t)
	return cli
}

// testEtcdServer is testEtcd with its server, to stop it.
func testEtcdServer(t *testing.T) (*clientv3.Client, *embedetcd.Server) {
	t.Helper()
	e, err := embedetcd.Start(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli, e
}

// admitRecords is a records of owner f1 on cli with its admission
// writers running; a cleanup stops them and fails the test if one
// outlives its context.
func admitRecords(t *testing.T, cli *clientv3.Client) (*records, context.Context) {
	ctx, cancel := context.WithCancel(context.Background())
	var goes owned
	t.Cleanup(func() {
		cancel()
		if left := goes.wait(5 * time.Second); left != 0 {
			t.Errorf("%d writers outlived the context", left)
		}
	})
	rc := &records{goes: &goes, etcd: cli, window: time.Minute, m: newMetrics(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), owner: "f1", queue: newAdmitQueue()}
	for range admitWriters {
		goes.Go(func() { rc.queue.write(ctx, cli) })
	}
	return rc, ctx
}

// TestWarmLeaseServesTheFirstRecords: the lease granted at start (warm)
// is the one the first records are written under — the first admission
// after a start waits for its put alone, not a grant as well — and it
// holds recordsPerLease of them, as any other.
func TestWarmLeaseServesTheFirstRecords(t *testing.T) {
	cli := testEtcd(t)
	ctx := context.Background()
	rc := &records{etcd: cli, window: time.Minute, m: newMetrics(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), owner: "f1"}
	leases := func() []clientv3.LeaseStatus {
		ls, err := cli.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ls.Leases
	}
	rc.warm(ctx)
	warm := leases()
	if len(warm) != 1 {
		t.Fatalf("%d leases after warm, want 1", len(warm))
	}
	for i := range recordsPerLease + 1 {
		if st := admitOne(ctx, rc, fmt.Sprintf("r%d", i)); st.rec.rev == 0 {
			t.Fatalf("record %d not written", i)
		}
		if got := len(leases()); i < recordsPerLease && got != 1 {
			t.Fatalf("record %d: %d leases, want the warm one alone", i, got)
		}
	}
	ttl, err := cli.TimeToLive(ctx, warm[0].ID, clientv3.WithAttachedKeys())
	if err != nil {
		t.Fatal(err)
	}
	if len(ttl.Keys) != recordsPerLease || len(leases()) != 2 {
		t.Fatalf("the warm lease holds %d records, %d leases in all: want %d and 2", len(ttl.Keys), len(leases()), recordsPerLease)
	}
}

// TestAdmissionWritesShareTransactions: admissions that arrive together
// are written in fewer transactions than records (each transaction one
// etcd revision), every record stored under its key with its revision.
func TestAdmissionWritesShareTransactions(t *testing.T) {
	cli := testEtcd(t)
	rc, ctx := admitRecords(t, cli)
	rev0 := func() int64 {
		r, err := cli.Get(ctx, "x")
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	before := rev0()
	const n = 200
	sts := make([]*stream, n)
	var wg sync.WaitGroup
	for i := range sts {
		st := newStream(fmt.Sprintf("r%d", i), CompletionRequest{Model: "m", Prompt: "p"}, false, true, func(error) {})
		st.rec = &recordState{stored: make(chan struct{})}
		sts[i] = st
		wg.Go(func() {
			now := time.Now()
			rc.admit(ctx, st, rc.newRecord(st, now.Add(time.Minute), now))
		})
	}
	wg.Wait()
	revs := map[int64]bool{}
	for _, st := range sts {
		r, err := cli.Get(ctx, "/lifeline/v1/requests/"+st.id)
		if err != nil || len(r.Kvs) != 1 || st.rec.rev == 0 || r.Kvs[0].ModRevision != st.rec.rev {
			t.Fatalf("%s: stored at %v, kept revision %d (%v)", st.id, r.Kvs, st.rec.rev, err)
		}
		revs[st.rec.rev] = true
	}
	txns := rev0() - before
	t.Logf("%d records in %d transactions", n, len(revs))
	if len(revs) >= n || txns >= n {
		t.Fatalf("%d records took %d revisions: no transaction held two", n, txns)
	}
}

// TestAdmissionWritesWhenEtcdIsGone: with etcd stopped, queued admission
// writes fail within recordTimeout and their streams run without a
// record (the gate opens, counted as skipped); two admissions of the same
// key go in two transactions, not one etcd would refuse.
func TestAdmissionWritesWhenEtcdIsGone(t *testing.T) {
	cli, e := testEtcdServer(t)
	rc, ctx := admitRecords(t, cli)
	admitAll := func(ids ...string) []*stream {
		sts := make([]*stream, len(ids))
		var wg sync.WaitGroup
		for i, id := range ids {
			st := newStream(id, CompletionRequest{Model: "m", Prompt: "p"}, false, true, func(error) {})
			st.rec = &recordState{stored: make(chan struct{})}
			sts[i] = st
			wg.Go(func() {
				now := time.Now()
				rc.admit(ctx, st, rc.newRecord(st, now.Add(time.Minute), now))
			})
		}
		wg.Wait()
		return sts
	}
	// The same key queued twice before any writer runs: both stored, at
	// different revisions (one transaction with both, etcd refuses).
	q := newAdmitQueue()
	revs := make([]int64, 3)
	var wg sync.WaitGroup
	for i, key := range []string{"same", "same", "other"} {
		wg.Go(func() {
			rev, err := q.put(ctx, schema.RequestsPrefix+key, "{}", 0)
			if err != nil {
				t.Errorf("%s: %v", key, err)
			}
			revs[i] = rev
		})
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		q.mu.Lock()
		n := len(q.puts)
		q.mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 3 puts queued", n)
		}
		time.Sleep(time.Millisecond)
	}
	rc.goes.Go(func() { q.write(ctx, cli) })
	wg.Wait()
	if revs[0] == 0 || revs[1] == 0 || revs[0] == revs[1] {
		t.Fatalf("one key queued twice: revisions %v", revs)
	}
	e.Close()
	begin := time.Now()
	gone := admitAll("a", "b", "c", "d")
	if took := time.Since(begin); took > recordTimeout+time.Second {
		t.Fatalf("admissions with etcd gone took %v (bound %v)", took, recordTimeout)
	}
	for _, st := range gone {
		select {
		case <-st.rec.stored:
		default:
			t.Fatalf("%s: the gate stayed closed", st.id)
		}
		if st.rec.rev != 0 {
			t.Fatalf("%s: a record at revision %d with etcd stopped", st.id, st.rec.rev)
		}
	}
	skipped := -1.0
	mfs, _ := rc.m.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "lifeline_frontend_request_records_skipped_total" {
			skipped = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if skipped != float64(len(gone)) {
		t.Fatalf("skipped %v, want %d", skipped, len(gone))
	}
}
