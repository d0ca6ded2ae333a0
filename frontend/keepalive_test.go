package frontend

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// TestPulseWritesKeepAlivesOnlyWhenSilent: a follower waiting on a log
// that never changes writes ": keep-alive" once two beats passed since its
// last write; one that writes at every beat never does; a failed write
// reports the client gone; with no beat (nil pulse, or keep-alives off)
// the wait is a plain wait.
func TestPulseWritesKeepAlivesOnlyWhenSilent(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	b := &beat{every: 40 * time.Millisecond}
	var wg sync.WaitGroup
	wg.Go(func() { b.run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	var silent bytes.Buffer
	p := newPulse(b, sse.NewWriter(&silent), nil)
	never := make(chan struct{})
	start := b.n.Load()
	for strings.Count(silent.String(), ": keep-alive") < 3 {
		if !p.await(ctx, never) {
			t.Fatal("await reported the client gone")
		}
	}
	if beats := b.n.Load() - start; beats < 6 {
		t.Fatalf("3 keep-alives after %d beats: want one per two beats at most", beats)
	}

	var busy bytes.Buffer
	q := newPulse(b, sse.NewWriter(&busy), nil)
	for range 10 {
		q.await(ctx, never)
		q.sent() // a token written at every wake-up
	}
	if busy.Len() != 0 {
		t.Fatalf("a stream that wrote at every beat got keep-alives: %q", busy.String())
	}

	r := newPulse(b, sse.NewWriter(failWriter{}), nil)
	for r.await(ctx, never) {
	}

	var nilPulse *pulse
	changed := make(chan struct{})
	close(changed)
	if !nilPulse.await(ctx, changed) || !(&pulse{b: &beat{}}).await(ctx, changed) {
		t.Fatal("a wait without keep-alives did not return on the change")
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("connection reset") }
