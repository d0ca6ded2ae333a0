package agent

import (
	"context"
	"path/filepath"
	"syscall"
	"time"

	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/shm"
)

// openKV opens the node's KV arena and its owner.
func (a *Agent) openKV() error {
	owner, err := kv.Open(kv.Options{ArenaPath: a.opts.ArenaPath, Geometry: shm.Geometry{Slots: a.opts.ArenaSlots, PayloadSize: a.opts.ArenaSlotBytes},
		DBDir: filepath.Join(a.opts.DataDir, "kv"), LeaseTTL: time.Duration(a.opts.LeaseTTL), Fence: a.fenceWriter})
	if err != nil {
		return err
	}
	a.kvOwner = owner
	a.kvSocket = filepath.Join(a.opts.DataDir, "kv.sock")
	return nil
}

// serveKV answers the workers on the arena owner's socket until ctx is
// done.
func (a *Agent) serveKV(ctx context.Context) {
	a.track(func() {
		if err := kv.Serve(ctx, a.kvOwner, a.kvSocket); err != nil {
			a.log.Error("kv service stopped", "err", err)
		}
	})
}

// fenceWriter makes sure the KV writer w, whose session expired, writes
// no more before its slots go to another writer: if w is a worker of this
// node still running at that KV generation, it is SIGKILLed (a stopped or
// hung process cannot renew its session; its streams have moved or will,
// and the instance restarts at a new generation). A SIGKILLed process
// runs no more of its own instructions, stopped or not.
//
// It runs under the owner's lock and takes a.mu: nothing holds a.mu
// while it calls the owner.
func (a *Agent) fenceWriter(w kv.Writer) bool {
	a.mu.Lock()
	pid := 0
	if inst, ok := a.instances[w.Instance]; ok && inst.kvGen == w.Gen {
		pid = inst.pid // 0 once its worker is gone
	}
	a.mu.Unlock()
	if pid == 0 {
		return true // no running worker of ours writes as w
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		a.log.Error("cannot fence a KV writer whose session expired; its slots stay held", "instance_id", w.Instance, "generation", w.Gen, "pid", pid, "err", err)
		return false
	}
	a.log.Warn("KV session expired: writer killed before its slots are reclaimed", "instance_id", w.Instance, "generation", w.Gen,
		"pid", pid, "failure_reason", "kv_session_expired", "recovery_action", "SIGKILL; restart")
	return true
}
