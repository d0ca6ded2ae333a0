package drill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/internal/debugsock"
	"github.com/lifeline-llm/lifeline/internal/procfs"
)

// SoakOptions configure `lifeline drill soak`.
type SoakOptions struct {
	// Duration is how long the faults go on; KillEvery how often one is
	// injected.
	Duration, KillEvery time.Duration
	// Faults are the faults injected, one per turn, in this order
	// (FaultDecode…; default SoakFaults). A fault that cannot be injected
	// in its turn (a node is out already, say) gives way to the next one
	// that can, and comes again next turn.
	Faults []string
	// StopFor is how long a FaultStop holds its worker stopped (longer
	// than the frontends' stall timeout, so the streams on it move).
	StopFor time.Duration
	// Nodes is the local cluster's node count (a decode worker each, one
	// prefill worker); two frontends when a frontend is killed, three
	// etcd member processes when etcd's leader is.
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
	rss float64
	// per is each process's figures by metrics URL.
	per map[string]proc
	// stacks counts each process's goroutines by stack (its
	// debug socket's /debug/pprof/goroutine), to name what a leak is.
	stacks map[string]map[string]int
}

// proc is one process's figures.
type proc struct {
	goroutines, fds float64
	// ours counts the goroutines whose stack runs through this module's
	// code (all of a process's when its stacks could not be read), except
	// those parked on a connection (reading its descriptor, or accepting
	// its next QUIC stream): a leak of ours is one of them. Connections
	// come and go with the pools' state (which peer a frontend or a
	// worker holds one to when the load stops), and so do the libraries'
	// goroutines (gRPC's and etcd's client transports, quic-go's,
	// net/http's); a leaked connection shows in fds.
	ours float64
	// start is when the process started (a process started again, by a
	// soak's kill, is not compared with the one before).
	start float64
	// adopted counts an agent's workers that are not its children (it
	// adopted them when it started again): an agent waits for a child
	// and reads its output, and does neither for an adopted worker, so
	// one that becomes a child (restarted) is compared with nothing.
	adopted int
}

// growth is how much the processes that ran on from before to after
// (the same start, and for an agent as many adopted workers) grew, and
// which are not compared.
func growth(before, after processes) (d proc, restarted []string) {
	for u, a := range after.per {
		b, ok := before.per[u]
		if !ok || b.start != a.start || b.adopted != a.adopted {
			restarted = append(restarted, u)
			continue
		}
		d.goroutines += a.goroutines - b.goroutines
		d.fds += a.fds - b.fds
		d.ours += a.ours - b.ours
	}
	slices.Sort(restarted)
	return d, restarted
}

// by is goroutines/descriptors per process, for a detail line.
func (p processes) by() []string {
	var out []string
	for u, f := range p.per {
		out = append(out, fmt.Sprintf("%s %v/%v", u, f.goroutines, f.fds))
	}
	slices.Sort(out)
	return out
}

func (c *Cluster) processes(ctx context.Context) (processes, error) {
	p := processes{per: map[string]proc{}}
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
		f := proc{goroutines: m.Sum("go_goroutines"), fds: m.Sum("process_open_fds"), start: m.Sum("process_start_time_seconds")}
		p.rss += m.Sum("process_resident_memory_bytes")
		st := map[string]int(nil)
		if debugs[i] != "" {
			st, err = goroutineStacks(ctx, debugs[i])
		}
		if st == nil || err != nil {
			f.ours = f.goroutines
		} else {
			if p.stacks == nil {
				p.stacks = map[string]map[string]int{}
			}
			p.stacks[u] = st
			for k, n := range st {
				if ofOurs(k) {
					f.ours += float64(n)
				}
			}
		}
		if j := i - len(c.MetricsURLs); j >= 0 {
			f.adopted = c.adopted(ctx, j)
		}
		p.per[u] = f
	}
	return p, nil
}

// adopted counts the workers of local agent i whose parent is not the
// agent (-1 when the cluster was not started here, or the agent does not
// answer).
func (c *Cluster) adopted(ctx context.Context, i int) int {
	if i >= len(c.nodes) || c.nodes[i].Process() == nil {
		return -1
	}
	st, err := nodectl.GetStatus(ctx, c.Sockets[i])
	if err != nil {
		return -1
	}
	n := 0
	for _, w := range st.Instances {
		pids := []int{w.PID}
		for _, r := range w.Ranks {
			pids = append(pids, r.PID)
		}
		for _, pid := range pids {
			if ppid, err := procfs.Parent(pid); pid > 0 && err == nil && ppid != c.nodes[i].Process().Pid {
				n++
			}
		}
	}
	return n
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
		if before.per[u].start != after.per[u].start {
			continue
		}
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
// o.Duration while a fault is injected every o.KillEvery, by turns
// (o.Faults): worker SIGKILLs and SIGSTOPs, agent, frontend and etcd
// leader SIGKILLs (each started again), drains; the client resumes
// through a frontend's death on another, as a real one does. At the end
// it checks: no stream failed, no token lost or repeated, every stream
// bit-identical to its reference; once the load stopped and the cluster
// settled, no slot, lease, pull, in-flight request, segment or process
// left, the goroutines and descriptors of the frontends and agents that
// ran on back to what they were, the resident memory grown less than
// MaxRSSGrowth.
func Soak(ctx context.Context, o SoakOptions, out io.Writer) (Report, error) {
	if o.Duration <= 0 || o.KillEvery <= 0 {
		return Report{}, fmt.Errorf("drill: soak: --duration and --kill-every must be positive")
	}
	if o.Faults == nil {
		o.Faults = SoakFaults
	}
	if err := checkFaults(o.Faults); err != nil {
		return Report{}, err
	}
	if o.Nodes < 1 {
		o.Nodes = 3
	}
	shape := Shape{Nodes: o.Nodes, DecodePerNode: 1, Prefill: 1, Frontends: 1, CanaryIdle: 2 * time.Second}
	if slices.Contains(o.Faults, FaultFrontend) {
		shape.Frontends = 2
	}
	if slices.Contains(o.Faults, FaultLeader) {
		shape.EtcdMembers = 3
	}
	c, err := startLocal(ctx, shape, o.Local, out)
	if err != nil {
		return Report{}, err
	}
	defer c.Close()
	d := Drill{Name: "soak", Expect: fmt.Sprintf("a fault every %v for %v (%s): nothing lost, duplicated or leaked", o.KillEvery, o.Duration, strings.Join(o.Faults, ", "))}
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
	f := newFaulter(c, o, r)
	// A warm-up under faults first: the connection pools (frontend to
	// workers, agents to their peers) grow to their size, so that the
	// baseline taken after it counts a leak, not a pool filling up.
	warmed, err := warmUp(ctx, c, l, f, out)
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
	streams := warmed
	var faultErrs []error
	var mid processes
	for i := 0; i < 2; i++ {
		stop := l.Steady(ctx)
		r.Event(time.Now(), EvLoadStart, "half %d: %d streams × %d tokens, each started again as it ends", i+1, o.Config.Streams, o.Config.MaxTokens)
		fmt.Fprintf(out, "soak: half %d: %v of faults, one every %v…\n", i+1, o.Duration/2, o.KillEvery)
		err := f.run(ctx, o.Duration/2)
		streams = append(streams, stop()...)
		faultErrs = append(faultErrs, err)
		r.Event(time.Now(), EvLoadEnd, "")
		if i == 0 {
			if _, _, mid, err = c.settle(ctx, processes{}); err != nil {
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
	strays, err := c.strays(ctx)
	if err != nil {
		return err
	}
	oc := l.Compare(streams)
	// A stream that differs comes with its trace: where it was served.
	for _, d := range oc.Diverged[:min(len(oc.Diverged), 3)] {
		r.Trace(c.requestTrace(ctx, d.Result.RequestID))
	}
	Latencies(r, streams)
	judgeSoak(r, o, oc, soakEnd{faults: f.counts, skipped: f.skipped, tokens: tokens, faultErr: errors.Join(append(faultErrs, f.err())...), base: base, left: left,
		inFlight: inFlight, before: before, mid: mid, after: after, strays: strays, heldBy: holders(ctx, c), fdSlack: poolSlack(o, c, mid, after)})
	return nil
}

// poolSlack is how many descriptors the processes compared over the
// second half may gain from connection pools filling: with agents or
// frontends killed, the processes that ran on dial afresh at any time
// (a takeover's first request to a worker, a restarted agent's peers), up
// to one connection per worker endpoint from a frontend and 4 per peer
// from an agent. Without those kills the pools filled in the first half:
// none.
func poolSlack(o SoakOptions, c *Cluster, mid, after processes) int {
	if !slices.Contains(o.Faults, FaultAgent) && !slices.Contains(o.Faults, FaultFrontend) {
		return 0
	}
	_, skipped := growth(mid, after)
	compared := len(after.per) - len(skipped)
	workers := o.Nodes + 1 // a decode worker per node, one prefill
	return compared * (workers + 4*(o.Nodes-1))
}

// soakEnd is what a soak ends with.
type soakEnd struct {
	faults           map[string]int
	skipped          int
	tokens, inFlight int
	faultErr         error
	base, left       leaks
	heldBy           string // who holds unpublished slots at the end
	strays           strays // processes and segments nothing accounts for
	// fdSlack is how many descriptors the processes compared may gain
	// over the second half without a leak: connections their pools had
	// not dialled yet (see poolSlack).
	fdSlack int
	// before is after the warm-up, mid between the halves, after at
	// the end.
	before, mid, after processes
}

// judgeSoak records a soak's figures and verdict.
func judgeSoak(r *Recorder, o SoakOptions, oc Outcome, e soakEnd) {
	left, base, before, mid, after := e.left, e.base, e.before, e.mid, e.after
	figuresOf(r, oc)
	rss := 0.0
	if before.rss > 0 {
		rss = after.rss / before.rss
	}
	second, restarted := growth(mid, after)
	first, _ := growth(before, mid)
	kills, kinds := 0, []string(nil)
	for _, k := range slices.Compact(slices.Sorted(slices.Values(o.Faults))) {
		n := e.faults[k]
		r.Figure("faults_"+strings.ReplaceAll(k, "-", "_"), float64(n))
		if k != FaultStop && k != FaultDrain {
			kills += n
		}
		kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
	}
	r.Figure("duration_s", o.Duration.Seconds())
	r.Figure("kills", float64(kills))
	r.Figure("stops", float64(e.faults[FaultStop]))
	r.Figure("turns_skipped", float64(e.skipped))
	r.Figure("tokens", float64(e.tokens))
	r.Figure("completed", float64(oc.Completed))
	r.Figure("leaked_slots", float64(left.over(base).slots))
	r.Figure("leaked_leases", float64(left.over(base).leases))
	r.Figure("leaked_pulls", float64(left.over(base).pulls))
	r.Figure("leaked_in_flight", float64(e.inFlight))
	r.Figure("leaked_processes", float64(len(e.strays.processes)))
	r.Figure("leaked_segments", float64(len(e.strays.segments)))
	r.Figure("leaked_goroutines", second.ours)
	r.Figure("goroutines_delta", second.goroutines)
	r.Figure("leaked_fds", max(second.fds-float64(e.fdSlack), 0))
	r.Figure("fds_delta", second.fds)
	r.Figure("fds_allowed", float64(e.fdSlack))
	r.Figure("not_compared", float64(len(restarted)))
	r.Figure("first_half_goroutines", first.goroutines)
	r.Figure("first_half_fds", first.fds)
	r.Figure("rss_start_mb", before.rss/(1<<20))
	r.Figure("rss_end_mb", after.rss/(1<<20))
	r.Figure("rss_growth", rss)
	var ck Check
	ck.That(e.faultErr == nil, "a fault could not be injected or healed: %v", e.faultErr)
	for _, k := range o.Faults {
		ck.That(e.faults[k] > 0, "no %s fault was injected in %v (%s; %d turns skipped)", k, o.Duration, strings.Join(kinds, ", "), e.skipped)
	}
	ck.That(oc.Failed == 0, "%d streams failed %v (%v)", oc.Failed, oc.Errors, oc.FirstError)
	ck.That(oc.Gaps == 0 && oc.Duplicates == 0, "%d tokens lost, %d duplicated", oc.Gaps, oc.Duplicates)
	ck.That(oc.Identical == oc.Streams, "%d of %d streams bit-identical (%s)", oc.Identical, oc.Streams, oc.FirstDiff)
	ck.That(left.over(base) == (leaks{}) && e.inFlight == 0, "left behind: %+v, %d in flight (before: %+v; unpublished slots held by %s)", left, e.inFlight, base, e.heldBy)
	ck.That(len(e.strays.processes) == 0, "processes no agent, frontend or etcd member accounts for: %v", e.strays.processes)
	ck.That(len(e.strays.segments) == 0, "segments no running group accounts for: %v", e.strays.segments)
	ck.That(second.ours <= 0, "%v goroutines of lifeline's code more than between the halves (all: %v → %v; more of: %v)", second.ours, mid.by(), after.by(), moreGoroutines(mid, after))
	ck.That(second.fds <= float64(e.fdSlack), "%v descriptors more than between the halves (%d allowed; goroutines/descriptors: %v → %v; more goroutines of: %v)", second.fds, e.fdSlack, mid.by(), after.by(), moreGoroutines(mid, after))
	ck.That(rss < MaxRSSGrowth, "resident memory grew %.2f× (bound %.1f×)", rss, MaxRSSGrowth)
	ck.Verdict(r, fmt.Sprintf("%s in %v: %d streams, %d tokens, 0 lost or duplicated, all bit-identical; nothing leaked, RSS %.2f×",
		strings.Join(kinds, ", "), o.Duration, oc.Streams, e.tokens, rss))
}

// warmUp runs l under f's faults for a quarter of the soak (2 turns at
// least, 30 s at most) and lets the cluster settle; it returns the
// streams.
func warmUp(ctx context.Context, c *Cluster, l *Load, f *faulter, out io.Writer) ([]*Stream, error) {
	d := max(min(f.o.Duration/4, 30*time.Second), 2*f.o.KillEvery)
	fmt.Fprintf(out, "soak: warm-up, %v of faults…\n", d)
	stop := l.Steady(ctx)
	err := f.run(ctx, d)
	streams := stop()
	if err != nil {
		return nil, err
	}
	if _, _, _, err := c.settle(ctx, processes{}); err != nil {
		return nil, err
	}
	f.r.Event(time.Now(), EvPhase, "warmed up (%v): the baseline", f.counts)
	return streams, nil
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
	grown := func() bool { d, _ := growth(before, after); return d.ours > 0 || d.fds > 0 }
	for deadline := time.Now().Add(30 * time.Second); err == nil && grown() && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return left, inFlight, after, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		after, err = c.processes(ctx)
	}
	return left, inFlight, after, err
}

// strays is what a local cluster left that nothing accounts for.
type strays struct {
	// processes mention the cluster's directory but are no agent,
	// frontend, etcd member or worker of it (a worker nobody adopted).
	processes []string
	// segments are tensor-parallel group segments of the cluster's
	// instances beyond the one a running group uses.
	segments []string
}

// strays lists what a settled local cluster left running or in
// /dev/shm that nothing accounts for (nothing for a cluster not
// started here).
func (c *Cluster) strays(ctx context.Context) (strays, error) {
	var s strays
	if c.env == nil {
		return s, nil
	}
	ws, err := c.Workers(ctx)
	if err != nil {
		return s, err
	}
	known := map[int]bool{}
	groups := map[string]bool{}
	for _, w := range ws {
		known[w.PID] = true
		for _, r := range w.Ranks {
			known[r.PID] = true
		}
		groups[w.InstanceID] = w.TP > 1
	}
	for _, n := range c.nodes {
		if p := n.Process(); p != nil {
			known[p.Pid] = true
		}
	}
	for i := range c.URLs {
		known[c.frontend(i).PID()] = true
	}
	for _, m := range c.env.Members {
		known[m.PID()] = true
	}
	for _, p := range procfs.Mentioning(c.env.Dir) {
		if !known[p.PID] && p.PID != os.Getpid() {
			s.processes = append(s.processes, fmt.Sprintf("%d %s", p.PID, strings.Join(p.Args(), " ")))
		}
	}
	for _, n := range c.nodes {
		// A group's segments are named after its agent's arena.
		dir, arena := filepath.Split(n.Options.ArenaPath)
		entries, _ := os.ReadDir(dir)
		for id, tp := range groups {
			var of []string
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), arena+".group-"+id+"-") {
					of = append(of, filepath.Join(dir, e.Name()))
				}
			}
			if tp && len(of) > 0 {
				of = of[1:] // the running group's
			}
			s.segments = append(s.segments, of...)
		}
	}
	slices.Sort(s.segments)
	s.segments = slices.Compact(s.segments)
	return s, nil
}
