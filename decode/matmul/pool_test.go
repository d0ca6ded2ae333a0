package matmul

import (
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestParallelRunsEachPartOnce: every part runs exactly once, whether the
// helpers are awake, parked, or busy with another caller's job (which then
// runs on goroutines of its own).
func TestParallelRunsEachPartOnce(t *testing.T) {
	var wg sync.WaitGroup
	for c := 0; c < 4; c++ {
		wg.Go(func() {
			for round := 0; round < 200; round++ {
				n := 1 + (round+c)%7
				counts := make([]atomic.Int32, n)
				Parallel(n, func(part int) { counts[part].Add(1) })
				for i := range counts {
					if got := counts[i].Load(); got != 1 {
						t.Errorf("caller %d round %d: part %d ran %d times", c, round, i, got)
						return
					}
				}
				if round%50 == 0 {
					// Let the helpers park, so the next job wakes them.
					time.Sleep(2 * spinFor)
				}
			}
		})
	}
	wg.Wait()
}

// TestParallelStartsNoGoroutines: the helpers are started once; jobs, and
// the helpers parking between them, add none.
func TestParallelStartsNoGoroutines(t *testing.T) {
	Parallel(2, func(int) {})
	base := runtime.NumGoroutine()
	for i := 0; i < 100; i++ {
		Parallel(runtime.GOMAXPROCS(0), func(int) {})
	}
	time.Sleep(2 * spinFor)
	Parallel(2, func(int) {})
	if n := runtime.NumGoroutine(); n > base {
		t.Fatalf("%d goroutines after 101 jobs, %d before", n, base)
	}
}

// TestStreamReadsEveryElement: the read baseline's sum is every element's,
// for lengths that leave tails at every level of the split.
func TestStreamReadsEveryElement(t *testing.T) {
	forEachKernel(t, func(t *testing.T) {
		for _, n := range []int{0, 1, 31, 32, 1000, minParallelMACs + 37, 3 << 16} {
			buf := make([]float32, n)
			for i := range buf {
				buf[i] = float32(i % 4) // small integers: every sum is exact
			}
			want := float32(0)
			for _, v := range buf {
				want += v
			}
			if got := Stream(buf); got != want {
				t.Fatalf("n=%d: Stream = %v, want %v", n, got, want)
			}
		}
	})
}

// BenchmarkStream is the read-bandwidth baseline of BenchmarkMatMul: the
// same bytes as its 1024×384 weights, read once.
func BenchmarkStream(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	w := randVec(r, 1024*384)
	b.SetBytes(int64(len(w) * 4))
	for b.Loop() {
		Stream(w)
	}
}

// goid is the running goroutine's id, from its stack header.
func goid() string {
	var buf [64]byte
	f := strings.Fields(string(buf[:runtime.Stack(buf[:], false)]))
	return f[1]
}

// resetStallWindow empties the pool's stall window and leaves serial mode.
func resetStallWindow(p *pool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.spent, p.saved, p.waited = 0, 0, 0
	p.serialUntil.Store(0)
}

// stallOnce runs a job of two parts, one of them on a helper that sleeps
// for stall in it, and returns how long the job took. The caller's part
// spins until a helper has taken the other one (for at most a second), so
// that the helper, not the caller, runs it; the test fails if no helper
// took a part in 100 jobs.
func stallOnce(t *testing.T, stall time.Duration) time.Duration {
	t.Helper()
	caller := goid()
	for try := 0; try < 100; try++ {
		var onHelper atomic.Bool
		start := time.Now()
		Parallel(2, func(int) {
			if goid() != caller {
				onHelper.Store(true)
				time.Sleep(stall)
				return
			}
			for end := time.Now().Add(time.Second); !onHelper.Load() && time.Now().Before(end); {
			}
		})
		if onHelper.Load() {
			return time.Since(start)
		}
	}
	t.Fatal("no helper took a part in 100 jobs")
	return 0
}

// TestStalledHelperPutsThePoolInSerialMode: a helper that holds its part
// far longer than the caller worked (as one that lost its CPU does), for
// longer than a stall window, puts the pool in serial mode: the next job's
// parts all run on its caller.
func TestStalledHelperPutsThePoolInSerialMode(t *testing.T) {
	if len(workers.helpers) == 0 {
		t.Skip("GOMAXPROCS=1: no helpers")
	}
	resetStallWindow(workers)
	defer resetStallWindow(workers)
	stallOnce(t, 5*stallWindow)
	if time.Now().UnixNano() >= workers.serialUntil.Load() {
		t.Fatalf("a helper held its part %v while its caller waited: the pool is not in serial mode", 5*stallWindow)
	}
	caller := goid()
	var elsewhere atomic.Int32
	Parallel(8, func(int) {
		if goid() != caller {
			elsewhere.Add(1)
		}
	})
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("in serial mode %d of 8 parts ran off the caller", n)
	}
}

// TestAnIsolatedStallKeepsTheHelpers: one helper stall of a few
// milliseconds — a vCPU taken away for a moment, as happens a few times a
// second on a shared VM — does not put the pool in serial mode (it did, for
// 50 ms each time, and a 2-vCPU VM spent most of a batch-16 decode on one
// core). A job that a loaded machine stretched to a whole window is not the
// isolated stall this is about, and is tried again.
func TestAnIsolatedStallKeepsTheHelpers(t *testing.T) {
	if len(workers.helpers) == 0 {
		t.Skip("GOMAXPROCS=1: no helpers")
	}
	defer resetStallWindow(workers)
	for try := 0; ; try++ {
		resetStallWindow(workers)
		took := stallOnce(t, 5*time.Millisecond)
		if took >= stallWindow {
			if try == 50 {
				t.Fatalf("50 jobs with a 5 ms stall each took %v or more: the machine is too loaded to stall a helper once", stallWindow)
			}
			continue
		}
		if time.Now().UnixNano() < workers.serialUntil.Load() {
			t.Fatalf("one %v job with a 5 ms stall of a helper put the pool in serial mode", took)
		}
		return
	}
}

// TestStallWindow: the pool goes serial when, over a window of job time,
// its callers waited for helpers longer than the helpers' parts saved them,
// and not before the window is full.
func TestStallWindow(t *testing.T) {
	ms := time.Millisecond
	type job struct {
		worked, waited time.Duration
		mine, helped   int
	}
	for _, tc := range []struct {
		name   string
		jobs   []job
		serial bool
	}{
		{"one stall, then paying jobs", append([]job{{ms / 2, 3 * ms / 2, 1, 1}}, repeat(job{ms, 0, 1, 1}, 25)...), false},
		{"one stall longer than the window", []job{{ms, 39 * ms, 1, 1}}, true},
		{"stalls in every job", repeat(job{ms / 10, ms / 5, 1, 1}, 100), true},
		{"stalls, window not yet full", repeat(job{ms / 10, ms / 5, 1, 1}, 50), false},
		{"helpers that ran no part saved nothing", append(repeat(job{2 * ms, 0, 2, 0}, 9), job{ms, 15 * ms, 1, 1}), true},
		{"helpers ran three parts to the caller's one", repeat(job{ms, 2 * ms, 1, 3}, 10), false},
		{"helpers ran one part to the caller's one", repeat(job{ms, 2 * ms, 1, 1}, 10), true},
		{"helpers ran every part", repeat(job{0, 2 * ms, 0, 2}, 30), false},
	} {
		p := &pool{}
		for _, j := range tc.jobs {
			p.account(j.worked, j.waited, j.mine, j.helped)
		}
		if got := time.Now().UnixNano() < p.serialUntil.Load(); got != tc.serial {
			t.Errorf("%s: serial mode %v, want %v", tc.name, got, tc.serial)
		}
	}
}

func repeat[T any](v T, n int) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = v
	}
	return out
}
