package proctest

import (
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	n := 0
	last, ok := Poll(time.Second, func() (bool, string) { n++; return n == 3, "third" })
	if !ok || last != "third" || n != 3 {
		t.Fatalf("Poll: ok %v, last %q after %d calls", ok, last, n)
	}
	start := time.Now()
	if _, ok := Poll(50*time.Millisecond, func() (bool, string) { return false, "" }); ok {
		t.Fatal("Poll reported a condition that never held")
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("Poll gave up after %v, before its timeout", d)
	}
}
