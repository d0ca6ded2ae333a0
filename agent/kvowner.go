package agent

import (
	"context"
	"path/filepath"
	"time"

	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/shm"
)

// openKV opens the node's KV arena and its owner.
func (a *Agent) openKV() error {
	owner, err := kv.Open(kv.Options{ArenaPath: a.opts.ArenaPath, Geometry: shm.Geometry{Slots: a.opts.ArenaSlots, PayloadSize: a.opts.ArenaSlotBytes},
		DBDir: filepath.Join(a.opts.DataDir, "kv"), LeaseTTL: time.Duration(a.opts.LeaseTTL)})
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
