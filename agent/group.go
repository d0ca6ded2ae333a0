package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/decode/collective"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
	"github.com/lifeline-llm/lifeline/ebpf"
	"github.com/lifeline-llm/lifeline/internal/procfs"
	"github.com/lifeline-llm/lifeline/kv"
)

// A tensor-parallel instance (InstanceSpec.TP > 1) is a group of worker
// processes: rank 0 serves the endpoint and leads, ranks 1..n-1 follow
// it through a collective segment the agent creates for each group
// generation (the instance's generation). The group is the unit of
// health, failure and restart: one registration, one canary (through
// rank 0), and any rank's death is the instance's death — the segment is
// aborted (every surviving rank's collective returns at once and the rank
// exits), the instance deregistered and its failure announced as for any
// worker, every rank still running SIGKILLed and reaped, and all of them
// started again together at a new generation, with a new segment: a rank
// that presents the old generation is refused at the rendezvous.

// segmentPath is the collective segment of inst's group at generation gen,
// next to the arena (shared memory).
func (a *Agent) segmentPath(inst *instance, gen uint64) string {
	return a.segmentPrefix(inst) + strconv.FormatUint(gen, 10)
}

// segmentPrefix is the path of inst's segments without the generation:
// named after the arena, which is this agent's alone, so that two agents
// on one host with the same node id (test clusters side by side) never
// open, or sweep away, each other's segments.
func (a *Agent) segmentPrefix(inst *instance) string {
	return a.opts.ArenaPath + ".group-" + inst.id + "-"
}

// createSegment makes inst's segment for generation gen, sized for a
// step of the scheduler's most positions.
func (a *Agent) createSegment(inst *instance, gen uint64) (string, error) {
	cfg, err := model.PresetConfig(inst.spec.Preset)
	if err != nil {
		return "", err
	}
	path := a.segmentPath(inst, gen)
	return path, collective.Create(path, inst.spec.ranks(), gen, sched.DefaultLimits.MaxStepTokens*cfg.Dim)
}

// startFollowers starts ranks 1..n-1 of inst's group at generation gen,
// each reporting its death on w.detected, rank 0's channel: any rank's
// death is the instance's.
func (a *Agent) startFollowers(inst *instance, gen uint64, w *workerProc) error {
	for r := 1; r < inst.spec.ranks(); r++ {
		args := a.workerArgs(inst, gen)
		// Rank 0 allocates the group's blocks (the owner's socket) and
		// pulls; the others write their heads' part in the arena.
		args.Rank, args.KVSocket, args.KVTransfer, args.KVArena = r, "", "", a.opts.ArenaPath
		cmd := exec.Command(a.opts.WorkerBinary, append([]string{workerclient.Command}, args.Argv()...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Env = inst.spec.workerEnv()
		cmd.Stdout, cmd.Stderr = nil, os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("agent: start rank %d of %s: %w", r, inst.id, err)
		}
		if err := a.placeWorker(inst, cmd); err != nil {
			return err
		}
		f := &workerProc{cmd: cmd, pid: cmd.Process.Pid, detected: w.detected, waited: make(chan ebpf.Exit, 1), exited: make(chan struct{})}
		w.followers = append(w.followers, f)
		a.mu.Lock()
		a.byPID[f.pid] = w.detected
		inst.rankPIDs = append(inst.rankPIDs, f.pid)
		a.mu.Unlock()
		if err := a.detector.Watch(f.pid); err != nil {
			a.log.Warn("cannot watch rank", "instance_id", inst.id, "rank", r, "pid", f.pid, "err", err)
		}
		a.track(func() {
			f.reap()
			// The reaper's report reaches the instance too, when the
			// detector's did not: as a detector's with its exit status
			// (acted on at once; rank 0's reaper channel is its own).
			ex := <-f.waited
			ex.Detector = "reaper"
			select {
			case w.detected <- ex:
			default:
			}
		})
		a.log.Info("rank started", "instance_id", inst.id, "generation", gen, "rank", r, "pid", f.pid)
	}
	return nil
}

// abortGroup aborts w's group after its death (or the agent's stop):
// the survivors' collectives return at once and they exit.
func (a *Agent) abortGroup(inst *instance, gen uint64, w *workerProc) {
	if w.segment == "" {
		return
	}
	w.abortedAt = time.Now()
	if err := collective.AbortSegment(w.segment); err != nil {
		a.log.Warn("cannot abort group", "instance_id", inst.id, "generation", gen, "err", err)
	}
	a.metrics.groupAborts.Inc()
}

// endGroup ends an aborted group: every rank still running SIGKILLed (it
// can compute nothing more, and must not write a block once the group's
// are reclaimed) and reaped, the segment removed. No rank of this
// generation is left.
func (a *Agent) endGroup(inst *instance, gen uint64, w *workerProc) {
	if w.segment == "" {
		return
	}
	at := w.abortedAt
	for _, f := range append([]*workerProc{w}, w.followers...) {
		select {
		case <-f.exited:
		default:
			f.cmd.Process.Kill()
			<-f.exited
		}
	}
	a.metrics.groupEnd.Observe(time.Since(at).Seconds())
	a.mu.Lock()
	for _, f := range append([]*workerProc{w}, w.followers...) {
		delete(a.byPID, f.pid)
	}
	inst.rankPIDs = nil
	a.mu.Unlock()
	for _, f := range append([]*workerProc{w}, w.followers...) {
		a.detector.Unwatch(f.pid)
	}
	os.Remove(w.segment)
	a.mu.Lock()
	inst.groupEndedAt = at
	a.mu.Unlock()
	a.emit(controlapi.Event{Kind: controlapi.EventGroupEnded, InstanceID: inst.id, Generation: gen,
		Detail: fmt.Sprintf("group of %d ranks ended in %v", len(w.followers)+1, time.Since(at).Round(time.Millisecond))})
}

// endOrphanGroup ends the group a previous agent process left running (a
// group is not adopted: its followers are not this process's to watch).
// Its segment is aborted (every rank returns from its collective or its
// wait for the next step), every process of it — found by the segment on
// its command line — SIGKILLed and gone, rank 0's KV writer reported dead
// and the segment removed; the supervisor then starts a fresh group at a
// new generation.
func (a *Agent) endOrphanGroup(inst *instance, rec *workerRecord) {
	seg := a.segmentPath(inst, rec.KVGeneration)
	collective.AbortSegment(seg)
	var pids []int
	for _, p := range procfs.Mentioning("--group-segment=" + seg) {
		pids = append(pids, p.PID)
	}
	killAll(pids)
	a.kvOwner.WriterDead(kv.Writer{Instance: inst.id, Gen: rec.KVGeneration})
	a.forgetWorker(inst.id)
	os.Remove(seg)
	a.metrics.groupAborts.Inc()
	a.log.Warn("group not adopted", "instance_id", inst.id, "generation", rec.Generation, "pids", pids,
		"recovery_action", "a tensor-parallel group left by a previous agent process is ended and started again")
	a.emit(controlapi.Event{Kind: controlapi.EventGroupEnded, InstanceID: inst.id, Generation: rec.Generation,
		Detail: fmt.Sprintf("left by a previous agent: %d processes ended", len(pids))})
}

// sweepSegments removes every collective segment of inst's groups a
// previous agent process left behind (a group is never adopted, so none
// is in use when its supervisor starts): one left by an agent SIGKILLed
// before it could end its group, or whose worker record was lost, stays
// in /dev/shm otherwise.
func (a *Agent) sweepSegments(inst *instance) {
	prefix := a.segmentPrefix(inst)
	matches, _ := filepath.Glob(prefix + "*")
	for _, seg := range matches {
		gen := strings.TrimPrefix(seg, prefix)
		if _, err := strconv.ParseUint(gen, 10, 64); err != nil {
			continue // another instance's, whose id starts with this one's
		}
		collective.AbortSegment(seg)
		for _, p := range procfs.Mentioning("--group-segment=" + seg) {
			syscall.Kill(p.PID, syscall.SIGKILL)
		}
		if os.Remove(seg) == nil {
			a.log.Warn("collective segment removed", "instance_id", inst.id, "segment", seg,
				"recovery_action", "a segment a previous agent process left behind")
		}
	}
}

// killAll SIGKILLs pids and waits, 5 s at most in all, until they are
// gone (exited: reaped or a zombie); it returns those that are not.
func killAll(pids []int) (alive []int) {
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	gone := func(pid int) bool { return syscall.Kill(pid, 0) != nil || zombie(pid) }
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for !gone(pid) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if !gone(pid) {
			alive = append(alive, pid)
		}
	}
	return alive
}

// zombie says whether pid has exited and waits to be reaped.
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := strings.LastIndexByte(string(b), ')')
	return err != nil || i < 0 || len(b) < i+3 || b[i+2] == 'Z'
}
