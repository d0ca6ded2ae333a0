package worker

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
)

// DefaultMemoryHeadroom is how far above the heap it holds once loaded
// (weights, KV store) a worker lets its Go heap grow before the garbage
// collector works to keep it there.
const DefaultMemoryHeadroom = 64 << 20

// boundHeap sets the Go runtime's soft memory limit to the live heap
// once loaded plus headroom, and returns it (0: none). Without it the
// heap grows to twice the live one before each collection (GOGC=100),
// and a worker of a 200 MiB model sat at 300 MiB resident after a few
// minutes of hostile traffic, with a live heap that never grew. A
// GOMEMLIMIT in the environment, or a headroom below 0, is left alone.
func boundHeap(headroom int64) uint64 {
	if _, set := os.LookupEnv("GOMEMLIMIT"); set || headroom < 0 {
		return limitNow()
	}
	runtime.GC()
	live, _, _ := heapStats()
	debug.SetMemoryLimit(int64(live) + headroom)
	return limitNow()
}

// limitNow is the soft memory limit in force (0: none).
func limitNow() uint64 {
	l := debug.SetMemoryLimit(-1)
	if l == math.MaxInt64 {
		return 0
	}
	return uint64(l)
}
