package frontend

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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
		st := newStream(fmt.Sprintf("r%d", i), CompletionRequest{Model: "m", Prompt: "p"}, false, true, func(error) {})
		st.rec = &recordState{stored: make(chan struct{})}
		now := time.Now()
		rc.admit(ctx, st, rc.newRecord(st, now.Add(time.Minute), now))
		if st.rec.rev == 0 {
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

// testEtcd is a client of a real etcd (one member, in this process) that
// the test's cleanup stops.
func testEtcd(t *testing.T) *clientv3.Client {
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
	return cli
}
