package drill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/internal/debugsock"
)

// SoakOptions configure `lifeline drill soak`.
type SoakOptions struct {
	// Duration is how long the faults go on; KillEvery how often one is
	// injected.
	Duration, KillEvery time.Duration
	// StopEvery makes every StopEvery-th fault a SIGSTOP held for StopFor
	// (longer than the frontends' stall timeout, so the streams on it
	// move) instead of a SIGKILL; 0: kills only.
	StopEvery int
	StopFor   time.Duration
	// Nodes is the local cluster's node count (a decode worker each, one
	// prefill worker).
	Nodes  int
	Config Config
	Local  LocalOptions
}

// MaxRSSGrowth bounds how much the frontend's and the agents' resident
// memory may grow over a soak (end ÷ start, after the load stopped).
const MaxRSSGrowth = 1.5

// processes is what the soak compares before and after: the frontends'
// and agents' goroutines, descriptors and resident memory (their own Go
// runtime and process series).
type processes struct {
	goroutines, fds, rss float64
	// ours counts the goroutines whose stack runs through this module's
	// code (all of a process's when its stacks could not be read), except
	// those parked on a connection (reading its descriptor, or accepting
	// its next QUIC stream): a leak of ours is one of them. Connections
	// come and go with the pools' state (which peer a frontend or a
	// worker holds one to when the load stops), and so do the libraries'
	// goroutines (gRPC's and etcd's client transports, quic-go's,
	// net/http's); a leaked connection shows in fds.
	ours float64
	// by is goroutines/descriptors per process, for the detail line.
	by []string
	// stacks counts each process's goroutines by stack (its
	// debug socket's /debug/pprof/goroutine), to name what a leak is.
	stacks map[string]map[string]int
}

func (c *Cluster) processes(ctx context.Context) (processes, error) {
	var p processes
	// Each process's metrics page and its debug base (the agent's: its
	// control socket).
	var pages, debugs []string
	pages = append(append(pages, c.MetricsURLs...), c.AgentMetricsURLs...)
	for i := range c.MetricsURLs {
		debugs = append(debugs, "")
		if i < len(c.Debugs) {
			debugs[i] = c.Debugs[i]
		}
	}
	for i := range c.AgentMetricsURLs {
		debugs = append(debugs, debugsock.Base(c.Sockets[i]))
	}
	for i, u := range pages {
		m, err := scrape(ctx, u)
		if err != nil {
			return p, err
		}
		p.goroutines += m.Sum("go_goroutines")
		p.fds += m.Sum("process_open_fds")
		p.rss += m.Sum("process_resident_memory_bytes")
		p.by = append(p.by, fmt.Sprintf("%s %v/%v", u, m.Sum("go_goroutines"), m.Sum("process_open_fds")))
		st := map[string]int(nil)
		if debugs[i] != "" {
			st, err = goroutineStacks(ctx, debugs[i])
		}
		if st == nil || err != nil {
			p.ours += m.Sum("go_goroutines")
			continue
		}
		if p.stacks == nil {
			p.stacks = map[string]map[string]int{}
		}
		p.stacks[u] = st
		for k, n := range st {
			if ofOurs(k) {
				p.ours += float64(n)
			}
		}
	}
	return p, nil
}

// module prefixes this module's functions in a stack.
const module = "github.com/lifeline-llm/lifeline/"

// ofOurs says whether a stack (parseGoroutineStacks' key) is one of this
// module's goroutines not parked on a connection.
func ofOurs(stack string) bool {
	if !strings.Contains(stack, module) {
		return false
	}
	inner, _, _ := strings.Cut(stack, " < "+module)
	return !strings.Contains(inner, "internal/poll.runtime_pollWait") && !strings.Contains(inner, ").AcceptStream") && !strings.Contains(inner, ").AcceptUniStream")
}

// goroutineStacks reads a process's goroutines grouped by stack from
// its debug socket (the text form of the goroutine profile: blocks of
// "N @ pcs" followed by "#\t..." frame lines); the key is a block's
// function names, innermost first.
func goroutineStacks(ctx context.Context, debug string) (map[string]int, error) {
	body, err := debugsock.Get(ctx, debug, "/debug/pprof/goroutine?debug=1", 16<<20)
	if err != nil {
		return nil, fmt.Errorf("drill: goroutines: %w", err)
	}
	return parseGoroutineStacks(string(body)), nil
}

// parseGoroutineStacks parses the goroutine profile's text form.
func parseGoroutineStacks(text string) map[string]int {
	out := map[string]int{}
	for _, block := range strings.Split(text, "\n\n") {
		count, frames := -1, []string(nil)
		for _, l := range strings.Split(block, "\n") {
			if n, _, ok := strings.Cut(l, " @ "); ok && count < 0 {
				if c, err := strconv.Atoi(n); err == nil {
					count = c
				}
				continue
			}
			if f := strings.Fields(strings.TrimPrefix(l, "#")); count >= 0 && len(f) >= 2 && strings.HasPrefix(l, "#") {
				fn, _, _ := strings.Cut(f[1], "+0x")
				frames = append(frames, fn)
			}
		}
		if count < 0 {
			continue
		}
		out[strings.Join(frames, " < ")] += count
	}
	return out
}

// moreGoroutines names, per process, the stacks that have more goroutines
// in after than in before (at most a few, largest first).
func moreGoroutines(before, after processes) []string {
	var more []string
	for u, st := range after.stacks {
		for k, n := range st {
			if d := n - before.stacks[u][k]; d > 0 {
				more = append(more, fmt.Sprintf("%s +%d %s", u, d, k))
			}
		}
	}
	slices.Sort(more)
	return more
}

// Soak runs a steady load of seeded streams on a local cluster for
// o.Duration while a worker (decode or prefill, round robin over the
// ready ones) is SIGKILLed every o.KillEvery, every o.StopEvery-th one
// SIGSTOPped for o.StopFor instead. At the end it checks: no stream
// failed, no token lost or repeated, every stream bit-identical to its
// reference; once the load stopped and the cluster settled, no slot,
// lease, pull or in-flight request left, the frontend's and agents'
// goroutines and descriptors back to what they were at the start, their
// resident memory grown less than MaxRSSGrowth.
func Soak(ctx context.Context, o SoakOptions, out io.Writer) (Report, error) {
	if o.Duration <= 0 || o.KillEvery <= 0 {
		return Report{}, fmt.Errorf("drill: soak: --duration and --kill-every must be positive")
	}
	if o.Nodes < 1 {
		o.Nodes = 3
	}
	shape := Shape{Nodes: o.Nodes, DecodePerNode: 1, Prefill: 1, Frontends: 1, CanaryIdle: 2 * time.Second}
	c, err := startLocal(ctx, shape, o.Local, out)
	if err != nil {
		return Report{}, err
	}
	defer c.Close()
	d := Drill{Name: "soak", Expect: fmt.Sprintf("a worker SIGKILLed every %v for %v: nothing lost, duplicated or leaked", o.KillEvery, o.Duration)}
	r := newRecorder(d)
	if err := soak(ctx, c, o, r, out); err != nil {
		r.Verdict(Fail, "%v", err)
	}
	r.Event(time.Now(), EvEnd, "")
	rep := r.report()
	printReport(out, rep)
	return rep, nil
}

func soak(ctx context.Context, c *Cluster, o SoakOptions, r *Recorder, out io.Writer) error {
	l := NewLoad(c, LoadSpec{Streams: o.Config.Streams, MaxTokens: o.Config.MaxTokens, Seed: o.Config.Seed, Tag: "soak"})
	closed := false
	defer func() {
		if !closed {
			l.Close()
		}
	}()
	fmt.Fprintf(out, "soak: references of %d streams…\n", o.Config.Streams)
	if err := l.Reference(ctx); err != nil {
		return err
	}
	var tokens int
	var mu sync.Mutex
	l.OnToken = func(*Stream, Tok) { mu.Lock(); tokens++; mu.Unlock() }
	// A warm-up under faults first: the connection pools (frontend to
	// workers, agents to their peers) grow to their size, so that the
	// baseline taken after it counts a leak, not a pool filling up.
	warmed, wk, ws, err := warmUp(ctx, c, l, o, r, out)
	if err != nil {
		return err
	}
	base, err := holding(ctx, c)
	if err != nil {
		return err
	}
	before, err := c.processes(ctx)
	if err != nil {
		return err
	}
	// Two halves with a settle between: the pools (an agent's 4
	// connections per peer, the frontend's one per worker endpoint) may
	// still fill in the first; a leak grows in both, so the second must
	// not grow at all.
	half := o
	half.Duration = o.Duration / 2
	streams := warmed
	var faultErrs []error
	var mid processes
	kills, stops := wk, ws
	for i := 0; i < 2; i++ {
		stop := l.Steady(ctx)
		r.Event(time.Now(), EvLoadStart, "half %d: %d streams × %d tokens, each started again as it ends", i+1, o.Config.Streams, o.Config.MaxTokens)
		fmt.Fprintf(out, "soak: half %d: %v of faults, one every %v…\n", i+1, half.Duration, o.KillEvery)
		k, st, err := faults(ctx, c, half, r)
		streams = append(streams, stop()...)
		kills, stops, faultErrs = kills+k, stops+st, append(faultErrs, err)
		r.Event(time.Now(), EvLoadEnd, "")
		if i == 0 {
			if _, _, mid, err = c.settle(ctx, processes{ours: math.Inf(1), fds: math.Inf(1)}); err != nil {
				return err
			}
			r.Event(time.Now(), EvPhase, "settled between the halves")
		}
	}
	l.Close()
	closed = true
	left, inFlight, after, err := c.settle(ctx, mid)
	if err != nil {
		return err
	}
	oc := l.Compare(streams)
	// A stream that differs comes with its trace: where it was served.
	for _, d := range oc.Diverged[:min(len(oc.Diverged), 3)] {
		r.Trace(c.requestTrace(ctx, d.Result.RequestID))
	}
	Latencies(r, streams)
	judgeSoak(r, o, oc, soakEnd{kills: kills, stops: stops, tokens: tokens, faultErr: errors.Join(faultErrs...), base: base, left: left,
		inFlight: inFlight, before: before, mid: mid, after: after, heldBy: holders(ctx, c)})
	return nil
}

// soakEnd is what a soak ends with.
type soakEnd struct {
	kills, stops, tokens, inFlight int
	faultErr                       error
	base, left                     leaks
	heldBy                         string // who holds unpublished slots at the end
	// before is after the warm-up, mid between the halves, after at
	// the end.
	before, mid, after processes
}

// judgeSoak records a soak's figures and verdict.
func judgeSoak(r *Recorder, o SoakOptions, oc Outcome, e soakEnd) {
	kills, stops, tokens, faultErrs, base, left, inFlight, before, mid, after := e.kills, e.stops, e.tokens, e.faultErr, e.base, e.left, e.inFlight, e.before, e.mid, e.after
	figuresOf(r, oc)
	growth := 0.0
	if before.rss > 0 {
		growth = after.rss / before.rss
	}
	r.Figure("duration_s", o.Duration.Seconds())
	r.Figure("kills", float64(kills))
	r.Figure("stops", float64(stops))
	r.Figure("tokens", float64(tokens))
	r.Figure("completed", float64(oc.Completed))
	r.Figure("leaked_slots", float64(left.over(base).slots))
	r.Figure("leaked_leases", float64(left.over(base).leases))
	r.Figure("leaked_pulls", float64(left.over(base).pulls))
	r.Figure("leaked_in_flight", float64(inFlight))
	r.Figure("leaked_goroutines", after.ours-mid.ours)
	r.Figure("goroutines_delta", after.goroutines-mid.goroutines)
	r.Figure("leaked_fds", after.fds-mid.fds)
	r.Figure("first_half_goroutines", mid.goroutines-before.goroutines)
	r.Figure("first_half_fds", mid.fds-before.fds)
	r.Figure("rss_start_mb", before.rss/(1<<20))
	r.Figure("rss_end_mb", after.rss/(1<<20))
	r.Figure("rss_growth", growth)
	var ck Check
	ck.That(faultErrs == nil, "a fault could not be injected: %v", faultErrs)
	ck.That(kills > 0, "no worker was killed")
	ck.That(oc.Failed == 0, "%d streams failed %v (%v)", oc.Failed, oc.Errors, oc.FirstError)
	ck.That(oc.Gaps == 0 && oc.Duplicates == 0, "%d tokens lost, %d duplicated", oc.Gaps, oc.Duplicates)
	ck.That(oc.Identical == oc.Streams, "%d of %d streams bit-identical (%s)", oc.Identical, oc.Streams, oc.FirstDiff)
	ck.That(left.over(base) == (leaks{}) && inFlight == 0, "left behind: %+v, %d in flight (before: %+v; unpublished slots held by %s)", left, inFlight, base, e.heldBy)
	ck.That(after.ours <= mid.ours, "%v goroutines of lifeline's code more than between the halves (all: %v → %v; more of: %v)", after.ours-mid.ours, mid.by, after.by, moreGoroutines(mid, after))
	ck.That(after.fds <= mid.fds, "%v descriptors more than between the halves (goroutines/descriptors: %v → %v; more goroutines of: %v)", after.fds-mid.fds, mid.by, after.by, moreGoroutines(mid, after))
	ck.That(growth < MaxRSSGrowth, "resident memory grew %.2f× (bound %.1f×)", growth, MaxRSSGrowth)
	ck.Verdict(r, fmt.Sprintf("%d kills and %d stops in %v: %d streams, %d tokens, 0 lost or duplicated, all bit-identical; nothing leaked, RSS %.2f×",
		kills, stops, o.Duration, oc.Streams, tokens, growth))
}

// warmUp runs l under faults for a quarter of the soak (2 faults at
// least, 30 s at most) and lets the cluster settle; it returns the
// streams and the faults.
func warmUp(ctx context.Context, c *Cluster, l *Load, o SoakOptions, r *Recorder, out io.Writer) (_ []*Stream, kills, stops int, err error) {
	warm := o
	warm.Duration = max(min(o.Duration/4, 30*time.Second), 2*o.KillEvery)
	fmt.Fprintf(out, "soak: warm-up, %v of faults…\n", warm.Duration)
	stop := l.Steady(ctx)
	kills, stops, err = faults(ctx, c, warm, r)
	streams := stop()
	if err != nil {
		return nil, 0, 0, err
	}
	if _, _, _, err := c.settle(ctx, processes{ours: math.Inf(1), fds: math.Inf(1)}); err != nil {
		return nil, 0, 0, err
	}
	r.Event(time.Now(), EvPhase, "warmed up (%d kills, %d stops): the baseline", kills, stops)
	return streams, kills, stops, nil
}

// settle waits, once a load stopped, until the cluster is ready again
// and holds nothing for a request (bounded), then until its frontends'
// and agents' goroutines and descriptors are back to before (bounded:
// those of closed connections go a moment after their close), and
// returns what is left.
func (c *Cluster) settle(ctx context.Context, before processes) (left leaks, inFlight int, after processes, err error) {
	if err := c.WaitReady(ctx, 2*time.Minute); err != nil {
		return left, 0, after, err
	}
	if left, err = waitNoOrphans(ctx, c, 30*time.Second); err != nil {
		return left, 0, after, err
	}
	if inFlight, err = waitIdleWorkers(ctx, c, 30*time.Second); err != nil {
		return left, inFlight, after, err
	}
	after, err = c.processes(ctx)
	for deadline := time.Now().Add(30 * time.Second); err == nil && (after.ours > before.ours || after.fds > before.fds) && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return left, inFlight, after, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		after, err = c.processes(ctx)
	}
	return left, inFlight, after, err
}

// faults injects one fault every o.KillEvery until o.Duration is over,
// each on the next ready worker, and returns what it did; a stopped
// worker is continued after o.StopFor, and before it returns.
func faults(ctx context.Context, c *Cluster, o SoakOptions, r *Recorder) (kills, stops int, err error) {
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		stopped = map[int]bool{}
	)
	cont := func(pid int) {
		mu.Lock()
		defer mu.Unlock()
		if stopped[pid] {
			syscall.Kill(pid, syscall.SIGCONT)
			delete(stopped, pid)
		}
	}
	defer func() {
		mu.Lock()
		pids := make([]int, 0, len(stopped))
		for pid := range stopped {
			pids = append(pids, pid)
		}
		mu.Unlock()
		for _, pid := range pids {
			cont(pid)
		}
		wg.Wait()
	}()
	end := time.Now().Add(o.Duration)
	tick := time.NewTicker(o.KillEvery)
	defer tick.Stop()
	for n := 0; time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return kills, stops, ctx.Err()
		case <-tick.C:
		}
		ws, werr := c.Workers(ctx)
		if werr != nil {
			return kills, stops, werr
		}
		var ready []Worker
		for _, w := range ws {
			mu.Lock()
			frozen := stopped[w.PID]
			mu.Unlock()
			if w.Ready && w.PID > 0 && !frozen {
				ready = append(ready, w)
			}
		}
		if len(ready) < 2 {
			continue // keep one worker serving: a fault per turn, not an outage
		}
		w := ready[n%len(ready)]
		n++
		if o.StopEvery > 0 && n%o.StopEvery == 0 {
			if err := syscall.Kill(w.PID, syscall.SIGSTOP); err != nil && err != syscall.ESRCH {
				return kills, stops, err
			}
			mu.Lock()
			stopped[w.PID] = true
			mu.Unlock()
			stops++
			r.Event(time.Now(), EvFault, "SIGSTOP %s (pid %d) for %v", w.InstanceID, w.PID, o.StopFor)
			wg.Add(1)
			time.AfterFunc(o.StopFor, func() { defer wg.Done(); cont(w.PID) })
			continue
		}
		if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
			return kills, stops, err
		}
		kills++
		r.Event(time.Now(), EvFault, "SIGKILL %s (pid %d, generation %d)", w.InstanceID, w.PID, w.Generation)
	}
	return kills, stops, nil
}
