package agent

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/internal/procfs"
	"github.com/lifeline-llm/lifeline/kv"
)

// endStrays SIGKILLs every worker process of inst that an agent on this
// socket started and nobody adopts (every one but keep, the adopted
// worker's pid or 0, and its descendants: a worker_binary wrapper that
// forks leaves the worker under it), waits (bounded) until they are gone
// and reclaims the KV blocks of those that are. A supervisor calls it
// before it starts a worker: a process of the instance alive then is one a
// previous agent process started and was SIGKILLed before it recorded it
// (between the start and the Ready line), or one it failed to adopt. Left
// alone, such a worker would hold its memory — a GPU's, on a real engine —
// beside its successor forever: the restarted agent's socket answers, so
// it never counts as an orphan.
func (a *Agent) endStrays(inst *instance, keep int) {
	gens := map[int]uint64{} // pid → its generation (0: none on its command line)
	var pids []int
	for _, p := range procfs.List() {
		args := p.Args()
		if slices.Contains(args, "--agent-socket="+a.opts.Socket) && slices.Contains(args, "--instance-id="+inst.id) && !descends(p.PID, keep) {
			pids = append(pids, p.PID)
			gens[p.PID], _ = argGeneration(args)
		}
	}
	if len(pids) == 0 {
		return
	}
	alive := killAll(pids)
	// The blocks of a process not gone yet (an exit stuck in the kernel, a
	// device's DMA still landing) are left to its writer's session expiry.
	reclaimed, reclaim := 0, map[uint64]bool{}
	for _, pid := range pids {
		if g := gens[pid]; g > 0 && !slices.Contains(alive, pid) && !reclaim[g] {
			reclaim[g] = true
			reclaimed += a.kvOwner.WriterDead(kv.Writer{Instance: inst.id, Gen: g})
		}
	}
	a.log.Warn("workers nobody adopts ended", "instance_id", inst.id, "pids", pids, "not_gone_yet", alive, "kv_blocks_reclaimed", reclaimed,
		"recovery_action", "a worker a previous agent process started, never recorded or not adopted, is ended before its successor starts")
	a.emit(controlapi.Event{Kind: controlapi.EventStrayEnded, InstanceID: inst.id, PID: pids[0],
		Detail: fmt.Sprintf("%d processes a previous agent started, never recorded or not adopted (pids %v), SIGKILLed, %d not gone within 5 s; %d KV blocks reclaimed", len(pids), pids, len(alive), reclaimed)})
}

// descends says whether pid is keep or runs under it (keep 0: never).
func descends(pid, keep int) bool {
	for i := 0; keep > 0 && pid > 1 && i < 32; i++ {
		if pid == keep {
			return true
		}
		var err error
		if pid, err = procfs.Parent(pid); err != nil {
			return false
		}
	}
	return false
}

// argGeneration is the --generation of a worker's command line.
func argGeneration(args []string) (uint64, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--generation="); ok {
			g, err := strconv.ParseUint(v, 10, 64)
			return g, err == nil
		}
	}
	return 0, false
}
