package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
	"github.com/lifeline-llm/lifeline/ebpf"
	"github.com/lifeline-llm/lifeline/internal/failpoint"
	"github.com/lifeline-llm/lifeline/kv"
)

// FailAdoptWatch, armed with "error", makes the exit detector's watch of a
// worker the agent is adopting fail, as a full eBPF map would: the
// adoption fails, and the worker must not run on beside its successor.
const FailAdoptWatch = "agent.adopt-watch"

// recordLocked is what to remember of inst's running worker (StartTime is
// the caller's to fill). Agent.mu must be held.
func (inst *instance) recordLocked() workerRecord {
	return workerRecord{InstanceID: inst.id, Generation: inst.gen, KVGeneration: inst.kvGen, PID: inst.pid, Addr: inst.addr,
		Model: inst.model, Revision: inst.revision, Numerics: inst.numerics, KVIdentity: inst.kvIdentity,
		ContextLen: inst.contextLen, TokenizerHash: inst.tokenizerHash, Capacity: inst.capacity, BatchCapacity: inst.batchCapacity,
		Continuation: inst.continuation}
}

// workerRecord is what the agent remembers of a running worker, so that a
// restarted agent can adopt it instead of killing it: an agent restart must
// not cut in-flight streams.
type workerRecord struct {
	InstanceID string `json:"instance_id"`
	Generation uint64 `json:"generation"`
	// KVGeneration is the generation the worker started with, under which
	// it writes the KV arena; Generation may have been raised since.
	KVGeneration uint64 `json:"kv_generation"`
	PID          int    `json:"pid"`
	// StartTime is field 22 of /proc/<pid>/stat: with the pid it names one
	// process, never a later one that reused the pid.
	StartTime string `json:"start_time"`
	Addr      string `json:"addr"`
	Model     string `json:"model"`
	Revision  string `json:"model_revision"`
	Numerics  string `json:"numerics_id"`
	// KVIdentity is the worker's block identity (from its Ready line).
	KVIdentity *kv.Identity `json:"kv_identity,omitempty"`
	// ContextLen and TokenizerHash are the worker's (its Ready line).
	ContextLen    int    `json:"context_len,omitempty"`
	Continuation  string `json:"continuation,omitempty"`
	TokenizerHash string `json:"tokenizer_hash,omitempty"`
	// Capacity and BatchCapacity are the worker's (its Ready line).
	Capacity      int `json:"capacity,omitempty"`
	BatchCapacity int `json:"batch_capacity,omitempty"`
}

func workerKey(instance string) []byte { return []byte("worker/" + instance) }

// processStartTime reads a process's start time in clock ticks since boot.
func processStartTime(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name (field 2) may contain spaces; it ends at the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("agent: malformed /proc/%d/stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is field 3 (state); field 22 is fields[19].
	if len(fields) < 20 {
		return "", fmt.Errorf("agent: short /proc/%d/stat", pid)
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return "", fmt.Errorf("agent: process %d is dead", pid)
	}
	return fields[19], nil
}

func (a *Agent) saveWorker(r workerRecord) error {
	b, _ := json.Marshal(r)
	return a.db.Update(func(txn *badger.Txn) error { return txn.Set(workerKey(r.InstanceID), b) })
}

func (a *Agent) forgetWorker(instance string) {
	a.db.Update(func(txn *badger.Txn) error { return txn.Delete(workerKey(instance)) })
}

// adoptable returns the record of a worker of this instance that still
// runs, the very process the agent started (same pid and start time).
func (a *Agent) adoptable(instance string) (*workerRecord, bool) {
	var r workerRecord
	err := a.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(workerKey(instance))
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error { return json.Unmarshal(v, &r) })
	})
	if err != nil || r.PID <= 0 {
		return nil, false
	}
	st, err := processStartTime(r.PID)
	if err != nil || st != r.StartTime {
		return nil, false
	}
	return &r, true
}

// adopt supervises a worker a previous agent process started, at its
// generation, until it dies. It is not our child: only the detector can
// report its death, and the agent leaves it running when it stops itself,
// as it found it. False when it could not adopt the worker (it could not
// watch it, or it died first).
func (a *Agent) adopt(ctx context.Context, inst *instance, rec *workerRecord) bool {
	p, err := os.FindProcess(rec.PID)
	if err != nil {
		return false
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
	err = failpoint.Hit(FailAdoptWatch)
	if err == nil {
		err = a.detector.Watch(rec.PID)
	}
	if err != nil {
		a.log.Warn("cannot watch adopted worker", "instance_id", inst.id, "pid", rec.PID, "err", err)
		return false
	}
	// It may have died between the check and the watch.
	if st, err := processStartTime(rec.PID); err != nil || st != rec.StartTime {
		a.detector.Unwatch(rec.PID)
		return false
	}
	a.adopted(ctx, inst, rec)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	a.track(func() { a.canaryLoop(wctx, inst, rec.Generation, p) })
	select {
	case ex := <-detected:
		a.mu.Lock()
		gen := inst.gen
		a.mu.Unlock()
		a.onDeath(inst, gen, ex)
	case <-ctx.Done():
		stopAdopted(p, rec)
	}
	return true
}

// adopted takes over rec's worker as inst's. A worker the previous agent
// fenced (lost lease) comes back as a new endpoint: a new generation, and
// accepting again. Otherwise it keeps its generation.
func (a *Agent) adopted(ctx context.Context, inst *instance, rec *workerRecord) {
	a.mu.Lock()
	inst.gen, inst.kvGen, inst.pid, inst.addr, inst.model, inst.revision, inst.numerics = rec.Generation, rec.KVGeneration, rec.PID, rec.Addr, rec.Model, rec.Revision, rec.Numerics
	inst.kvIdentity = rec.KVIdentity
	inst.contextLen, inst.tokenizerHash, inst.continuation = rec.ContextLen, rec.TokenizerHash, rec.Continuation
	inst.capacity, inst.batchCapacity = rec.Capacity, rec.BatchCapacity
	if inst.kvGen == 0 {
		inst.kvGen = rec.Generation
	}
	inst.state, inst.ready, inst.notReady = "running", false, "adopted; canary pending"
	a.mu.Unlock()
	if h, err := a.health(ctx, inst); err == nil && !h.Accepting {
		a.reregisterOne(ctx, inst)
	}
	a.emit(controlapi.Event{Kind: controlapi.EventAdopted, InstanceID: inst.id, Generation: rec.Generation, PID: rec.PID})
	a.log.Info("adopted running worker", "instance_id", inst.id, "generation", rec.Generation, "pid", rec.PID)
}

// stopAdopted stops an adopted worker on a clean agent stop (a SIGKILLed
// agent stops nothing, which is what adoption is for). The dispatcher is
// gone by now: it watches the process itself.
func stopAdopted(p *os.Process, rec *workerRecord) {
	p.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if st, err := processStartTime(rec.PID); err != nil || st != rec.StartTime {
			return
		}
		if time.Now().After(deadline) {
			p.Kill()
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
