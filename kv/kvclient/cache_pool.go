package kvclient

import "time"

// maxPool bounds the slots a cache allocates ahead of need: enough for a
// long prefill's blocks (512 positions at 16 per block) without taking
// much of a shared arena from other writers' cached blocks. A cache also
// holds at most a quarter of its capacity and an eighth of the arena.
const maxPool = 32

// fromPool takes a slot allocated ahead of need. When the pool is empty
// (the cache's first allocation, or a burst larger than the pool) it
// allocates a whole pool's worth in one round trip.
func (c *Cache) fromPool() (Ref, error) {
	c.mu.Lock()
	c.touchPoolLocked()
	if n := len(c.pool); n > 0 {
		r := c.pool[n-1]
		c.pool = c.pool[:n-1]
		c.mu.Unlock()
		return r, nil
	}
	want := 1
	if c.workingLocked() {
		want = max(1, min(c.poolTarget, c.capacity-c.inUseLocked()))
	}
	c.stats.AllocWaited++
	c.mu.Unlock()
	ctx, cancel := c.ownerCtx()
	refs, err := c.client.Allocate(ctx, want)
	cancel()
	if err != nil && want > 1 {
		// The arena may have room for one block if not for a pool.
		ctx, cancel := c.ownerCtx()
		refs, err = c.client.Allocate(ctx, 1)
		cancel()
	}
	if err != nil {
		return Ref{}, err
	}
	c.mu.Lock()
	c.pool = append(c.pool, refs[1:]...)
	c.touchPoolLocked()
	c.mu.Unlock()
	return refs[0], nil
}

// DefaultPoolIdle is how long a cache keeps its pool while it allocates
// nothing (Cache.PoolIdle): an idle worker leaves the arena's slots to
// other writers, and a node at rest holds no WRITING slot. The next
// allocation fills it again.
const DefaultPoolIdle = time.Second

// Prepare implements kvcache.Preparer: a step with work beyond canaries
// keeps the pool filled for another PoolIdle; canaries alone let it go.
func (c *Cache) Prepare(busy bool) {
	if !busy {
		return
	}
	c.mu.Lock()
	c.poolUsed = time.Now()
	c.touchPoolLocked()
	c.mu.Unlock()
}

// workingLocked says whether a step had work beyond canaries within the
// last PoolIdle: only then are slots allocated ahead of need.
func (c *Cache) workingLocked() bool { return time.Since(c.poolUsed) < c.PoolIdle }

// touchPoolLocked arms the pool's hand-back.
func (c *Cache) touchPoolLocked() {
	if c.poolTimer == nil {
		c.poolTimer = time.AfterFunc(c.PoolIdle, c.poolIdleCheck)
	}
}

// poolIdleCheck hands the pool back if no step had work beyond canaries
// for PoolIdle, and looks again later otherwise.
func (c *Cache) poolIdleCheck() {
	c.mu.Lock()
	if wait := c.PoolIdle - time.Since(c.poolUsed); wait > 0 {
		c.poolTimer.Reset(wait)
		c.mu.Unlock()
		return
	}
	c.poolTimer = nil
	c.mu.Unlock()
	c.drainPool()
}

// refillWantLocked is how many slots PublishBlocks should allocate: up to
// the pool's target, never past the cache's capacity.
func (c *Cache) refillWantLocked() int {
	if !c.workingLocked() {
		return 0
	}
	return max(0, min(c.poolTarget-len(c.pool), c.capacity-c.inUseLocked()-len(c.pool)))
}

// recycle puts a freed block that was never published back in the pool:
// the slot is still ours at the owner, and nobody else has a reference
// to it. It reports false when the pool is full.
func (c *Cache) recycle(r Ref) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pool) >= c.poolTarget {
		return false
	}
	c.pool = append(c.pool, Ref{Slot: r.Slot, Gen: r.Gen})
	c.touchPoolLocked()
	return true
}

// drainPool hands the pool's slots back to the owner.
func (c *Cache) drainPool() {
	c.mu.Lock()
	pool := c.pool
	c.pool = nil
	c.mu.Unlock()
	for _, r := range pool {
		ctx, cancel := c.ownerCtx()
		if err := c.client.Abort(ctx, r); err != nil {
			// Freed when the session the client leaves expires.
			c.mu.Lock()
			c.stats.HandBackFailed++
			c.mu.Unlock()
		}
		cancel()
	}
}

// Pooled is how many slots the cache holds allocated ahead of need.
func (c *Cache) Pooled() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pool)
}
