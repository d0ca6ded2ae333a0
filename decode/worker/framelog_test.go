package worker

import (
	"testing"

	"github.com/lifeline-llm/lifeline/decode/wire"
)

// TestFrameLog: the log keeps the newest frames up to its bound, counts
// what it drops and remembers the newest token frame dropped.
func TestFrameLog(t *testing.T) {
	t.Parallel()
	l := newFrameLog(4)
	for i := range 3 {
		if l.append(&wire.Frame{SequenceNo: int32(i + 1)}) {
			t.Fatalf("frame %d dropped one below the bound", i+1)
		}
	}
	if l.first() != 0 || len(l.since(0)) != 3 || l.droppedThrough != 0 {
		t.Fatalf("below the bound: first %d, %d frames, dropped through %d", l.first(), len(l.since(0)), l.droppedThrough)
	}
	dropped := 0
	for i := 3; i < 10; i++ {
		if l.append(&wire.Frame{SequenceNo: int32(i + 1)}) {
			dropped++
		}
	}
	l.append(&wire.Frame{FinishReason: "length"})
	dropped++
	if dropped != 7 || l.first() != 7 || l.droppedThrough != 7 {
		t.Fatalf("dropped %d, first %d, dropped through %d; want 7, 7, 7", dropped, l.first(), l.droppedThrough)
	}
	got := l.since(l.first())
	for i, want := range []int32{8, 9, 10, 0} {
		if got[i].SequenceNo != want {
			t.Fatalf("kept frame %d: sequence %d, want %d", i, got[i].SequenceNo, want)
		}
	}
	if got[3].FinishReason != "length" || len(l.since(10)) != 1 {
		t.Fatalf("tail: %+v", got)
	}
}
