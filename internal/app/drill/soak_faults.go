package drill

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/nodectl"
	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
)

// The faults a soak injects (SoakOptions.Faults), one per turn.
const (
	// FaultDecode and FaultPrefill SIGKILL a ready worker of that role
	// (its agent restarts it).
	FaultDecode  = "decode"
	FaultPrefill = "prefill"
	// FaultStop SIGSTOPs a ready worker for SoakOptions.StopFor.
	FaultStop = "stop"
	// FaultAgent SIGKILLs a node agent and starts it again at once, as
	// systemd would: it adopts the workers that ran on.
	FaultAgent = "agent"
	// FaultFrontend SIGKILLs a frontend and starts it again on its
	// address; its clients resume meanwhile on another.
	FaultFrontend = "frontend"
	// FaultLeader SIGKILLs etcd's leader and starts it again once another
	// member leads.
	FaultLeader = "etcd-leader"
	// FaultDrain drains a node and undrains it once drained.
	FaultDrain = "drain"
)

// SoakFaults is the default turn order: every kind, decode kills most
// often.
var SoakFaults = []string{FaultDecode, FaultAgent, FaultPrefill, FaultFrontend, FaultDecode, FaultStop, FaultLeader, FaultDecode, FaultDrain}

// checkFaults refuses a turn order that names an unknown fault.
func checkFaults(kinds []string) error {
	known := []string{FaultDecode, FaultPrefill, FaultStop, FaultAgent, FaultFrontend, FaultLeader, FaultDrain}
	if len(kinds) == 0 {
		return fmt.Errorf("drill: soak: no faults; name some of %s", strings.Join(known, ", "))
	}
	for _, k := range kinds {
		if !slices.Contains(known, k) {
			return fmt.Errorf("drill: soak: unknown fault %q; the faults are %s", k, strings.Join(known, ", "))
		}
	}
	return nil
}

// faulter injects a soak's faults, one per turn, and heals what a fault
// leaves down (an agent, a frontend, an etcd member, a drained node), as
// the machine's supervisor or its operator would.
type faulter struct {
	c *Cluster
	o SoakOptions
	r *Recorder

	mu      sync.Mutex
	stopped map[int]bool
	// heavy is the agent kill, etcd leader kill or drain being healed
	// ("" none): one at a time, so that a turn never takes more than one
	// node's or member's share of the cluster.
	heavy string
	// frontDown is a frontend killed and not serving again yet.
	frontDown bool
	counts    map[string]int
	// skipped counts the turns whose fault could not be injected (none
	// of its kind, nor of the next kinds, was possible then).
	skipped int
	turn    int
	owed    []string
	next    map[string]int // round robin within a kind
	errs    []error
	heals   sync.WaitGroup
}

func newFaulter(c *Cluster, o SoakOptions, r *Recorder) *faulter {
	return &faulter{c: c, o: o, r: r, stopped: map[int]bool{}, counts: map[string]int{}, next: map[string]int{}}
}

// run injects a fault every o.KillEvery for d, then waits until every
// fault is healed (stopped workers continued, killed processes serving
// again, drained nodes back).
func (f *faulter) run(ctx context.Context, d time.Duration) error {
	defer f.heals.Wait()
	end := time.Now().Add(d)
	tick := time.NewTicker(f.o.KillEvery)
	defer tick.Stop()
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		ws := f.workers(ctx)
		// The kinds owed (their turn came when they could not be
		// injected: a node was out already, say), oldest first, then this
		// turn's; the first that can be is injected, the others owed.
		kinds := append(f.owed, f.o.Faults[f.turn%len(f.o.Faults)])
		f.turn++
		f.owed = nil
		injected := false
		for _, kind := range kinds {
			if injected {
				f.owe(kind)
				continue
			}
			ok, err := f.inject(ctx, kind, ws)
			if err != nil {
				return err
			}
			if injected = ok; !ok {
				f.owe(kind)
			}
		}
		if !injected {
			f.skipped++
		}
	}
	return nil
}

// owe queues kind for the next turn (once).
func (f *faulter) owe(kind string) {
	if !slices.Contains(f.owed, kind) {
		f.owed = append(f.owed, kind)
	}
}

// err is every healing's error.
func (f *faulter) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.errs...)
}

// workers lists the workers of the agents that answer (one being
// restarted does not).
func (f *faulter) workers(ctx context.Context) []Worker {
	var out []Worker
	for _, s := range f.c.Sockets {
		st, err := nodectl.GetStatus(ctx, s)
		if err != nil {
			continue
		}
		for _, w := range st.Instances {
			out = append(out, Worker{Worker: w, Socket: s, Node: st.NodeID})
		}
	}
	return out
}

// pick is the next of ws, round robin within kind.
func (f *faulter) pick(kind string, n int) int {
	i := f.next[kind] % n
	f.next[kind]++
	return i
}

// inject injects one fault of kind when its precondition holds: at least
// two decode workers ready and running besides a worker fault's victim
// or an agent's or drain's node; one heavy fault and one frontend down at
// a time.
func (f *faulter) inject(ctx context.Context, kind string, ws []Worker) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ready, decodes []Worker
	allDecodes := 0
	for _, w := range ws {
		if w.Role == "decode" {
			allDecodes++
		}
		if w.Ready && w.PID > 0 && !f.stopped[w.PID] {
			ready = append(ready, w)
			if w.Role == "decode" {
				decodes = append(decodes, w)
			}
		}
	}
	var ok bool
	var err error
	switch kind {
	case FaultDecode, FaultPrefill, FaultStop:
		ok, err = f.workerFault(kind, ready, decodes)
	case FaultAgent, FaultDrain:
		if f.heavy != "" || len(f.c.nodes) < 2 || len(decodes) < allDecodes || len(decodes) < 2 {
			return false, nil
		}
		ok, err = f.nodeFault(ctx, kind, ws)
	case FaultLeader:
		ok, err = f.leaderFault(ctx)
	case FaultFrontend:
		ok, err = f.frontendFault(ctx)
	default:
		return false, fmt.Errorf("drill: soak: unknown fault %q", kind)
	}
	if !ok || err != nil {
		return false, err
	}
	f.counts[kind]++
	return true, nil
}

// workerFault SIGKILLs (or SIGSTOPs) a ready worker of kind's role, one
// decode worker at least left serving.
func (f *faulter) workerFault(kind string, ready, decodes []Worker) (bool, error) {
	now := time.Now()
	pool := ready
	if kind != FaultStop {
		pool = slices.DeleteFunc(slices.Clone(ready), func(w Worker) bool { return w.Role != kind })
	}
	if len(pool) == 0 {
		return false, nil
	}
	w := pool[f.pick(kind, len(pool))]
	if w.Role == "decode" && len(decodes) < 2 {
		return false, nil // keep one serving: a fault, not an outage
	}
	if kind == FaultStop {
		if err := syscall.Kill(w.PID, syscall.SIGSTOP); err != nil && err != syscall.ESRCH {
			return false, err
		}
		f.stopped[w.PID] = true
		f.r.Event(now, EvFault, "SIGSTOP %s (pid %d) for %v", w.InstanceID, w.PID, f.o.StopFor)
		f.heals.Add(1)
		time.AfterFunc(f.o.StopFor, func() { defer f.heals.Done(); f.cont(w.PID) })
	} else {
		if err := syscall.Kill(w.PID, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
			return false, err
		}
		f.r.Event(now, EvFault, "SIGKILL %s (pid %d, generation %d)", w.InstanceID, w.PID, w.Generation)
	}
	return true, nil
}

// nodeFault SIGKILLs a node's agent or drains the node, and heals it in
// the background.
func (f *faulter) nodeFault(ctx context.Context, kind string, ws []Worker) (bool, error) {
	now := time.Now()
	i := f.pick(kind, len(f.c.nodes))
	n, socket := f.c.nodes[i], f.c.Sockets[i]
	f.heavy = kind + " " + n.Options.NodeID
	if kind == FaultAgent {
		pids := workersOn(ws, socket)
		n.Signal(syscall.SIGKILL)
		f.r.Event(now, EvFault, "SIGKILL agent %s (its workers %v run on)", n.Options.NodeID, pids)
		f.heal(ctx, func(ctx context.Context) error { return f.restartAgent(ctx, i, socket, pids) })
	} else {
		if _, err := nodectl.Drain(ctx, socket, controlapi.DrainRequest{Deadline: "10s", HardDeadline: "30s"}); err != nil {
			f.heavy = ""
			return false, fmt.Errorf("drill: drain %s: %w", n.Options.NodeID, err)
		}
		f.r.Event(now, EvFault, "drain %s", n.Options.NodeID)
		f.heal(ctx, func(ctx context.Context) error { return f.undrain(ctx, n.Options.NodeID, socket) })
	}
	return true, nil
}

// leaderFault SIGKILLs etcd's leader and starts it again once another
// leads.
func (f *faulter) leaderFault(ctx context.Context) (bool, error) {
	now := time.Now()
	if f.heavy != "" || f.c.env == nil || len(f.c.env.Members) < 3 {
		return false, nil
	}
	leader, id, err := f.c.etcdLeader(ctx, f.c.env.Members)
	if err != nil {
		return false, nil // between leaders: another turn
	}
	f.heavy = FaultLeader
	leader.Signal(syscall.SIGKILL)
	f.r.Event(now, EvFault, "SIGKILL the etcd leader %s", leader.Name)
	f.heal(ctx, func(ctx context.Context) error { return f.restartMember(ctx, leader, id) })
	return true, nil
}

// frontendFault SIGKILLs a frontend and starts it again on its address.
func (f *faulter) frontendFault(ctx context.Context) (bool, error) {
	now := time.Now()
	if f.frontDown || len(f.c.URLs) < 2 {
		return false, nil
	}
	i := f.pick(FaultFrontend, len(f.c.URLs))
	fe := f.c.frontend(i)
	if err := fe.Signal(syscall.SIGKILL); err != nil {
		return false, fmt.Errorf("drill: SIGKILL frontend %d: %w", i, err)
	}
	f.frontDown = true
	f.r.Event(now, EvFault, "SIGKILL frontend %s (pid %d)", f.c.URLs[i], fe.PID())
	f.heals.Add(1)
	go func() {
		defer f.heals.Done()
		err := f.c.relaunchFrontend(ctx, i)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.frontDown = false
		if err != nil {
			f.errs = append(f.errs, err)
			return
		}
		f.r.Event(time.Now(), EvRecovered, "frontend %s serving again", f.c.URLs[i])
	}()
	return true, nil
}

// heal runs a heavy fault's healing in the background; the next heavy
// fault waits for its end.
func (f *faulter) heal(ctx context.Context, heal func(context.Context) error) {
	f.heals.Add(1)
	go func() {
		defer f.heals.Done()
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		err := heal(ctx)
		f.mu.Lock()
		defer f.mu.Unlock()
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s: %w", f.heavy, err))
		}
		f.heavy = ""
	}()
}

// cont continues a stopped worker.
func (f *faulter) cont(pid int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped[pid] {
		syscall.Kill(pid, syscall.SIGCONT)
		delete(f.stopped, pid)
	}
}

// workersOn is the pids of the workers of the agent at socket.
func workersOn(ws []Worker, socket string) []int {
	var pids []int
	for _, w := range ws {
		if w.Socket == socket && w.PID > 0 {
			pids = append(pids, w.PID)
		}
	}
	return pids
}

// restartAgent starts node i's SIGKILLed agent again once it exited
// (after 100 ms, systemd's RestartSec in our unit) and waits until its
// node is whole: every instance ready. It records which of the workers
// that ran on were adopted. Its metrics port, taken meanwhile by another
// process, is moved to a free one (as lifeline up does).
func (f *faulter) restartAgent(ctx context.Context, i int, socket string, pids []int) error {
	n := f.c.nodes[i]
	select {
	case <-n.Exited():
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-time.After(100 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	moved, err := n.FreeMetricsPort()
	if err != nil {
		return err
	}
	if moved != "" {
		f.c.AgentMetricsURLs[i] = "http://" + n.Options.Metrics
		f.r.Event(time.Now(), EvPhase, "agent %s: %s", n.Options.NodeID, moved)
	}
	if err := n.Start(); err != nil {
		return err
	}
	st, err := f.whole(ctx, socket, func(controlapi.Status) bool { return true })
	if err != nil {
		return fmt.Errorf("agent %s started again: %w", n.Options.NodeID, err)
	}
	adopted := 0
	for _, w := range st.Instances {
		if slices.Contains(pids, w.PID) {
			adopted++
		}
	}
	f.r.Event(time.Now(), EvRecovered, "agent %s back, %d of %d workers adopted", n.Options.NodeID, adopted, len(pids))
	return nil
}

// undrain waits until the node at socket is drained, undrains it and
// waits until it is whole again.
func (f *faulter) undrain(ctx context.Context, node, socket string) error {
	if _, err := f.whole(ctx, socket, func(st controlapi.Status) bool {
		return st.Drain != nil && st.Drain.Phase == controlapi.DrainDrained
	}); err != nil {
		return fmt.Errorf("drain %s: %w", node, err)
	}
	f.r.Event(time.Now(), EvPhase, "%s drained", node)
	if _, err := nodectl.Undrain(ctx, socket); err != nil {
		return fmt.Errorf("undrain %s: %w", node, err)
	}
	if _, err := f.whole(ctx, socket, func(st controlapi.Status) bool { return st.Drain == nil || st.Drain.Phase == "" }); err != nil {
		return fmt.Errorf("undrain %s: %w", node, err)
	}
	f.r.Event(time.Now(), EvRecovered, "%s undrained, serving again", node)
	return nil
}

// whole polls the agent at socket until its status satisfies ok and,
// unless it is draining, every instance of it is ready.
func (f *faulter) whole(ctx context.Context, socket string, ok func(controlapi.Status) bool) (controlapi.Status, error) {
	last := "no answer"
	for {
		st, err := nodectl.GetStatus(ctx, socket)
		if err == nil && ok(st) {
			ready := true
			if st.Drain == nil || st.Drain.Phase == "" {
				for _, w := range st.Instances {
					if !w.Ready {
						ready, last = false, fmt.Sprintf("%s %s %s", w.InstanceID, w.State, w.NotReady)
					}
				}
			}
			if ready {
				return st, nil
			}
		} else if err != nil {
			last = err.Error()
		} else if st.Drain != nil {
			last = "drain " + st.Drain.Phase
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("not whole (last: %s): %w", last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// restartMember waits until an etcd member other than the SIGKILLed
// leader m (id) leads, then starts m again on its data and waits until
// it serves.
func (f *faulter) restartMember(ctx context.Context, m *localcluster.EtcdMember, id uint64) error {
	select {
	case <-m.Exited():
	case <-ctx.Done():
		return ctx.Err()
	}
	var rest []*localcluster.EtcdMember
	for _, o := range f.c.env.Members {
		if o != m {
			rest = append(rest, o)
		}
	}
	elected, err := f.c.newLeader(ctx, rest, id)
	if err != nil {
		return err
	}
	f.r.Event(elected, EvRecovered, "a new etcd leader elected")
	if err := m.Restart(); err != nil {
		return err
	}
	f.r.Event(time.Now(), EvRecovered, "%s started again and serving", m.Name)
	return nil
}
