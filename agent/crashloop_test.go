package agent

import (
	"testing"
	"time"
)

// TestRestartHistory: exits back off exponentially; more than the limit
// within the window make a crash loop whose cool-down doubles with every
// crash loop in a row up to its cap; a worker that ran a whole window, or
// an operator's reset, starts the count over.
func TestRestartHistory(t *testing.T) {
	opts := Options{RestartBackoff: Duration(100 * time.Millisecond), RestartMax: Duration(300 * time.Millisecond),
		CrashLoopLimit: 2, CrashLoopWindow: Duration(time.Minute),
		CrashLoopCooldown: Duration(10 * time.Second), CrashLoopCooldownMax: Duration(35 * time.Second)}
	h := newRestartHistory(&opts)
	now := time.Unix(1000, 0)
	exit := func(ran time.Duration) (time.Duration, time.Duration) {
		now = now.Add(ran)
		return h.exited(now.Add(-ran), now)
	}
	type want struct{ backoff, cooldown time.Duration }
	check := func(step string, got1, got2 time.Duration, w want) {
		t.Helper()
		if got1 != w.backoff || got2 != w.cooldown {
			t.Fatalf("%s: backoff %v cooldown %v, want %v %v", step, got1, got2, w.backoff, w.cooldown)
		}
	}
	b, c := exit(time.Second)
	check("first exit", b, c, want{100 * time.Millisecond, 0})
	b, c = exit(time.Second)
	check("second exit", b, c, want{200 * time.Millisecond, 0})
	b, c = exit(time.Second)
	check("third exit: a crash loop", b, c, want{0, 10 * time.Second})
	for i, cool := range []time.Duration{20 * time.Second, 35 * time.Second, 35 * time.Second} {
		exit(time.Second)
		exit(time.Second)
		b, c = exit(time.Second)
		check("crash loop in a row", b, c, want{0, cool})
		if h.loops != i+2 {
			t.Fatalf("loops %d", h.loops)
		}
	}
	h.operatorReset()
	exit(time.Second)
	exit(time.Second)
	b, c = exit(time.Second)
	check("after a reset", b, c, want{0, 10 * time.Second})
	// A worker that ran longer than the window was healthy.
	b, c = exit(2 * time.Minute)
	check("after a healthy run", b, c, want{100 * time.Millisecond, 0})
	if h.loops != 0 {
		t.Fatalf("loops after a healthy run: %d", h.loops)
	}
	// Exits spread wider than the window never make a crash loop.
	for i := 0; i < 10; i++ {
		now = now.Add(40 * time.Second)
		if _, c := h.exited(now.Add(-time.Second), now); c != 0 {
			t.Fatalf("spread exits: crash loop at exit %d", i)
		}
	}
}
