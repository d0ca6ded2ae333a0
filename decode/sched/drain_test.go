package sched

import (
	"testing"
	"time"
)

func TestDecideDrain(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	ms := time.Millisecond
	for _, tc := range []struct {
		name      string
		remaining int
		step      time.Duration
		deadline  time.Time
		want      DrainDecision
	}{
		{"fits with room", 10, 10 * ms, now.Add(time.Second), DrainFinishInPlace},
		{"fits exactly with the margin", 100, 10 * ms, now.Add(1500 * ms), DrainFinishInPlace},
		{"fits without the margin only", 100, 10 * ms, now.Add(1200 * ms), DrainMoveNow},
		{"far too long", 400, 10 * ms, now.Add(500 * ms), DrainMoveNow},
		{"one token, deadline passed", 1, 10 * ms, now.Add(-ms), DrainMoveNow},
		{"nothing left", 0, 10 * ms, now.Add(-ms), DrainFinishInPlace},
		{"negative remaining (bad input)", -5, 10 * ms, now, DrainFinishInPlace},
		{"no step time measured", 400, 0, now.Add(ms), DrainFinishInPlace},
		{"negative step time (bad input)", 400, -ms, now.Add(ms), DrainFinishInPlace},
		{"overflowing estimate", 1 << 40, time.Hour, now.Add(time.Hour), DrainMoveNow},
	} {
		if got := DecideDrain(tc.remaining, tc.step, now, tc.deadline); got != tc.want {
			t.Errorf("%s: DecideDrain(%d, %v, now, now%+v) = %v, want %v", tc.name, tc.remaining, tc.step, tc.deadline.Sub(now), got, tc.want)
		}
	}
}
