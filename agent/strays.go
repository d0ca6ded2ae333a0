package agent

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/internal/procfs"
	"github.com/lifeline-llm/lifeline/kv"
)

// endStrays SIGKILLs every worker process of inst that an agent on this
// socket started and nobody can adopt (every one but keep, the adopted
// worker's pid, or 0), waits (bounded) until they are gone and reclaims
// the KV blocks they were writing. A supervisor calls it before it starts
// a worker: a process of the instance alive then is one a previous agent
// process started and was SIGKILLed before it recorded it (between the
// start and the Ready line). Left alone, such a worker would hold its
// memory — a GPU's, on a real engine — beside its successor forever: the
// restarted agent's socket answers, so it never counts as an orphan.
func (a *Agent) endStrays(inst *instance, keep int) {
	var pids []int
	var gens []uint64
	for _, p := range procfs.List() {
		args := p.Args()
		if p.PID == keep || !slices.Contains(args, "--agent-socket="+a.opts.Socket) || !slices.Contains(args, "--instance-id="+inst.id) {
			continue
		}
		if syscall.Kill(p.PID, syscall.SIGKILL) != nil {
			continue // gone meanwhile
		}
		pids = append(pids, p.PID)
		if g, ok := argGeneration(args); ok {
			gens = append(gens, g)
		}
	}
	if len(pids) == 0 {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil && !zombie(pid) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	reclaimed := 0
	for _, g := range gens {
		reclaimed += a.kvOwner.WriterDead(kv.Writer{Instance: inst.id, Gen: g})
	}
	a.log.Warn("workers nobody can adopt ended", "instance_id", inst.id, "pids", pids, "generations", gens, "kv_blocks_reclaimed", reclaimed,
		"recovery_action", "a worker a previous agent process started but never recorded is ended before its successor starts")
	a.emit(controlapi.Event{Kind: controlapi.EventStrayEnded, InstanceID: inst.id, PID: pids[0],
		Detail: fmt.Sprintf("%d processes a previous agent started and never recorded (pids %v, generations %v) ended; %d KV blocks reclaimed", len(pids), pids, gens, reclaimed)})
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
