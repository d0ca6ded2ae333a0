package worker

import (
	"context"
	"time"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/kv/blockid"
	"github.com/lifeline-llm/lifeline/rdma/transferpb"
)

// PullTimeout bounds how long a migrated request waits for its blocks to
// be pulled from a peer before it computes them instead.
const PullTimeout = 3 * time.Second

// pullPrefix asks the node's agent to make the blocks of prompt ‖ prefix
// published here, from the sources the frontend named: the reference
// engine's blocks, or a llama.cpp engine's snapshots (the longest saved
// prefix first, the one before if none of it could be had). Whatever it
// cannot get is computed: a failure here only costs time.
func (s *server) pullPrefix(ctx context.Context, g *wire.Generate, req decode.Request) {
	chains, err := s.engine.PullChains(req)
	if err != nil || len(chains) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, PullTimeout)
	defer cancel()
	for i, keys := range chains {
		if len(keys) == 0 {
			continue
		}
		b := &transferpb.Binding{RequestId: g.RequestId, ModelRevision: s.engine.ModelRevision(), DestinationInstance: s.opts.InstanceID,
			DestinationGeneration: s.generation.Load(), BlockCount: uint32(len(keys)), RequestEpoch: g.RequestEpoch, TransferEpoch: uint64(i + 1)}
		reply, err := s.kv.Pull(ctx, s.opts.KVTransfer, &transferpb.Pull{Binding: b, Keys: blockid.KeyBytes(keys), Sources: g.KvSources})
		switch {
		case err != nil:
			s.opts.Log.Warn("pull failed", "blocks", len(keys), "request_id", g.RequestId, "err", err)
		case reply.Error != "":
			s.opts.Log.Warn("pull refused", "blocks", len(keys), "request_id", g.RequestId, "reason", reply.Error, "local", reply.Local)
		case reply.Local+reply.Pulled > 0:
			return
		}
	}
}
