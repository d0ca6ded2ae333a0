package kvclient

import (
	"fmt"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/shm"
)

// View is a follower rank's window on the blocks its group's rank 0
// allocates (a Cache): the same block ids name the same arena slots (or,
// for rank 0's private fallback blocks, a private mirror of its own).
// It allocates nothing: rank 0 decides every block; the ranks write and
// read their own heads' part of each (tensor parallelism).
type View struct {
	arena   *shm.Arena
	layout  kvcache.Layout
	private *kvcache.MemStore
}

// NewView maps the arena at path for blocks of layout; capacity is rank
// 0's cache capacity (the size of its private fallback).
func NewView(path string, layout kvcache.Layout, capacity int) (*View, error) {
	arena, err := shm.OpenWorker(path)
	if err != nil {
		return nil, err
	}
	if layout.BlockBytes() > arena.Geometry().PayloadSize {
		arena.Close()
		return nil, fmt.Errorf("kv: a block of %d bytes does not fit the arena's %d-byte slots", layout.BlockBytes(), arena.Geometry().PayloadSize)
	}
	private, err := kvcache.NewMemStore(layout, capacity)
	if err != nil {
		arena.Close()
		return nil, err
	}
	return &View{arena: arena, layout: layout, private: private}, nil
}

// Layout, Capacity and NumFree describe the view; Alloc and Free are rank
// 0's (they fail here).
func (v *View) Layout() kvcache.Layout { return v.layout }
func (v *View) Capacity() int          { return v.arena.Geometry().Slots }
func (v *View) NumFree() int           { return 0 }
func (v *View) Alloc() (kvcache.BlockID, error) {
	return 0, fmt.Errorf("kv: a follower's view allocates no block")
}
func (v *View) Free(kvcache.BlockID) error { return fmt.Errorf("kv: a follower's view frees no block") }

// Block is block id's floats: its arena slot, or rank 0's private block's
// mirror.
func (v *View) Block(id kvcache.BlockID) []float32 {
	if id >= PrivateBase {
		return v.private.Block(id - PrivateBase)
	}
	return v.arena.Float32s(int(id), v.layout.BlockFloats())
}

// Close unmaps the arena.
func (v *View) Close() error { return v.arena.Close() }
