package agent

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/dgraph-io/badger/v4"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/agent/schema"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/ebpf"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/rdma"
	"github.com/lifeline-llm/lifeline/shm"
)

// Agent is one node's agent.
type Agent struct {
	opts Options
	log  *slog.Logger

	db      *badger.DB
	etcd    *clientv3.Client
	kvOwner *kv.Owner
	// transfer moves KV blocks to and from peers; kvAddr is its advertised
	// endpoint and transport why it uses the transport it does.
	transfer  *rdma.Engine
	kvAddr    string
	transport rdma.Status
	kvSocket  string
	tlsConf   *tls.Config

	detector         ebpf.Detector
	detectorFallback error
	// gpu is nil without a GPU; gpuErr says why.
	gpu    *gpuChecker
	gpuErr error

	events  *eventLog
	metrics *metrics

	mu        sync.Mutex
	instances map[string]*instance
	// byPID routes a detector report to the one process it is about, so
	// that a late report about a previous worker can never be taken for
	// the current one's death.
	byPID map[int]chan ebpf.Exit
	// regMu orders registrations against deregistrations: a snapshot of a
	// ready instance is never written after its death was acted on.
	regMu sync.Mutex
	// gpuFault is set by a critical GPU error; instances stay not ready.
	gpuFault   bool
	lease      clientv3.LeaseID
	leaseAlive time.Time
	started    time.Time
}

// instance is one supervised worker instance (rank 0 only: tp = 1).
type instance struct {
	id   string
	spec InstanceSpec

	// Guarded by Agent.mu.
	gen        uint64
	kvGen      uint64 // the generation the worker started with: its KV writer identity
	pid        int
	addr       string
	state      string // starting, running, restarting, crash_loop, stopped
	ready      bool
	notReady   string // reason when not ready
	lastExit   *controlapi.Event
	spawnFails int // consecutive failures to get a generation
	restarts   int
	model      string
	revision   string
	numerics   string
	kvIdentity *kv.Identity
	canaryFail int
	running    int
	queued     int
	freeBlocks int
}

// Run starts the agent and blocks until ctx is done, then stops the
// workers and deregisters.
func Run(ctx context.Context, opts Options, log *slog.Logger) error {
	opts.Defaults()
	if err := opts.Validate(); err != nil {
		return err
	}
	a := &Agent{opts: opts, log: log, events: newEventLog(), metrics: newMetrics(), instances: map[string]*instance{}, byPID: map[int]chan ebpf.Exit{}, started: time.Now()}
	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return fmt.Errorf("agent: data_dir: %w", err)
	}
	var err error
	if a.tlsConf, err = workerclient.ClientTLS(opts.CertDir); err != nil {
		return fmt.Errorf("agent: certs: %w", err)
	}
	a.db, err = badger.Open(badger.DefaultOptions(filepath.Join(opts.DataDir, "agent")).WithLogger(nil).
		WithMemTableSize(8 << 20).WithValueLogFileSize(16 << 20).WithBlockCacheSize(4 << 20).WithIndexCacheSize(4 << 20))
	if err != nil {
		return fmt.Errorf("agent: state store: %w", err)
	}
	defer a.db.Close()

	// The node's KV arena and its owner service.
	a.kvOwner, err = kv.Open(kv.Options{ArenaPath: opts.ArenaPath, Geometry: shm.Geometry{Slots: opts.ArenaSlots, PayloadSize: opts.ArenaSlotBytes},
		DBDir: filepath.Join(opts.DataDir, "kv"), LeaseTTL: time.Duration(opts.LeaseTTL)})
	if err != nil {
		return err
	}
	defer a.kvOwner.Close()
	a.kvSocket = filepath.Join(opts.DataDir, "kv.sock")
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := kv.Serve(ctx, a.kvOwner, a.kvSocket); err != nil {
			log.Error("kv service stopped", "err", err)
		}
	}()

	if err := a.startTransfer(ctx, &wg); err != nil {
		return err
	}

	switch opts.Detector {
	case "ebpf":
		a.detector, err = ebpf.NewEBPF()
	case "pidfd":
		a.detector, err = ebpf.NewPidfd()
		a.detectorFallback = errors.New("pidfd chosen by configuration")
	default:
		a.detector, a.detectorFallback = ebpf.NewDetector()
	}
	if a.detector == nil {
		return fmt.Errorf("agent: no failure detector: %w", errors.Join(err, a.detectorFallback))
	}
	defer a.detector.Close()
	if a.detectorFallback != nil {
		log.Warn("eBPF failure detection unavailable; using pidfd", "reason", a.detectorFallback)
	}
	log.Info("failure detector", "detector", a.detector.Name())

	if a.gpu, a.gpuErr = newGPUChecker(); a.gpuErr != nil {
		log.Info("GPU health checks off", "reason", a.gpuErr)
	} else {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.gpu.run(ctx, a.onGPUEvent)
			a.gpu.close()
		}()
	}

	ecfg := clientv3.Config{Endpoints: opts.Etcd, DialTimeout: 2 * time.Second}
	if opts.EtcdTLS {
		if ecfg.TLS, err = pki.Load(opts.CertDir, "h2"); err != nil {
			return fmt.Errorf("agent: etcd_tls: %w", err)
		}
	}
	a.etcd, err = clientv3.New(ecfg)
	if err != nil {
		return fmt.Errorf("agent: etcd: %w", err)
	}
	defer a.etcd.Close()
	wg.Add(1)
	go func() { defer wg.Done(); a.keepLease(ctx) }()

	ctl, err := a.serveControl(ctx, &wg)
	if err != nil {
		return err
	}
	defer ctl.Close()
	if opts.Metrics != "" {
		if err := a.serveMetrics(ctx, &wg); err != nil {
			return err
		}
	}

	wg.Add(1)
	go func() { defer wg.Done(); a.dispatchExits(ctx) }()
	for _, spec := range opts.Instances {
		for k := 0; k < spec.Count; k++ {
			inst := &instance{id: fmt.Sprintf("%s-%s-%s-%d", opts.NodeID, spec.Role, spec.Preset, k), spec: spec, state: "starting"}
			a.mu.Lock()
			a.instances[inst.id] = inst
			a.mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); a.supervise(ctx, inst) }()
		}
	}
	// READY=1 once registered: a lease is held and an instance is ready
	// (or none is configured), or after a minute with the reason in STATUS.
	wg.Add(1)
	go func() {
		defer wg.Done()
		deadline := time.Now().Add(time.Minute)
		for ctx.Err() == nil {
			a.mu.Lock()
			ok := a.lease != 0 && (len(a.instances) == 0 || slices.ContainsFunc(slices.Collect(maps.Values(a.instances)), func(i *instance) bool { return i.ready }))
			a.mu.Unlock()
			if ok {
				daemon.SdNotify(false, daemon.SdNotifyReady)
				return
			}
			if time.Now().After(deadline) {
				daemon.SdNotify(false, daemon.SdNotifyReady+"\nSTATUS=no instance ready or no etcd lease after 1m")
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	if interval, err := daemon.SdWatchdogEnabled(false); err == nil && interval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(interval / 2)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					// The agent's own loops answer: the control socket and
					// the lease loop share a.mu; taking it proves no deadlock.
					a.mu.Lock()
					a.mu.Unlock()
					daemon.SdNotify(false, daemon.SdNotifyWatchdog)
				}
			}
		}()
	}
	<-ctx.Done()
	daemon.SdNotify(false, daemon.SdNotifyStopping)
	a.revokeLease()
	return nil
}

// onGPUEvent marks every instance not ready on a critical GPU error. The
// reference engine runs on CPU, so there is no device-to-instance mapping
// yet: a GPU engine will narrow this to the instances on that device.
func (a *Agent) onGPUEvent(e gpuEvent) {
	a.mu.Lock()
	a.gpuFault = true
	for _, inst := range a.instances {
		inst.ready, inst.notReady = false, controlapi.ReasonGPUXid
	}
	a.mu.Unlock()
	a.emit(controlapi.Event{Kind: controlapi.EventNotReady, Reason: controlapi.ReasonGPUXid, Detail: fmt.Sprintf("device %d: %s %d", e.Device, e.Kind, e.XID)})
	a.log.Error("critical GPU error", "failure_reason", controlapi.ReasonGPUXid, "device", e.Device, "kind", e.Kind, "xid", e.XID, "recovery_action", "not ready")
	a.registerAll(context.Background())
}

// dispatchExits routes detector events to the instance that owns the pid.
func (a *Agent) dispatchExits(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case ex, ok := <-a.detector.Exits():
			if !ok {
				return
			}
			a.mu.Lock()
			ch := a.byPID[ex.PID]
			a.mu.Unlock()
			if ch != nil {
				select {
				case ch <- ex:
				default:
				}
			}
		}
	}
}

// supervise keeps one instance running: a new generation for every start,
// restarts with exponential backoff, and a crash-loop limit.
func (a *Agent) supervise(ctx context.Context, inst *instance) {
	backoff := time.Duration(a.opts.RestartBackoff)
	var recent []time.Time
	if rec, ok := a.adoptable(inst.id); ok {
		a.adopt(ctx, inst, rec)
		if ctx.Err() != nil {
			return
		}
	}
	for ctx.Err() == nil {
		started := time.Now()
		_, err := a.runOnce(ctx, inst)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errNoGeneration) {
			// etcd unreachable: not the worker's fault, not a crash. Wait
			// for etcd, without giving up on the instance.
			a.setState(inst, "waiting_for_etcd")
			a.log.Warn("cannot get a generation", "instance_id", inst.id, "err", err, "recovery_action", "retry")
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		if err != nil {
			a.log.Error("worker start failed", "instance_id", inst.id, "err", err, "recovery_action", "restart")
		}
		// A worker that ran for a whole window was healthy: start over.
		if time.Since(started) > time.Duration(a.opts.CrashLoopWindow) {
			backoff = time.Duration(a.opts.RestartBackoff)
			recent = recent[:0]
		}
		recent = append(recent, time.Now())
		for len(recent) > 0 && time.Since(recent[0]) > time.Duration(a.opts.CrashLoopWindow) {
			recent = recent[1:]
		}
		if len(recent) > a.opts.CrashLoopLimit {
			a.setState(inst, "crash_loop")
			a.emit(controlapi.Event{Kind: controlapi.EventCrashLoop, InstanceID: inst.id, Detail: fmt.Sprintf("%d exits within %v", len(recent), time.Duration(a.opts.CrashLoopWindow))})
			a.log.Error("crash loop: giving up on instance", "instance_id", inst.id, "recovery_action", "none")
			return
		}
		a.setState(inst, "restarting")
		jitter := time.Duration(rand.Int64N(int64(backoff)/5 + 1))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff + jitter):
		}
		backoff = min(2*backoff, time.Duration(a.opts.RestartMax))
		a.mu.Lock()
		inst.restarts++
		a.mu.Unlock()
		a.metrics.restarts.WithLabelValues(inst.id).Inc()
	}
}

func (a *Agent) setState(inst *instance, state string) {
	a.mu.Lock()
	inst.state = state
	a.mu.Unlock()
}

func (a *Agent) emit(e controlapi.Event) controlapi.Event {
	e.Node = a.opts.NodeID
	return a.events.add(e)
}

// runOnce starts the worker at a new generation and supervises it until it
// dies; it returns the exit event.
// errNoGeneration wraps a failure to allocate a generation.
var errNoGeneration = errors.New("agent: no generation")

func (a *Agent) runOnce(ctx context.Context, inst *instance) (*controlapi.Event, error) {
	gen, err := a.nextGeneration(ctx, inst.id)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoGeneration, err)
	}
	cmd := exec.Command(a.opts.WorkerBinary, "worker", "--instance-id", inst.id, "--generation", fmt.Sprint(gen),
		"--role", inst.spec.Role, "--preset", inst.spec.Preset, "--weight-seed", fmt.Sprint(inst.spec.WeightSeed),
		"--listen", "127.0.0.1:0", "--certs", a.opts.CertDir, "--kv-socket", a.kvSocket, "--kv-transfer", a.kvAddr,
		"--max-running", fmt.Sprint(inst.spec.MaxRunning), "--max-queued", fmt.Sprint(inst.spec.MaxQueued))
	// Workers outlive an agent restart (systemd KillMode=process): their
	// own process group, no parent-death signal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("agent: start worker %s: %w", inst.id, err)
	}
	pid := cmd.Process.Pid
	// A worker inherits the agent's OOM score (the unit lowers it); under
	// memory pressure the kernel should pick a worker, not the agent.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte("0"), 0); err != nil {
		a.log.Warn("cannot reset worker OOM score", "instance_id", inst.id, "pid", pid, "err", err)
	}
	if a.opts.WorkerCgroup != "" {
		// Before the worker allocates anything worth limiting; a worker
		// that cannot be placed does not run unlimited.
		if err := os.WriteFile(filepath.Join(a.opts.WorkerCgroup, "cgroup.procs"), []byte(fmt.Sprint(pid)), 0); err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			return nil, fmt.Errorf("agent: worker %s into cgroup %s: %w", inst.id, a.opts.WorkerCgroup, err)
		}
	}
	detected := make(chan ebpf.Exit, 1)
	a.mu.Lock()
	inst.gen, inst.kvGen, inst.pid, inst.addr, inst.state, inst.ready, inst.notReady = gen, gen, pid, "", "starting", false, "starting"
	a.byPID[pid] = detected
	a.mu.Unlock()
	if err := a.detector.Watch(pid); err != nil {
		a.log.Warn("cannot watch worker", "instance_id", inst.id, "pid", pid, "err", err)
	}
	a.emit(controlapi.Event{Kind: controlapi.EventStarted, InstanceID: inst.id, Generation: gen, PID: pid})
	a.log.Info("worker started", "instance_id", inst.id, "generation", gen, "pid", pid)

	// The reaper: the authoritative exit status, and a death path that does
	// not depend on the detector.
	waited := make(chan ebpf.Exit, 1)
	go func() {
		cmd.Wait() // the exit status is in ProcessState
		ex := ebpf.Exit{PID: pid, Code: cmd.ProcessState.ExitCode(), Detector: "wait", DetectedAt: time.Now()}
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			ex.Code, ex.Signal = -1, int(ws.Signal())
		}
		waited <- ex
	}()
	readyc := make(chan workerclient.Ready, 1)
	go func() {
		dec := json.NewDecoder(bufio.NewReader(stdout))
		var r workerclient.Ready
		if dec.Decode(&r) == nil {
			readyc <- r
		}
		io.Copy(io.Discard, stdout)
	}()

	wctx, stopInstance := context.WithCancel(ctx)
	defer stopInstance()
	var death ebpf.Exit
	select {
	case r := <-readyc:
		a.mu.Lock()
		inst.addr, inst.model, inst.revision, inst.numerics, inst.kvIdentity, inst.state = r.Addr, r.Model, r.ModelRevision, r.NumericsID, r.KVIdentity, "running"
		rec := inst.recordLocked()
		a.mu.Unlock()
		if st, err := processStartTime(pid); err == nil {
			rec.StartTime = st
			a.saveWorker(rec)
		}
		go a.canaryLoop(wctx, inst, gen, cmd.Process)
		death = a.awaitDeath(ctx, detected, waited, cmd.Process)
	case d := <-detected:
		death = settle(d, detected, waited)
	case w := <-waited:
		death = settle(w, detected, waited)
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		death = settle(<-waited, detected, waited)
	case <-ctx.Done():
		a.stopWorker(cmd.Process, waited)
		return nil, ctx.Err()
	}
	if death.Detector == "" {
		return nil, ctx.Err() // agent shutting down
	}
	a.mu.Lock()
	gen = inst.gen // raised if the instance was re-registered meanwhile
	a.mu.Unlock()
	return a.onDeath(inst, gen, death), nil
}

// adopt supervises a worker a previous agent process started, at its
// generation, until it dies. It is not our child: only the detector can
// report its death, and the agent leaves it running when it stops itself,
// as it found it.
func (a *Agent) adopt(ctx context.Context, inst *instance, rec *workerRecord) {
	p, err := os.FindProcess(rec.PID)
	if err != nil {
		return
	}
	detected := make(chan ebpf.Exit, 1)
	a.mu.Lock()
	a.byPID[rec.PID] = detected
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.byPID, rec.PID)
		a.mu.Unlock()
	}()
	if err := a.detector.Watch(rec.PID); err != nil {
		a.log.Warn("cannot watch adopted worker", "instance_id", inst.id, "pid", rec.PID, "err", err)
		return
	}
	// It may have died between the check and the watch.
	if st, err := processStartTime(rec.PID); err != nil || st != rec.StartTime {
		a.detector.Unwatch(rec.PID)
		return
	}
	a.mu.Lock()
	inst.gen, inst.kvGen, inst.pid, inst.addr, inst.model, inst.revision, inst.numerics = rec.Generation, rec.KVGeneration, rec.PID, rec.Addr, rec.Model, rec.Revision, rec.Numerics
	inst.kvIdentity = rec.KVIdentity
	if inst.kvGen == 0 {
		inst.kvGen = rec.Generation
	}
	inst.state, inst.ready, inst.notReady = "running", false, "adopted; canary pending"
	a.mu.Unlock()
	// A worker the previous agent fenced (lost lease) comes back as a new
	// endpoint: a new generation, and accepting again. Otherwise it keeps
	// its generation.
	if h, err := a.health(ctx, inst); err == nil && !h.Accepting {
		a.reregisterOne(ctx, inst)
	}
	a.emit(controlapi.Event{Kind: controlapi.EventAdopted, InstanceID: inst.id, Generation: rec.Generation, PID: rec.PID})
	a.log.Info("adopted running worker", "instance_id", inst.id, "generation", rec.Generation, "pid", rec.PID)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go a.canaryLoop(wctx, inst, rec.Generation, p)
	select {
	case ex := <-detected:
		a.mu.Lock()
		gen := inst.gen
		a.mu.Unlock()
		a.onDeath(inst, gen, ex)
	case <-ctx.Done():
		// A clean stop stops adopted workers too (a SIGKILLed agent stops
		// nothing, which is what adoption is for). The dispatcher is gone
		// by now: watch the process itself.
		p.Signal(syscall.SIGTERM)
		deadline := time.Now().Add(5 * time.Second)
		for {
			if st, err := processStartTime(rec.PID); err != nil || st != rec.StartTime {
				break
			}
			if time.Now().After(deadline) {
				p.Kill()
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
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
// at once and the child is reaped in the background. A detector report
// that does not (pidfd on an already reaped child) waits for the reaper's
// status. A reaper report waits briefly for the detector, the only one that
// knows an OOM kill and whose timestamp is the earlier one.
func settle(first ebpf.Exit, detected, waited chan ebpf.Exit) ebpf.Exit {
	if first.Detector != "wait" {
		if first.Code >= 0 || first.Signal != 0 {
			go func() { <-waited }()
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
	case <-time.After(50 * time.Millisecond):
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

// onDeath acts on a worker's death at once, without waiting for any lease:
// deregister, announce, reclaim its KV blocks.
func (a *Agent) onDeath(inst *instance, gen uint64, ex ebpf.Exit) *controlapi.Event {
	reason := controlapi.ReasonExitCode
	switch {
	case ex.OOM:
		reason = controlapi.ReasonOOM
	case ex.Signal != 0:
		reason = controlapi.ReasonSignal
	}
	a.forgetWorker(inst.id)
	a.mu.Lock()
	if r := inst.notReady; inst.canaryFail >= a.opts.CanaryFailures && (r == controlapi.ReasonCanaryTimeout || r == controlapi.ReasonCanaryError) {
		reason = r // we killed it for failing canaries
	}
	delete(a.byPID, ex.PID)
	inst.ready, inst.notReady, inst.pid, inst.canaryFail = false, "exited", 0, 0
	kvGen := inst.kvGen
	a.mu.Unlock()
	a.detector.Unwatch(ex.PID)
	// The KV blocks first: that needs no network.
	reclaimed := a.kvOwner.WriterDead(kv.Writer{Instance: inst.id, Gen: kvGen})

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	a.regMu.Lock()
	a.etcd.Delete(ctx, schema.InstancesPrefix+inst.id)
	a.regMu.Unlock()
	fail, _ := json.Marshal(schema.Failure{InstanceID: inst.id, Generation: gen, Node: a.opts.NodeID, Reason: reason, Detector: ex.Detector, DetectedAt: ex.DetectedAt.UnixNano()})
	a.mu.Lock()
	lease := a.lease
	a.mu.Unlock()
	if lease != 0 {
		a.etcd.Put(ctx, schema.FailuresPrefix+inst.id, string(fail), clientv3.WithLease(lease))
	}
	e := a.emit(controlapi.Event{Kind: controlapi.EventExit, InstanceID: inst.id, Generation: gen, PID: ex.PID, Reason: reason, ExitCode: ex.Code,
		Signal: ex.Signal, Detector: ex.Detector, DetectedAt: ex.DetectedAt, Detail: fmt.Sprintf("%d KV blocks reclaimed", reclaimed)})
	a.mu.Lock()
	inst.lastExit = &e
	a.mu.Unlock()
	a.metrics.exits.WithLabelValues(reason).Inc()
	a.metrics.detection.WithLabelValues(ex.Detector).Observe(time.Since(ex.DetectedAt).Seconds())
	a.metrics.orphans.Add(float64(reclaimed))
	a.log.Warn("worker died", "instance_id", inst.id, "generation", gen, "pid", ex.PID, "failure_reason", reason,
		"detector", ex.Detector, "recovery_action", "deregistered; restart")
	return &e
}
