// Package kvcache defines how the reference engine stores attention keys and
// values: fixed-size blocks of token positions, addressed through a
// per-sequence block table, behind a small Store interface so that a
// shared-memory arena can back the cache without touching model code.
package kvcache

import (
	"errors"
	"fmt"
)

// LayoutName names the arrangement of floats inside a block. It is part of
// a KV block's identity: a block written under one layout must never be read
// under another.
const LayoutName = "layer-kv-token-dim/v1"

// DTypeFloat32 is the only element type the reference engine writes.
const DTypeFloat32 = "float32"

// DefaultBlockSize is the number of token positions per block.
const DefaultBlockSize = 16

var (
	// ErrNoFreeBlocks is returned by Alloc when every block is in use.
	ErrNoFreeBlocks = errors.New("kvcache: no free blocks")
	// ErrBadBlock is returned for a block id that is out of range or not
	// allocated.
	ErrBadBlock = errors.New("kvcache: bad block id")
)

// Layout describes one block. Within a block, for layer l, the keys of the
// block's i-th position start at float ((2*l)*BlockSize+i)*KVDim and the
// values at ((2*l+1)*BlockSize+i)*KVDim.
type Layout struct {
	Name      string
	DType     string
	Layers    int
	KVDim     int
	BlockSize int
}

// NewLayout returns the engine's layout for the given shape.
func NewLayout(layers, kvDim, blockSize int) Layout {
	return Layout{Name: LayoutName, DType: DTypeFloat32, Layers: layers, KVDim: kvDim, BlockSize: blockSize}
}

// BlockFloats is the number of float32 values in one block.
func (l Layout) BlockFloats() int { return l.Layers * 2 * l.BlockSize * l.KVDim }

// BlockBytes is the size of one block's payload in bytes.
func (l Layout) BlockBytes() int { return l.BlockFloats() * 4 }

// KeyOffset is the float offset of the keys of position i (within the block)
// of layer layer.
func (l Layout) KeyOffset(layer, i int) int { return ((2*layer)*l.BlockSize + i) * l.KVDim }

// ValueOffset is the float offset of the values of position i of layer.
func (l Layout) ValueOffset(layer, i int) int { return ((2*layer+1)*l.BlockSize + i) * l.KVDim }

// String renders the layout as it enters a block identity.
func (l Layout) String() string {
	return fmt.Sprintf("%s;dtype=%s;layers=%d;kv_dim=%d;block=%d", l.Name, l.DType, l.Layers, l.KVDim, l.BlockSize)
}

// BlockID names a block within one Store.
type BlockID int32

// Store holds KV blocks. Alloc and Free are called by one goroutine at a
// time (the scheduler serialises them); Block is called concurrently by the
// attention workers of one forward pass and must not mutate the store.
type Store interface {
	Layout() Layout
	// Alloc reserves a free block. Its contents are unspecified.
	Alloc() (BlockID, error)
	// Free returns a block to the free pool.
	Free(BlockID) error
	// Block returns the block's floats, Layout().BlockFloats() long. The
	// slice aliases the store: writes go straight into the block.
	Block(BlockID) []float32
	// Capacity is the total number of blocks; NumFree those not allocated.
	Capacity() int
	NumFree() int
}

// MemStore is a Store in private process memory.
type MemStore struct {
	layout Layout
	data   []float32
	free   []BlockID
	inUse  []bool
}

// NewMemStore returns a store of n blocks of the given layout.
func NewMemStore(layout Layout, n int) (*MemStore, error) {
	if n <= 0 || layout.BlockFloats() <= 0 {
		return nil, fmt.Errorf("kvcache: store of %d blocks of layout %s: need positive sizes", n, layout)
	}
	s := &MemStore{
		layout: layout,
		data:   make([]float32, n*layout.BlockFloats()),
		free:   make([]BlockID, n),
		inUse:  make([]bool, n),
	}
	// Hand out low ids first so allocation order is deterministic.
	for i := range s.free {
		s.free[i] = BlockID(n - 1 - i)
	}
	return s, nil
}

func (s *MemStore) Layout() Layout { return s.layout }
func (s *MemStore) Capacity() int  { return len(s.inUse) }
func (s *MemStore) NumFree() int   { return len(s.free) }

func (s *MemStore) Alloc() (BlockID, error) {
	if len(s.free) == 0 {
		return 0, ErrNoFreeBlocks
	}
	id := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.inUse[id] = true
	return id, nil
}

func (s *MemStore) Free(id BlockID) error {
	if id < 0 || int(id) >= len(s.inUse) || !s.inUse[id] {
		return fmt.Errorf("kvcache: free block %d: %w", id, ErrBadBlock)
	}
	s.inUse[id] = false
	s.free = append(s.free, id)
	return nil
}

func (s *MemStore) Block(id BlockID) []float32 {
	n := s.layout.BlockFloats()
	return s.data[int(id)*n : (int(id)+1)*n : (int(id)+1)*n]
}

// Sharing is implemented by stores whose full blocks can outlive the
// sequence that computed them and be reused by later sequences (and other
// processes) with the same prefix. Failures inside degrade to recompute:
// a block that cannot be published stays private, a prefix that cannot be
// found or verified is computed again.
type Sharing interface {
	// AcquirePrefix returns read-only blocks holding the K/V of the longest
	// published prefix of tokens, in whole blocks, at most maxBlocks. The
	// caller frees them with Free like any other block.
	AcquirePrefix(tokens []int, maxBlocks int) []BlockID
	// Publish offers a fully computed block for reuse. tokens is the whole
	// prefix up to and including the block; parent is the block before it
	// in the same sequence (NoBlock for the first), which lets the store
	// chain identities without rehashing the prefix. The block must not be
	// written afterwards.
	Publish(id BlockID, parent BlockID, tokens []int)
}

// FullBlock is one fully computed block offered for reuse: the arguments
// of one Sharing.Publish.
type FullBlock struct {
	ID, Parent BlockID
	Tokens     []int
}

// BatchSharing is implemented by sharing stores that publish many blocks
// in one operation: the scheduler hands them every block a step finished
// (all sequences), in order, once per step, outside its lock. A block's
// parent may be an earlier block of the same call. A store may also use
// the call, even with no blocks, to prepare blocks for later Allocs.
type BatchSharing interface {
	Sharing
	PublishBlocks([]FullBlock)
}

// Preparer is implemented by stores that allocate blocks ahead of need.
// Before handing over each step's blocks the scheduler says whether the
// step served more than canaries: a store with no such work for a while
// gives back what it holds ahead, so an idle worker holds nothing ahead.
type Preparer interface {
	Prepare(busy bool)
}

// NoBlock is the parent of a sequence's first block.
const NoBlock BlockID = -1

// Validator is implemented by stores whose blocks can be taken away from
// under a sequence (a shared arena whose lease could not be renewed). The
// scheduler recomputes a sequence that holds a block that is not valid.
type Validator interface {
	Valid(BlockID) bool
	// Losses counts blocks taken back so far; the scheduler only checks
	// validity when it changes.
	Losses() uint64
}
