package load

import (
	"testing"
	"time"
)

// TestHistogramQuantiles: every bucket's lower bound is within 1/16 below
// the values it holds, buckets are in order, and quantiles of a known
// distribution come out within that bound.
func TestHistogramQuantiles(t *testing.T) {
	for us := int64(0); us < 5_000_000; us = us*9/8 + 1 {
		d := time.Duration(us) * time.Microsecond
		i := bucket(d)
		lo := lower(i)
		if lo > d || float64(d-lo) > float64(d)/16+float64(time.Microsecond) {
			t.Fatalf("%v in bucket %d of lower bound %v", d, i, lo)
		}
		if i > 0 && lower(i-1) >= lo {
			t.Fatalf("bucket %d starts at %v, bucket %d at %v", i-1, lower(i-1), i, lo)
		}
	}
	var h Histogram
	if h.Quantile(0.5) != 0 {
		t.Fatal("an empty histogram has a median")
	}
	for ms := 1; ms <= 1000; ms++ {
		h.Add(time.Duration(ms) * time.Millisecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Millisecond}, {0.99, 990 * time.Millisecond}, {1, time.Second}} {
		got := h.Quantile(c.q)
		if got > c.want || c.want-got > c.want/16 {
			t.Fatalf("q%v = %v, want %v (within 1/16 below)", c.q, got, c.want)
		}
	}
}
