package matmul

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// A decode step of a small model is some fifty products of a millisecond or
// less, separated by microseconds of single-threaded work. Starting a
// goroutine per product and waiting for it costs a wake-up of an idle CPU
// each time — tens to hundreds of microseconds on a virtual machine, most of
// a token's time. So the products run on helpers that stay: each spins for
// a short while after a job, where the next job finds it awake, and only
// then parks.

// spinFor is how long a helper keeps polling for the next job before it
// parks. It covers the gaps between a step's products, not between steps
// of an idle engine.
const spinFor = 200 * time.Microsecond

// maxHelpers bounds the helpers started at init.
const maxHelpers = 63

// job is one parallel call: parts 0..n-1 of f, part 0 run by the caller.
type job struct {
	f    func(part int)
	n    int
	next atomic.Int32 // the next part to take
	done atomic.Int32 // parts finished
	// waiting is set (after fin is made) by a caller that stopped spinning
	// for the last part; whoever finishes it then sends on fin.
	waiting atomic.Bool
	fin     chan struct{}
}

type helper struct {
	parked atomic.Bool
	wake   chan struct{}
}

type pool struct {
	// mu makes one caller at a time the pool's user; a caller that finds
	// it taken runs its parts on goroutines of its own.
	mu      sync.Mutex
	seq     atomic.Uint64 // incremented per job
	cur     atomic.Pointer[job]
	helpers []*helper
	// serialUntil (Unix nanoseconds) is when the pool leaves serial mode.
	serialUntil atomic.Int64
	// The current stall window (see account), under mu: time spent in
	// jobs, what the helpers saved in them and what their callers waited
	// for helpers.
	spent, saved, waited time.Duration
}

var workers = newPool(min(runtime.GOMAXPROCS(0)-1, maxHelpers))

func newPool(n int) *pool {
	p := &pool{}
	for range max(n, 0) {
		h := &helper{wake: make(chan struct{}, 1)}
		h.parked.Store(true)
		p.helpers = append(p.helpers, h)
		go p.run(h)
	}
	return p
}

// run is a helper's loop: take parts of the current job until none are
// left, spin for the next job, park.
func (p *pool) run(h *helper) {
	var seen uint64
	for {
		if s := p.seq.Load(); s != seen {
			seen = s
			if j := p.cur.Load(); j != nil {
				j.work()
			}
			continue
		}
		if spinUntil(func() bool { return p.seq.Load() != seen }) {
			continue
		}
		h.parked.Store(true)
		if p.seq.Load() != seen {
			// A job came between the last look and parking: unpark, unless
			// its caller already took the flag and is sending a wake-up.
			if !h.parked.CompareAndSwap(true, false) {
				<-h.wake
			}
			continue
		}
		<-h.wake
	}
}

// spinUntil polls cond for up to spinFor and reports whether it held,
// yielding now and then to the goroutines that share this CPU (the network,
// the scheduler; with nothing else runnable that returns at once).
func spinUntil(cond func() bool) bool {
	deadline := time.Now().Add(spinFor)
	for i := 0; ; i++ {
		if cond() {
			return true
		}
		if i%64 == 63 {
			if time.Now().After(deadline) {
				return false
			}
			runtime.Gosched()
		}
	}
}

// work takes and runs parts until none are left and returns how many it
// ran.
func (j *job) work() (ran int) {
	for {
		i := int(j.next.Add(1)) - 1
		if i >= j.n {
			return ran
		}
		j.f(i)
		ran++
		if int(j.done.Add(1)) == j.n && j.waiting.Load() {
			j.fin <- struct{}{}
		}
	}
}

// wait returns when every part has finished. It spins for a part that a
// helper is running; if the helper lost its CPU (a busy machine), the
// caller sleeps until the last part finishes instead of burning the CPU the
// helper needs.
func (j *job) wait() {
	finished := func() bool { return j.done.Load() == int32(j.n) }
	if spinUntil(finished) {
		return
	}
	// fin is made before waiting is set: whoever sees waiting sees fin.
	j.fin = make(chan struct{}, 1)
	j.waiting.Store(true)
	if !finished() {
		<-j.fin
	}
}

// Parallel runs f(0) … f(n-1), each exactly once, on the caller and the
// engine's helpers, and returns when all have returned. Which goroutine runs
// a part never changes what it computes. A call made while the helpers are
// busy (from inside f, or by another engine) runs on goroutines of its own.
func Parallel(n int, f func(part int)) {
	if n <= 1 {
		if n == 1 {
			f(0)
		}
		return
	}
	p := workers
	if len(p.helpers) == 0 || !p.mu.TryLock() {
		parallelGo(n, f)
		return
	}
	defer p.mu.Unlock()
	start := time.Now()
	if start.UnixNano() < p.serialUntil.Load() {
		for i := range n {
			f(i)
		}
		return
	}
	j := &job{f: f, n: n}
	p.cur.Store(j)
	p.seq.Add(1)
	for _, h := range p.helpers[:min(len(p.helpers), n-1)] {
		if h.parked.CompareAndSwap(true, false) {
			h.wake <- struct{}{}
		}
	}
	mine := j.work()
	worked := time.Since(start)
	j.wait()
	p.cur.Store(nil)
	// Every part the caller did not run, a helper did.
	p.account(worked, time.Since(start)-worked, mine, n-mine)
}

// A helper that loses its CPU in the middle of a part holds its caller up
// until the kernel runs it again, which on a machine busier than its cores
// costs more than the helpers save. Jobs are accounted in windows of
// stallWindow of job time: a window in which the callers waited for their
// helpers longer than the helpers saved them puts the pool in serial mode
// for serialFor (callers run every part alone and the helpers park); then
// the helpers are tried again.
//
// A window, not a job: on a virtual machine a vCPU is taken away for 0.1-3
// ms now and then, a few times a second, whatever runs in the guest. When
// one such stall put the pool in serial mode, a shared 2-vCPU VM spent
// most of a batch-16 decode on one core (10-30 entries in 1.5 s of
// decoding). Keeping the helpers through such stalls, that VM (medians of
// six interleaved rounds): small's batch-16 decode +27 %, prefill +23 %
// (llama2.c's +31 %), batch 1 within the noise. An oversubscribed machine
// stalls the helpers in every job and fills a window in milliseconds.
const (
	stallWindow = 20 * time.Millisecond
	serialFor   = 50 * time.Millisecond
)

// account adds a job to the stall window: its caller ran mine parts in
// worked, then waited for helpers for waited; helpers ran helped parts, each
// of which saved the caller about as long as one of its own took. A job
// whose parts all ran on helpers is not judged: nothing says what a part
// costs.
func (p *pool) account(worked, waited time.Duration, mine, helped int) {
	p.spent += worked + waited
	if mine > 0 {
		p.saved += worked * time.Duration(helped) / time.Duration(mine)
		p.waited += waited
	}
	if p.spent < stallWindow {
		return
	}
	if p.waited > p.saved {
		p.serialUntil.Store(time.Now().Add(serialFor).UnixNano())
	}
	p.spent, p.saved, p.waited = 0, 0, 0
}

// parallelGo is Parallel on goroutines of its own, for a caller that finds
// the pool in use (two engines in one process).
func parallelGo(n int, f func(part int)) {
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Go(func() { f(i) })
	}
	f(0)
	wg.Wait()
}
