package worker

import (
	"context"
	"encoding/json"
	"errors"
	"io"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
)

// errGroupAborted ends rank 0 of an aborted tensor-parallel group.
var errGroupAborted = errors.New("worker: the tensor-parallel group was aborted (a rank died or gave up)")

// runFollower is a worker of rank > 0 in a tensor-parallel group: no
// endpoint, it computes what rank 0 sends until the group ends.
func runFollower(ctx context.Context, opts Options, out io.Writer) error {
	return decode.RunFollower(ctx, opts.Engine, func() {
		json.NewEncoder(out).Encode(workerclient.RankReady{InstanceID: opts.InstanceID, Generation: opts.Generation,
			Rank: opts.Engine.Rank, TP: opts.Engine.TP, GroupGeneration: opts.Engine.GroupGeneration})
	})
}

// stopOnGroupAbort returns ctx ended, as at SIGTERM, when rank 0's group
// is aborted (a rank died: the engine can compute nothing more), the
// cause then errGroupAborted; either way the listener closes and the
// detached requests stop.
func (s *server) stopOnGroupAbort(ctx context.Context, ln *quic.Listener) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-ctx.Done():
		case <-s.engine.GroupAborted: // nil unless rank 0 of a group
			cancel(errGroupAborted)
		}
		ln.Close()
		s.stopDetached()
	}()
	return ctx, cancel
}

// groupAborted says whether ctx ended because the group was aborted.
func groupAborted(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errGroupAborted) }
