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

// TestStalledHelperPutsThePoolInSerialMode: a helper that holds its part
// far longer than the caller worked (as one that lost its CPU does) puts
// the pool in serial mode: the next job's parts all run on its caller.
func TestStalledHelperPutsThePoolInSerialMode(t *testing.T) {
	if len(workers.helpers) == 0 {
		t.Skip("GOMAXPROCS=1: no helpers")
	}
	defer workers.serialUntil.Store(0)
	caller := goid()
	helped := false
	for try := 0; try < 100 && !helped; try++ {
		workers.serialUntil.Store(0)
		var onHelper atomic.Bool
		Parallel(2, func(int) {
			if goid() != caller {
				onHelper.Store(true)
				time.Sleep(10 * time.Millisecond) // the stall
				return
			}
			// The caller's part: a millisecond of work, time enough for a
			// parked helper to wake and take the other part.
			for end := time.Now().Add(time.Millisecond); time.Now().Before(end); {
			}
		})
		helped = onHelper.Load()
	}
	if !helped {
		t.Fatal("no helper took a part in 100 jobs")
	}
	if time.Now().UnixNano() >= workers.serialUntil.Load() {
		t.Fatal("a helper held its part 10 ms while the caller worked 1 ms: the pool is not in serial mode")
	}
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
