package sched

import (
	"slices"
	"testing"
	"time"
)

// TestStepTimes: StepTime is the longest of the last 16 steps, MeanStepTime
// the mean of the last 64 (fewer before 64 ran); one stalled step sets the
// first and moves the second by a sixty-fourth of the stall.
func TestStepTimes(t *testing.T) {
	ms := time.Millisecond
	record := func(steps ...time.Duration) (ring [meanSteps]time.Duration, count int) {
		for _, d := range steps {
			ring[count%meanSteps] = d
			count++
		}
		return ring, count
	}
	repeat := func(d time.Duration, n int) []time.Duration { return slices.Repeat([]time.Duration{d}, n) }
	cases := []struct {
		name          string
		steps         []time.Duration
		longest, mean time.Duration
	}{
		{"none", nil, 0, 0},
		{"three", []time.Duration{ms, 3 * ms, 2 * ms}, 3 * ms, 2 * ms},
		{"a stall among 64 steady ones", append(repeat(10*ms, 63), 650*ms), 650 * ms, 20 * ms},
		// The stall is 17 steps back: out of the longest's window, still
		// in the mean's.
		{"a stall 17 steps back", append(append(repeat(10*ms, 47), 650*ms), repeat(10*ms, 16)...), 10 * ms, 20 * ms},
		// 100 steps: the ring has wrapped; the first 36 (at 1 s) are gone.
		{"wrapped", append(repeat(time.Second, 36), repeat(4*ms, 64)...), 4 * ms, 4 * ms},
		{"wrapped, slower lately", append(repeat(2*ms, 70), repeat(66*ms, 32)...), 66 * ms, 34 * ms},
	}
	for _, c := range cases {
		ring, count := record(c.steps...)
		if longest, mean := stepTimes(ring[:], count); longest != c.longest || mean != c.mean {
			t.Errorf("%s: longest %v, mean %v; want %v, %v", c.name, longest, mean, c.longest, c.mean)
		}
	}
}
