package worker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// ErrOrphaned ends a worker whose agent has not come back: nobody
// supervises, adopts or drains it, and it holds its memory (a GPU's, on a
// real engine) for nothing.
var ErrOrphaned = errors.New("worker: orphaned")

// DefaultOrphanTimeout is how long a worker waits for an agent (its own
// restarted, to adopt it) before it stops: longer than an agent restart.
const DefaultOrphanTimeout = 3 * time.Minute

// WatchAgent returns ErrOrphaned (wrapped, naming the socket) once the
// agent's socket has refused connections for timeout, checked every
// timeout/6 (at most 5 s); nil when ctx ends first. now and the ticks
// come from the caller's clock in tests.
func WatchAgent(ctx context.Context, socket string, timeout time.Duration) error {
	every := min(timeout/6, 5*time.Second)
	last := time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			if c, err := (&net.Dialer{Timeout: every}).DialContext(ctx, "unix", socket); err == nil {
				c.Close()
				last = now
				continue
			}
			if gone := now.Sub(last); gone >= timeout {
				return fmt.Errorf("%w: no agent at %s for %v (it was not restarted to adopt this worker): stopping to free its memory", ErrOrphaned, socket, gone.Round(time.Second))
			}
		}
	}
}
