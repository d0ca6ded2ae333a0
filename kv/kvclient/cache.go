package kvclient

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/shm"
)

// Failpoints on the writer's publish path.
const (
	FailBeforeSeal    = "kv.before-seal"
	FailBeforePublish = "kv.before-publish"
)

// CacheStats count what a worker's cache did.
type CacheStats struct {
	Lost           int `json:"lost"`             // blocks given up because the lease could not be proven
	Fallback       int `json:"fallback"`         // blocks served from private memory while the owner was away
	Published      int `json:"published"`        // blocks this worker made readable
	PublishFailed  int `json:"publish_failed"`   // blocks that stayed private (duplicate, owner away)
	Reused         int `json:"reused"`           // blocks taken from the arena instead of computed
	CorruptOnRead  int `json:"corrupt_on_read"`  // acquired blocks whose checksum or header did not verify
	AcquireFailed  int `json:"acquire_failed"`   // prefix lookups that failed (owner away)
	HandBackFailed int `json:"hand_back_failed"` // aborts or releases the owner did not take
	AllocWaited    int `json:"alloc_waited"`     // allocations that waited for the owner (the pool was empty)
}

// Cache is a worker's KV block store in the node's shared-memory arena:
// blocks are arena slots (BlockID = slot), K/V are written straight into
// the mapping, and full blocks are published for reuse by any process on
// the node. It implements kvcache.Store and kvcache.Sharing.
//
// Those interfaces take no context, and they are called from the decode
// step: every call to the owner is bounded by ownerCallTimeout, and a
// failure degrades (private memory, no sharing, recompute) instead of
// failing or stalling the step. While the owner is unreachable (frozen,
// restarting) calls fail at once, so running sequences keep decoding.
type Cache struct {
	client   *Client
	arena    *shm.Arena
	layout   kvcache.Layout
	identity Identity
	capacity int
	// private serves blocks while the owner is unavailable: recompute
	// instead of reuse, but keep decoding.
	private *kvcache.MemStore

	mu     sync.Mutex
	blocks map[kvcache.BlockID]*cacheBlock
	stats  CacheStats
	// pool holds slots allocated ahead of need (WRITING, ours at the
	// owner, under our lease: a worker death reclaims them with the rest),
	// so that Alloc, called under the scheduler's lock, makes no round
	// trip; PublishBlocks refills it after each step. At most poolTarget.
	pool       []Ref
	poolTarget int
	// PoolIdle is how long the pool is kept unused (DefaultPoolIdle); set
	// it before the first allocation. poolUsed is when the pool was last
	// taken from or refilled; poolTimer hands it back once it has been
	// idle that long.
	PoolIdle  time.Duration
	poolUsed  time.Time
	poolTimer *time.Timer
}

type cacheBlock struct {
	ref    Ref
	shared bool // published or acquired: read-only, released on Free
	// holders counts the sequences using the block: several sequences of
	// one worker share a published prefix under one owner lease.
	holders int
	key     BlockKey // set once shared
	// lost is set when the client could no longer prove the block is ours:
	// its slot may belong to someone else now.
	lost bool
	// unsure is set when a publish of the block got no answer (the owner
	// may have published it) or a refusal other than a duplicate (the
	// slot may not be ours): its slot is never reused for another block
	// (Free aborts it instead of putting it back in the pool).
	unsure bool
}

// ownerCallTimeout bounds one call to the owner from the decode step. A
// healthy owner answers in microseconds; one that does not answer within
// this is treated as away until it answers a renewal again.
const ownerCallTimeout = 500 * time.Millisecond

// ownerCtx bounds one call to the owner.
func (c *Cache) ownerCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), min(ownerCallTimeout, c.client.rtt()))
}

// PrivateBase offsets the ids of private fallback blocks past every slot:
// a block id at or above it is in the worker's own memory, not the arena.
const PrivateBase kvcache.BlockID = 1 << 30

// NewCache maps the owner's arena and serves at most capacity blocks from
// it. The identity must describe the engine that computes the blocks.
func NewCache(client *Client, layout kvcache.Layout, id Identity, capacity int) (*Cache, error) {
	if id.BlockSize != layout.BlockSize {
		return nil, fmt.Errorf("kv: identity block size %d, layout %d", id.BlockSize, layout.BlockSize)
	}
	if layout.BlockBytes() > client.PayloadSize() {
		return nil, fmt.Errorf("kv: a block of %d bytes does not fit the arena's %d-byte slots", layout.BlockBytes(), client.PayloadSize())
	}
	if capacity <= 0 {
		return nil, fmt.Errorf("kv: cache capacity %d", capacity)
	}
	arena, err := shm.OpenWorker(client.ArenaPath())
	if err != nil {
		return nil, err
	}
	private, err := kvcache.NewMemStore(layout, capacity)
	if err != nil {
		arena.Close()
		return nil, err
	}
	c := &Cache{client: client, arena: arena, layout: layout, identity: id, capacity: capacity, private: private, blocks: map[kvcache.BlockID]*cacheBlock{},
		poolTarget: max(1, min(maxPool, capacity/4, client.Slots()/8)), PoolIdle: DefaultPoolIdle}
	client.OnLost(c.markLost)
	return c, nil
}

func (c *Cache) markLost(refs []Ref) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range refs {
		if b, ok := c.blocks[kvcache.BlockID(r.Slot)]; ok && b.ref.Gen == r.Gen && !b.lost {
			b.lost = true
			c.stats.Lost++
		}
	}
	c.pool = slices.DeleteFunc(c.pool, func(p Ref) bool {
		return slices.ContainsFunc(refs, func(r Ref) bool { return r.Slot == p.Slot && r.Gen == p.Gen })
	})
}

// Losses counts blocks declared lost. It first fences the client if its
// lease can no longer be proven, so that the scheduler, which asks before
// every step, stops writing arena blocks in time even while the renewal
// that would have noticed is stuck on a frozen owner.
func (c *Cache) Losses() uint64 {
	c.client.Fence()
	c.mu.Lock()
	defer c.mu.Unlock()
	return uint64(c.stats.Lost)
}

// Shared reports whether block id is published or acquired: read-only,
// released (never reused) on Free.
func (c *Cache) Shared(id kvcache.BlockID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.blocks[id]
	return ok && b.shared
}

// Valid reports whether a block is still ours to read and write. The
// scheduler recomputes sequences holding a block that is not.
func (c *Cache) Valid(id kvcache.BlockID) bool {
	if id >= PrivateBase {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.blocks[id]
	return ok && !b.lost
}

// Close hands every block back and unmaps the arena.
func (c *Cache) Close() error {
	c.mu.Lock()
	ids := make([]kvcache.BlockID, 0, len(c.blocks))
	for id := range c.blocks {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		for c.Free(id) == nil {
			// Free drops one holder per call; a block shared by several
			// sequences needs one call each.
		}
	}
	c.mu.Lock()
	if c.poolTimer != nil {
		c.poolTimer.Stop()
	}
	c.mu.Unlock()
	c.drainPool()
	return c.arena.Close()
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats { c.mu.Lock(); defer c.mu.Unlock(); return c.stats }

// Identity is the identity every block of this cache is keyed under.
func (c *Cache) Identity() Identity { return c.identity }

// Client is the cache's connection to the arena owner.
func (c *Cache) Client() *Client { return c.client }

// Arena is the cache's own mapping of the arena.
func (c *Cache) Arena() *shm.Arena { return c.arena }

func (c *Cache) Layout() kvcache.Layout { return c.layout }
func (c *Cache) Capacity() int          { return c.capacity }

func (c *Cache) NumFree() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.capacity - c.inUseLocked()
}

func (c *Cache) inUseLocked() int { return len(c.blocks) + c.private.Capacity() - c.private.NumFree() }

func (c *Cache) Alloc() (kvcache.BlockID, error) {
	c.mu.Lock()
	full := c.inUseLocked() >= c.capacity
	c.mu.Unlock()
	if full {
		return 0, kvcache.ErrNoFreeBlocks
	}
	r, err := c.fromPool()
	if err != nil {
		// Degrade to private memory: this block will not be shared. Any
		// failure does: the owner away, or its arena full (other writers'
		// blocks) while this worker is within its own capacity.
		c.mu.Lock()
		defer c.mu.Unlock()
		id, perr := c.private.Alloc()
		if perr != nil {
			return 0, perr
		}
		c.stats.Fallback++
		return PrivateBase + id, nil
	}
	id := kvcache.BlockID(r.Slot)
	c.mu.Lock()
	c.blocks[id] = &cacheBlock{ref: r, holders: 1}
	c.mu.Unlock()
	return id, nil
}

func (c *Cache) Free(id kvcache.BlockID) error {
	if id >= PrivateBase {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.private.Free(id - PrivateBase)
	}
	c.mu.Lock()
	b, ok := c.blocks[id]
	if ok {
		b.holders--
		if b.holders > 0 {
			c.mu.Unlock()
			return nil
		}
		delete(c.blocks, id)
	}
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("kv: free block %d: %w", id, kvcache.ErrBadBlock)
	}
	if b.lost {
		return nil // the owner already took it back
	}
	if !b.shared && !b.unsure && c.recycle(b.ref) {
		return nil // back in the pool: still ours, never published
	}
	ctx, cancel := c.ownerCtx()
	defer cancel()
	var err error
	if b.shared {
		err = c.client.Release(ctx, b.ref)
	} else {
		err = c.client.Abort(ctx, b.ref)
	}
	if err != nil {
		// The client then leaves the session to expire, which frees it
		// at the owner; nothing else to do.
		c.mu.Lock()
		c.stats.HandBackFailed++
		c.mu.Unlock()
	}
	return nil
}

func (c *Cache) Block(id kvcache.BlockID) []float32 {
	if id >= PrivateBase {
		return c.private.Block(id - PrivateBase)
	}
	return c.arena.Float32s(int(id), c.layout.BlockFloats())
}

func (c *Cache) payload(id kvcache.BlockID) []byte {
	return c.arena.Payload(int(id))[:c.layout.BlockBytes()]
}

// Publish seals and publishes one full block under the key of its
// prefix: PublishBlocks of one block.
func (c *Cache) Publish(id, parentID kvcache.BlockID, tokens []int) {
	c.PublishBlocks([]kvcache.FullBlock{{ID: id, Parent: parentID, Tokens: tokens}})
}

// AcquirePrefix leases the longest published prefix of tokens and verifies
// every block before handing it out: the slot must still be at the leased
// generation and PUBLISHED, and its payload must match its checksum. A block
// that fails is reported to the owner, and the prefix ends before it.
func (c *Cache) AcquirePrefix(tokens []int, maxBlocks int) []kvcache.BlockID {
	c.mu.Lock()
	room := c.capacity - c.inUseLocked() // private fallback blocks count too
	c.mu.Unlock()
	maxBlocks = min(maxBlocks, room)
	if maxBlocks <= 0 {
		return nil
	}
	keys := c.identity.Chain(tokens, maxBlocks)
	ctx, cancel := c.ownerCtx()
	defer cancel()
	refs, err := c.client.Acquire(ctx, keys)
	if err != nil {
		c.mu.Lock()
		c.stats.AcquireFailed++
		c.mu.Unlock()
		return nil
	}
	var ids []kvcache.BlockID
	for i, r := range refs {
		id := kvcache.BlockID(r.Slot)
		c.mu.Lock()
		held, dup := c.blocks[id]
		if dup && held.shared && !held.lost && held.ref.Gen == r.Gen {
			// Another of our sequences already holds it, verified.
			held.holders++
			c.stats.Reused++
			c.mu.Unlock()
			ids = append(ids, id)
			continue
		}
		c.mu.Unlock()
		ok := !dup && int(r.PayloadLen) == c.layout.BlockBytes() && c.arena.Gen(int(r.Slot)) == r.Gen &&
			c.arena.State(int(r.Slot)) == shm.SlotPublished && shm.Checksum(c.payload(id)) == r.Checksum
		if !ok {
			if !dup {
				c.client.ReportCorrupt(ctx, r)
				c.mu.Lock()
				c.stats.CorruptOnRead++
				c.mu.Unlock()
			}
			// Hand back the leases Acquire took for this and the rest,
			// except on blocks we already hold shared (one owner lease
			// serves all our holders).
			for _, rest := range refs[i:] {
				c.mu.Lock()
				held, ours := c.blocks[kvcache.BlockID(rest.Slot)]
				keep := ours && held.shared && !held.lost && held.ref.Gen == rest.Gen
				c.mu.Unlock()
				if !keep {
					c.client.Release(ctx, rest)
				}
			}
			break
		}
		c.mu.Lock()
		c.blocks[id] = &cacheBlock{ref: r, shared: true, holders: 1, key: keys[i]}
		c.stats.Reused++
		c.mu.Unlock()
		ids = append(ids, id)
	}
	return ids
}

// Contains reports whether p points into this cache's arena mapping: the
// zero-copy check for blocks read from another process's writes.
func (c *Cache) Contains(p *float32) bool {
	base := c.arena.Base()
	size := uintptr(c.arena.Geometry().FileSize())
	addr := uintptr(unsafe.Pointer(p))
	return addr >= base && addr < base+size
}
