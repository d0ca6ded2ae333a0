package drill

import (
	"context"
	"fmt"
	"sync"
	"time"
)

func init() {
	Register(Drill{Number: 10, Name: seedNames[10][0], Expect: seedNames[10][1], Shape: Standard, Run: runClientsLeave})
}

// runClientsLeave makes every client leave mid-way: the even streams
// while their long prompts are still being prefilled (50 ms after they
// start), the odd ones halfway through their tokens. The cancel must
// reach every worker and the KV leases: afterwards the nodes hold no
// unfinished slot, lease or pull and no worker has a request in flight,
// as before the drill.
func runClientsLeave(ctx context.Context, c *Cluster, cfg Config, r *Recorder) error {
	l := NewLoad(c, LoadSpec{Streams: min(cfg.Streams, 6), MaxTokens: cfg.MaxTokens, PromptWords: 300, Seed: cfg.Seed, Tag: "10"})
	defer l.Close()
	if err := l.Reference(ctx); err != nil {
		return err
	}
	base, err := holding(ctx, c)
	if err != nil {
		return err
	}
	half := max(cfg.MaxTokens/2, 1)
	var (
		mu         sync.Mutex
		lastCancel time.Time
	)
	leave := func(s *Stream, why string) {
		s.mu.Lock()
		ended := !s.Ended.IsZero()
		s.mu.Unlock()
		if ended {
			return
		}
		at := time.Now()
		s.Cancel()
		r.Event(at, EvFault, "stream %d leaves %s", s.Index, why)
		mu.Lock()
		lastCancel = at
		mu.Unlock()
	}
	l.OnStart = func(s *Stream) {
		if s.Index%2 == 0 {
			time.AfterFunc(50*time.Millisecond, func() { leave(s, "during prefill") })
		}
	}
	l.OnToken = func(s *Stream, t Tok) {
		if s.Index%2 == 1 && t.Seq == half {
			leave(s, fmt.Sprintf("after token %d", t.Seq))
		}
	}
	r.Event(time.Now(), EvLoadStart, "%d streams × %d tokens, ~300-word prompts", l.Spec().Streams, cfg.MaxTokens)
	streams := l.Run(ctx)
	r.Event(time.Now(), EvLoadEnd, "")
	left, err := waitNoOrphans(ctx, c, 15*time.Second)
	if err != nil {
		return err
	}
	inFlight, err := waitIdleWorkers(ctx, c, 15*time.Second)
	if err != nil && err != ErrNoCerts {
		return err
	}
	clean := time.Now()
	r.Event(clean, EvRecovered, "nodes and workers back to what they held before")
	o := l.Compare(streams)
	Latencies(r, streams)
	figuresOf(r, o)
	r.Figure("cancelled", float64(o.Cancelled))
	r.Figure("leaked_slots", float64(left.over(base).slots))
	r.Figure("leaked_leases", float64(left.over(base).leases))
	r.Figure("leaked_pulls", float64(left.over(base).pulls))
	r.Figure("leaked_in_flight", float64(inFlight))
	mu.Lock()
	r.Figure("release_ms", ms(clean.Sub(lastCancel)))
	mu.Unlock()
	var ck Check
	ck.That(o.Cancelled > 0, "no stream was cancelled")
	ck.That(o.Failed == 0, "%d streams failed (%v)", o.Failed, o.FirstError)
	ck.That(o.Identical == o.Streams, "%d of %d streams a prefix of their reference", o.Identical, o.Streams)
	ck.That(left.over(base) == (leaks{}), "the nodes hold %+v after the clients left (before: %+v)", left, base)
	ck.That(inFlight == 0, "%d requests still in flight on the workers", inFlight)
	line := fmt.Sprintf("%d clients left mid-way; nothing leaked (slots, leases, pulls", o.Cancelled)
	if err == ErrNoCerts {
		line += "; worker in_flight not checked: no certificates"
	} else {
		line += ", worker in_flight"
	}
	ck.Verdict(r, line+")")
	return nil
}

// waitIdleWorkers waits until no worker has a request in flight and
// returns how many are left then.
func waitIdleWorkers(ctx context.Context, c *Cluster, timeout time.Duration) (int, error) {
	if c.Certs == "" {
		return 0, ErrNoCerts
	}
	end := time.After(timeout)
	for {
		ws, err := c.Workers(ctx)
		if err != nil {
			return 0, err
		}
		n := 0
		for _, w := range ws {
			h, err := c.WorkerHealth(ctx, w)
			if err != nil {
				return 0, err
			}
			n += int(h.InFlight)
		}
		if n == 0 {
			return 0, nil
		}
		select {
		case <-end:
			return n, nil
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
