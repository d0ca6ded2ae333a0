package frontend

import (
	"sync"
	"sync/atomic"
	"time"
)

// owned is the owner of every goroutine the frontend starts: none is
// started but through Go (tools/checks fails on a bare go statement in
// this package), and Run returns only after wait has seen them all end —
// or reports, in its error, how many outlived the bound.
type owned struct {
	wg      sync.WaitGroup
	running atomic.Int64
}

// Go runs f on a goroutine of its own, owned by o.
func (o *owned) Go(f func()) {
	o.running.Add(1)
	o.wg.Go(func() {
		defer o.running.Add(-1)
		f()
	})
}

// Running is how many goroutines of o have not returned.
func (o *owned) Running() int64 { return o.running.Load() }

// wait waits up to timeout for every goroutine of o to return and says
// how many have not. Each of them ends once the contexts Run cancels
// have ended and the calls it makes have met their own timeouts (etcd
// writes of records: at most takeoverTimeout), so within the bound.
func (o *owned) wait(timeout time.Duration) int64 {
	done := make(chan struct{})
	go func() { o.wg.Wait(); close(done) }() // the waiter: ends with them, or with the process
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return 0
	case <-t.C:
		return o.running.Load()
	}
}
