package sched

import (
	"errors"
	"fmt"
	"testing"
)

// TestBatchLeavesTheInteractiveReserve: a batch flood takes at most 3/4 of
// the slots and of the queue; interactive requests still start and queue,
// ahead of every batch request, and queue positions say so.
func TestBatchLeavesTheInteractiveReserve(t *testing.T) {
	s, _ := newSched(t, 256, Limits{MaxRunning: 4, MaxQueued: 8, MaxStepTokens: 64})
	sub := func(id string, p Priority) error {
		r := newRecorder()
		return s.Submit(r.attach(Request{ID: id, Prompt: prompt(4, 1), MaxTokens: 4, Priority: p}))
	}
	var refused int
	for i := 0; i < 20; i++ {
		err := sub(fmt.Sprint("b", i), Batch)
		var oe *OverloadedError
		if errors.As(err, &oe) && oe.Limit == LimitQueued {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	// 3 running (4 − 1 reserved), 6 queued (8 − 2 reserved).
	if st := s.Stats(); st.Running != 3 || st.Queued != 6 || refused != 11 {
		t.Fatalf("batch flood: %+v, %d refused", st, refused)
	}
	if err := sub("i0", Interactive); err != nil {
		t.Fatalf("an interactive request under a batch flood: %v", err)
	}
	if st := s.Stats(); st.Running != 4 || st.Queued != 6 {
		t.Fatalf("the interactive request did not start at once: %+v", st)
	}
	for i := 1; i <= 2; i++ {
		if err := sub(fmt.Sprint("i", i), Interactive); err != nil {
			t.Fatalf("interactive %d: %v", i, err)
		}
	}
	if err := sub("i3", Interactive); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("past the whole queue: %v", err)
	}
	if got := [...]int{s.QueuePosition("i1"), s.QueuePosition("i2"), s.QueuePosition("b3"), s.QueuePosition("b0")}; got != [...]int{1, 2, 3, 0} {
		t.Fatalf("queue positions i1, i2, b3, b0 (running) = %v", got)
	}
	drain(t, s)
}
