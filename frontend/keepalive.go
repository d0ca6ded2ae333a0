package frontend

import (
	"context"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// A stream that waits (a migration, a capacity wait, a resumed stream
// whose worker is between tokens) writes nothing, and a client whose
// frontend was cut off silently (a host's link: no FIN, no RST, no ICMP)
// would wait on its TCP connection for the kernel's timeouts, minutes.
// So a streamed response that has sent nothing for Limits.KeepAlive
// writes an SSE comment (": keep-alive"), which every SSE parser skips:
// a client may give up on a connection silent for a few intervals and
// resume at another frontend (the Go client does). HTTP/3 needs none of
// this (QUIC's own keep-alives), but gets the same comments.
//
// One ticker per frontend, not a timer per stream: it beats every half
// interval, waking the streams that wait (a channel closed per beat), and
// each writes a comment only once two beats passed since its last write,
// so a stream that streams tokens never writes one.

// beat wakes waiting streams every half keep-alive interval.
type beat struct {
	every time.Duration // the keep-alive interval; ≤ 0: no beats
	n     atomic.Uint64 // beats so far
	mu    sync.Mutex
	ch    chan struct{} // closed at the next beat (nil: nobody waits)
}

// C is a channel closed at the next beat (nil, never closed, with no
// keep-alives).
func (b *beat) C() <-chan struct{} {
	if b == nil || b.every <= 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// run beats until ctx ends.
func (b *beat) run(ctx context.Context) {
	if b.every <= 0 {
		return
	}
	t := time.NewTicker(b.every / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			b.n.Add(1)
			b.mu.Lock()
			if b.ch != nil {
				close(b.ch)
				b.ch = nil
			}
			b.mu.Unlock()
		}
	}
}

// pulse is one streamed response's writer with its keep-alives; a nil
// pulse writes none.
type pulse struct {
	b     *beat
	sw    *sse.Writer
	fl    http.Flusher
	wrote uint64 // the beat count at the last write
}

func newPulse(b *beat, sw *sse.Writer, fl http.Flusher) *pulse {
	p := &pulse{b: b, sw: sw, fl: fl}
	p.sent()
	return p
}

// sent records a write to the client.
func (p *pulse) sent() {
	if p != nil && p.b != nil {
		p.wrote = p.b.n.Load()
	}
}

// beat is the channel of the next beat (nil: none).
func (p *pulse) beat() <-chan struct{} {
	if p == nil {
		return nil
	}
	return p.b.C()
}

// beaten writes a keep-alive comment when the stream has written nothing
// for two beats; false when the write failed (the client went away).
func (p *pulse) beaten() bool {
	if p.b.n.Load()-p.wrote < 2 {
		return true
	}
	if err := p.sw.WriteComment("keep-alive"); err != nil {
		return false
	}
	if p.fl != nil {
		p.fl.Flush()
	}
	p.sent()
	return true
}

// await waits for changed; false when the client went away (its context,
// or a keep-alive it could not be sent).
func (p *pulse) await(ctx context.Context, changed <-chan struct{}) bool {
	select {
	case <-changed:
		return true
	case <-ctx.Done():
		return false
	case <-p.beat():
		return p.beaten()
	}
}

// awaitAny is await for the first of chans.
func (p *pulse) awaitAny(ctx context.Context, chans []chan struct{}) bool {
	cases := make([]reflect.SelectCase, 0, len(chans)+2)
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(p.beat())})
	for _, c := range chans {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)})
	}
	switch i, _, _ := reflect.Select(cases); i {
	case 0:
		return false
	case 1:
		return p.beaten()
	}
	return true
}
