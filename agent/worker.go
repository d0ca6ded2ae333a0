package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/collective"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/ebpf"
)

// errNoGeneration wraps a failure to allocate a generation.
var errNoGeneration = errors.New("agent: no generation")

// readyTimeout bounds a worker's start: one that has not printed its Ready
// line by then is killed.
const readyTimeout = 60 * time.Second

// workerProc is a worker process the agent started, and the channels that
// report on it.
type workerProc struct {
	cmd *exec.Cmd
	pid int
	// detected is the detector's report of its death, waited the reaper's
	// (authoritative exit status), ready its Ready line.
	detected chan ebpf.Exit
	waited   chan ebpf.Exit
	ready    chan workerclient.Ready
	// segment and followers, for rank 0 of a tensor-parallel group: its
	// collective segment and ranks 1..n-1 (group.go).
	segment   string
	followers []*workerProc
	// exited is closed once the reaper saw the process exit.
	exited chan struct{}
	// abortedAt is when its group was aborted.
	abortedAt time.Time
}

// runOnce starts the worker at a new generation and supervises it until it
// dies; it returns the exit event.
func (a *Agent) runOnce(ctx context.Context, inst *instance) (*controlapi.Event, error) {
	span := a.startSpan(inst)
	gen, err := a.nextGeneration(ctx, inst.id)
	if err != nil {
		endSpan(span, err.Error())
		return nil, fmt.Errorf("%w: %v", errNoGeneration, err)
	}
	span.AddEvent("generation", trace.WithAttributes(attribute.Int64("generation", int64(gen))))
	span.SetAttributes(attribute.Int64("generation", int64(gen)))
	w, err := a.startWorker(inst, gen)
	if err != nil {
		endSpan(span, err.Error())
		return nil, err
	}
	span.AddEvent("process_started", trace.WithAttributes(attribute.Int("pid", w.pid)))
	a.mu.Lock()
	inst.starting = span
	a.mu.Unlock()
	// The canaries stop once the death was acted on, not before.
	wctx, stopInstance := context.WithCancel(ctx)
	defer stopInstance()
	death := a.watchWorker(ctx, wctx, inst, gen, w)
	// A group's surviving ranks are told at once (their collectives
	// return) and killed: gone before the death is acted on, so that none
	// writes into the group's blocks once they are reclaimed.
	a.abortGroup(inst, gen, w)
	a.endGroup(inst, gen, w)
	if death.Detector == "" {
		return nil, ctx.Err() // agent shutting down
	}
	a.mu.Lock()
	gen = inst.gen // raised if the instance was re-registered meanwhile
	a.mu.Unlock()
	return a.onDeath(inst, gen, death), nil
}

// workerArgs is the command line of inst's worker at generation gen.
func (a *Agent) workerArgs(inst *instance, gen uint64) workerclient.Args {
	args := workerclient.Args{InstanceID: inst.id, Generation: gen, Role: inst.spec.Role, Listen: net.JoinHostPort(a.opts.BindAddress, "0"), CertDir: a.workerCertDir(inst.id),
		Preset: inst.spec.Preset, WeightSeed: inst.spec.WeightSeed, KVSocket: a.kvSocket, KVTransfer: a.kvAddr,
		MaxRunning: inst.spec.MaxRunning, MaxQueued: inst.spec.MaxQueued,
		DraftPreset: inst.spec.DraftPreset, DraftLayers: inst.spec.DraftLayers, DraftK: inst.spec.DraftK,
		AgentSocket: a.opts.Socket, OrphanTimeout: time.Duration(a.opts.WorkerOrphanTimeout), SyntheticRate: inst.spec.SyntheticRate,
		StepInterval: time.Duration(inst.spec.StepInterval)}
	if sp := inst.spec; sp.Model != "" {
		args.Engine, args.ModelPath, args.ServedName = sp.Engine, sp.Model, sp.ServedName
		args.ContextLen, args.Threads, args.GPULayers = sp.ContextLen, sp.Threads, sp.GPULayers
		args.RevisionCache = filepath.Join(a.opts.DataDir, "revisions")
	}
	if n := inst.spec.ranks(); n > 1 {
		args.TP = n
		args.GroupSegment, args.GroupGeneration = a.segmentPath(inst, gen), gen
	}
	return args
}

// startWorker spawns inst's worker at generation gen, places it and
// watches it.
func (a *Agent) startWorker(inst *instance, gen uint64) (*workerProc, error) {
	if err := a.issueWorkerCert(inst.id); err != nil {
		return nil, err
	}
	var segment string
	if inst.spec.ranks() > 1 {
		var err error
		if segment, err = a.createSegment(inst, gen); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(a.opts.WorkerBinary, append([]string{workerclient.Command}, a.workerArgs(inst, gen).Argv()...)...)
	// Workers outlive an agent restart (systemd KillMode=process): their
	// own process group, no parent-death signal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = inst.spec.workerEnv()
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("agent: start worker %s: %w", inst.id, err)
	}
	if err := a.placeWorker(inst, cmd); err != nil {
		return nil, err
	}
	w := &workerProc{cmd: cmd, pid: cmd.Process.Pid, detected: make(chan ebpf.Exit, 1), waited: make(chan ebpf.Exit, 1),
		ready: make(chan workerclient.Ready, 1), segment: segment, exited: make(chan struct{})}
	a.mu.Lock()
	inst.gen, inst.kvGen, inst.pid, inst.addr, inst.state, inst.ready, inst.notReady = gen, gen, w.pid, "", "starting", false, "starting"
	a.byPID[w.pid] = w.detected
	a.mu.Unlock()
	if err := a.detector.Watch(w.pid); err != nil {
		a.log.Warn("cannot watch worker", "instance_id", inst.id, "pid", w.pid, "err", err)
	}
	a.emit(controlapi.Event{Kind: controlapi.EventStarted, InstanceID: inst.id, Generation: gen, PID: w.pid})
	a.log.Info("worker started", "instance_id", inst.id, "generation", gen, "pid", w.pid)
	// The reaper: the authoritative exit status, and a death path that
	// does not depend on the detector.
	a.track(w.reap)
	a.track(func() { readReady(stdout, w.ready) })
	if segment != "" {
		if err := a.startFollowers(inst, gen, w); err != nil {
			// Rank 0 waits for them at the rendezvous: the group ends, its
			// death is the instance's.
			a.log.Warn("cannot start the group", "instance_id", inst.id, "generation", gen, "err", err)
			collective.AbortSegment(segment)
		}
	}
	return w, nil
}

// placeWorker gives a started worker its OOM score and cgroup. A worker
// that cannot be placed in its cgroup is killed: it does not run
// unlimited.
func (a *Agent) placeWorker(inst *instance, cmd *exec.Cmd) error {
	pid := cmd.Process.Pid
	// A worker inherits the agent's OOM score (the unit lowers it); under
	// memory pressure the kernel should pick a worker, not the agent.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte("0"), 0); err != nil {
		a.log.Warn("cannot reset worker OOM score", "instance_id", inst.id, "pid", pid, "err", err)
	}
	if a.opts.WorkerCgroup == "" {
		return nil
	}
	// Before the worker allocates anything worth limiting.
	if err := os.WriteFile(filepath.Join(a.opts.WorkerCgroup, "cgroup.procs"), []byte(fmt.Sprint(pid)), 0); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return fmt.Errorf("agent: worker %s into cgroup %s: %w", inst.id, a.opts.WorkerCgroup, err)
	}
	return nil
}

// reap waits for the worker to exit and reports its status on w.waited
// (which has room for it: the send never blocks).
func (w *workerProc) reap() {
	w.cmd.Wait() // the exit status is in ProcessState
	if w.exited != nil {
		defer close(w.exited)
	}
	ex := ebpf.Exit{PID: w.pid, Code: w.cmd.ProcessState.ExitCode(), Detector: "wait", DetectedAt: time.Now()}
	if ws, ok := w.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		ex.Code, ex.Signal = -1, int(ws.Signal())
	}
	w.waited <- ex
}

// readReady delivers the worker's Ready line, then drains its stdout until
// the reaper closes it.
func readReady(stdout io.Reader, ready chan<- workerclient.Ready) {
	dec := json.NewDecoder(bufio.NewReader(stdout))
	var r workerclient.Ready
	if dec.Decode(&r) == nil {
		ready <- r
	}
	io.Copy(io.Discard, stdout)
}

// watchWorker waits for the worker to be ready, starts its canaries (under
// wctx) and waits for its death. It returns a zero Exit when ctx ended
// first: the worker was then stopped.
func (a *Agent) watchWorker(ctx, wctx context.Context, inst *instance, gen uint64, w *workerProc) ebpf.Exit {
	select {
	case r := <-w.ready:
		if r.Error != "" {
			a.mu.Lock()
			inst.startError = r.Error
			a.mu.Unlock()
			return a.awaitDeath(ctx, w.detected, w.waited, w.cmd.Process)
		}
		a.workerReady(inst, w.pid, r)
		a.track(func() { a.canaryLoop(wctx, inst, gen, w.cmd.Process) })
		return a.awaitDeath(ctx, w.detected, w.waited, w.cmd.Process)
	case d := <-w.detected:
		return settle(d, w.detected, w.waited)
	case x := <-w.waited:
		return settle(x, w.detected, w.waited)
	case <-time.After(readyTimeout):
		w.cmd.Process.Kill()
		return settle(<-w.waited, w.detected, w.waited)
	case <-ctx.Done():
		a.stopWorker(w.cmd.Process, w.waited)
		return ebpf.Exit{}
	}
}

// workerReady records what the worker's Ready line says and remembers the
// worker for a restarted agent to adopt.
func (a *Agent) workerReady(inst *instance, pid int, r workerclient.Ready) {
	a.mu.Lock()
	inst.addr, inst.model, inst.revision, inst.numerics, inst.kvIdentity, inst.state = r.Addr, r.Model, r.ModelRevision, r.NumericsID, r.KVIdentity, "running"
	inst.startError = ""
	inst.contextLen, inst.tokenizerHash, inst.continuation = r.ContextLen, r.TokenizerHash, r.Continuation
	inst.capacity, inst.batchCapacity = r.Capacity, r.BatchCapacity
	if !inst.groupEndedAt.IsZero() {
		a.metrics.groupReboot.Observe(time.Since(inst.groupEndedAt).Seconds())
		inst.groupEndedAt = time.Time{}
	}
	if inst.starting != nil {
		inst.starting.AddEvent("ready", trace.WithAttributes(attribute.String("addr", r.Addr)))
		inst.starting.End()
		inst.starting = nil
	}
	rec := inst.recordLocked()
	a.mu.Unlock()
	if st, err := processStartTime(pid); err == nil {
		rec.StartTime = st
		a.saveWorker(rec)
	}
}

// awaitDeath waits for the first report of the worker's death: the
// detector's (microseconds) or the reaper's.
func (a *Agent) awaitDeath(ctx context.Context, detected, waited chan ebpf.Exit, p *os.Process) ebpf.Exit {
	select {
	case d := <-detected:
		return settle(d, detected, waited)
	case w := <-waited:
		return settle(w, detected, waited)
	case <-ctx.Done():
		a.stopWorker(p, waited)
		return ebpf.Exit{}
	}
}

// settle completes a first report of a child's death with the other
// source. A detector report that knows the exit status (eBPF) is acted on
// at once; the reaper finishes on its own. A detector report that does not
// (pidfd on an already reaped child) waits for the reaper's status. A
// reaper report waits briefly for the detector, the only one that knows an
// OOM kill and whose timestamp is the earlier one. The kernel emits the
// detector's event before the child can be reaped, so it is only late
// when the agent is starved of CPU: the wait covers that (on an idle node
// the detector's report comes first, in microseconds).
func settle(first ebpf.Exit, detected, waited chan ebpf.Exit) ebpf.Exit {
	if first.Detector != "wait" {
		if first.Code >= 0 || first.Signal != 0 {
			return first
		}
		select {
		case w := <-waited:
			w.Detector, w.DetectedAt, w.OOM = first.Detector, first.DetectedAt, first.OOM
			return w
		case <-time.After(2 * time.Second):
			return first
		}
	}
	select {
	case d := <-detected:
		first.Detector, first.DetectedAt, first.OOM = d.Detector, d.DetectedAt, d.OOM
	case <-time.After(250 * time.Millisecond):
	}
	return first
}

// stopWorker ends a worker on agent shutdown: SIGTERM, then SIGKILL.
func (a *Agent) stopWorker(p *os.Process, waited chan ebpf.Exit) {
	p.Signal(syscall.SIGTERM)
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		p.Kill()
		<-waited
	}
}
