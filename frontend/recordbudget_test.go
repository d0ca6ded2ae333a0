package frontend

import (
	"testing"
	"time"
)

// TestRecordBudget: bytes count until every record of their bucket has
// expired (the lease's TTL after a grant at most a rotation earlier);
// take refuses past the bound and says when room comes back; charge
// counts whatever the bound.
func TestRecordBudget(t *testing.T) {
	b := newRecordBudget(1000, time.Minute) // buckets of 15 s; bytes count 105 s
	now := t0
	if ok, _ := b.take(600, now); !ok {
		t.Fatal("600 of 1000 refused")
	}
	now = now.Add(20 * time.Second)
	if ok, retry := b.take(500, now); ok || retry != 85*time.Second {
		t.Fatalf("1100 of 1000: ok %v, retry %v (want refused, 85 s)", ok, retry)
	}
	b.charge(300, now)
	if got := b.live(now); got != 900 {
		t.Fatalf("live %d, want 900", got)
	}
	now = now.Add(85 * time.Second) // the first bucket has expired
	if got := b.live(now); got != 300 {
		t.Fatalf("after the first bucket expired: live %d, want 300", got)
	}
	if ok, _ := b.take(700, now); !ok {
		t.Fatal("1000 of 1000 refused")
	}
	if ok, _ := b.take(1, now); ok {
		t.Fatal("1001 of 1000 taken")
	}
}
