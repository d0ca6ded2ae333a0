package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/quic-go/quic-go"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
)

// errGroupAborted ends rank 0 of an aborted tensor-parallel group.
var errGroupAborted = errors.New("worker: the tensor-parallel group was aborted (a rank died or gave up)")

// errWeightsChanged ends a worker whose background hash pass failed.
var errWeightsChanged = errors.New("worker: the model's weights are not its cached revision's")

// runFollower is a worker of rank > 0 in a tensor-parallel group: no
// endpoint, it computes what rank 0 sends until the group ends.
func runFollower(ctx context.Context, opts Options, out io.Writer) error {
	return decode.RunFollower(ctx, opts.Engine, func() {
		boundHeap(headroom(opts.MemoryHeadroom))
		json.NewEncoder(out).Encode(workerclient.RankReady{InstanceID: opts.InstanceID, Generation: opts.Generation,
			Rank: opts.Engine.Rank, TP: opts.Engine.TP, GroupGeneration: opts.Engine.GroupGeneration})
	})
}

// stopOnEngineFailure returns ctx ended, as at SIGTERM, when rank 0's group
// is aborted (a rank died: the engine can compute nothing more), the
// cause then errGroupAborted, or when the background hash pass found the
// weights are not the cached revision's (the cause wraps
// model.ErrRevisionChanged); either way the listener closes and the
// detached requests stop.
func (s *server) stopOnEngineFailure(ctx context.Context, ln *quic.Listener) (context.Context, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-ctx.Done():
		case <-s.engine.GroupAborted: // nil unless rank 0 of a group
			cancel(errGroupAborted)
		case err := <-s.engine.WeightsChanged: // nil unless the revision was cached
			cancel(fmt.Errorf("%w: %w", errWeightsChanged, err))
		}
		ln.Close()
		s.stopDetached()
	}()
	return ctx, cancel
}

// groupAborted says whether ctx ended because the group was aborted.
func groupAborted(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errGroupAborted) }

// engineFailed is the cause of ctx's end when the engine can serve no
// more (its group aborted, its weights changed), else nil.
func engineFailed(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, errGroupAborted) || errors.Is(cause, errWeightsChanged) {
		return cause
	}
	return nil
}
