package decode

import (
	"cmp"
	"context"
	"fmt"

	"github.com/lifeline-llm/lifeline/decode/collective"
	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
)

// A tensor-parallel group is TP processes of one instance: rank 0 is the
// engine (scheduler, sampling, the worker's endpoint) over its part of
// the model, and hands every forward pass's inputs to the other ranks
// before computing it; they compute the same inputs on their parts, and
// the two all-reduces of every layer give every rank the same residual
// stream. A group's KV blocks hold every head: rank 0 allocates them —
// in the node's arena when it has the owner's socket, publishing and
// reusing them like any worker (the identity's numerics id carries tp, so
// only a group of the same tp hits them) — and each rank writes and reads
// its own heads' part (the others map the arena: Options.KVArena).
// When a rank dies the group is aborted (collective.AbortSegment): every
// other rank's collective returns at once and the rank exits; the engine
// of rank 0 fails its step.

// joinGroup opens opts' collective segment as opts.Rank and waits until
// every rank has joined; it returns the rank's part of m and the group.
func joinGroup(opts Options, m *model.Model) (*model.Model, *collective.Group, error) {
	g, err := collective.Open(opts.GroupSegment, opts.Rank, opts.TP, opts.GroupGeneration)
	if err != nil {
		return nil, nil, err
	}
	if err := g.Rendezvous(); err != nil {
		g.Close()
		return nil, nil, fmt.Errorf("decode: rank %d of %d: %w", opts.Rank, opts.TP, err)
	}
	shard, err := m.Shard(opts.Rank, opts.TP, g.AllReduce)
	if err != nil {
		g.Close()
		return nil, nil, err
	}
	return shard, g, nil
}

// leadGroup joins rank 0 to its group and returns the model it runs: its
// part, handing every forward pass's inputs to the other ranks first.
func leadGroup(opts Options, m *model.Model) (*model.Model, *collective.Group, error) {
	if opts.Rank != 0 {
		return nil, nil, badField("rank", "rank %d is a follower: RunFollower, not an engine", opts.Rank)
	}
	shard, g, err := joinGroup(opts, m)
	if err != nil {
		return nil, nil, err
	}
	return shard.Lead(func(in []model.Input) error {
		_, err := g.Broadcast(model.EncodeInputs(in), false)
		return err
	}), g, nil
}

// RunFollower runs rank opts.Rank > 0 of a group until the group is
// aborted (a rank died, or rank 0's engine closed), a collective times
// out, or ctx ends (which aborts the group: a rank leaving ends it). It
// calls ready once it joined the group.
func RunFollower(ctx context.Context, opts Options, ready func()) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	if opts.TP < 2 || opts.Rank < 1 {
		return badField("rank", "rank %d of tp %d follows no one", opts.Rank, opts.TP)
	}
	m, _, err := loadModel(opts)
	if err != nil {
		return err
	}
	limits := opts.Limits
	if limits == (sched.Limits{}) {
		limits = sched.DefaultLimits
	}
	shard, g, err := joinGroup(opts, m)
	if err != nil {
		return err
	}
	defer g.Close()
	stop := context.AfterFunc(ctx, g.Abort)
	defer stop()
	layout := shard.KVLayout(cmp.Or(opts.BlockSize, kvcache.DefaultBlockSize))
	var store kvcache.Store
	if opts.KVArena != "" {
		v, verr := kvclient.NewView(opts.KVArena, layout, kvBlocks(opts, m, limits))
		if verr == nil {
			defer v.Close()
		}
		store, err = v, verr
	} else {
		store, err = kvcache.NewMemStore(layout, kvBlocks(opts, m, limits))
	}
	if err != nil {
		g.Abort()
		return err
	}
	ready()
	var ws model.Workspace
	err = shard.Follow(&ws, store, func() ([]byte, error) { return g.Broadcast(nil, true) })
	g.Abort()
	return fmt.Errorf("decode: rank %d of %d: %w", opts.Rank, opts.TP, err)
}
