package worker

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// DefaultMemoryHeadroom is how far above the heap it holds once loaded
// (weights, KV store) a worker lets its Go heap grow before the garbage
// collector works to keep it there.
const DefaultMemoryHeadroom = 64 << 20

// boundHeap sets the Go runtime's soft memory limit to the memory it
// holds once loaded plus headroom (or a quarter of the live heap, when
// more), and returns it (0: none). Without it the
// heap grows to twice the live one before each collection (GOGC=100),
// and a worker of a 200 MiB model sat at 300 MiB resident after a few
// minutes of hostile traffic, with a live heap that never grew. A
// GOMEMLIMIT in the environment, or a headroom below 0, is left alone.
func boundHeap(headroom int64) uint64 {
	if _, set := os.LookupEnv("GOMEMLIMIT"); set || headroom < 0 {
		return limitNow()
	}
	runtime.GC()
	debug.FreeOSMemory()
	// The limit counts all the runtime's memory (heap, stacks, its own
	// structures, free spans not yet returned), so it starts from that,
	// and the headroom grows with the heap: a fixed one would make a
	// large heap collect far more often than GOGC would.
	samples := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(samples)
	inUse := samples[0].Value.Uint64() - samples[1].Value.Uint64()
	live, _, _ := heapStats()
	debug.SetMemoryLimit(int64(inUse) + max(headroom, int64(live/4)))
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
