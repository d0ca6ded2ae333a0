package kvclient

import (
	"errors"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/internal/failpoint"
)

// publishing is one block of a PublishBlocks call on its way to the owner.
type publishing struct {
	b        *cacheBlock
	id       kvcache.BlockID
	parentID kvcache.BlockID
	tokens   []int
	parent   BlockKey
	known    bool // parent is known (else the chain is hashed)
	key      BlockKey
}

// PublishBlocks seals and publishes every block a step finished, in
// order, with one round trip to the owner and one manifest write there,
// and in the same round trip refills the pool of slots Alloc takes from.
// It is called outside the scheduler's lock. Each block is published or
// stays private on its own (a duplicate key, a stale slot); a failure of
// the whole call (the owner away) keeps them all private, and decoding
// goes on. Nothing of the batch is readable before the owner has
// checksummed every payload of it, and all of it at once after.
func (c *Cache) PublishBlocks(full []kvcache.FullBlock) {
	plan := c.planPublish(full)
	c.mu.Lock()
	want := c.refillWantLocked()
	c.mu.Unlock()
	if len(plan) > 0 && (failpoint.Hit(FailBeforeSeal) != nil || failpoint.Hit(FailBeforePublish) != nil) {
		c.publishFailed(plan, false)
		plan = nil
	}
	if len(plan) == 0 && want == 0 {
		return
	}
	c.keys(plan)
	batch := make([]BatchBlock, len(plan))
	for i, p := range plan {
		r := p.b.ref
		batch[i] = BatchBlock{Ref: Ref{Slot: r.Slot, Gen: r.Gen, PayloadLen: uint32(c.layout.BlockBytes())}, Key: p.key, Parent: p.parent}
	}
	ctx, cancel := c.ownerCtx()
	res, err := c.client.PublishBatch(ctx, batch, want)
	cancel()
	if err != nil {
		// Without an answer the owner may have published them: their
		// slots are not reused (see cacheBlock.unsure).
		_, remote := errors.AsType[*RemoteError](err)
		c.publishFailed(plan, !remote)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range plan {
		if err := res.Errs[i]; err != nil {
			c.stats.PublishFailed++
			// Only a duplicate says the slot is still ours and untouched;
			// a stale or foreign one may be another writer's by now.
			p.b.unsure = p.b.unsure || !errors.Is(err, ErrDuplicate)
			continue
		}
		p.b.ref, p.b.shared, p.b.key = res.Published[i], true, p.key
		c.stats.Published++
	}
	c.pool = append(c.pool, res.Allocated...)
	c.touchPoolLocked()
}

// planPublish picks the blocks that can be published (arena blocks of
// ours, written, not yet shared, whole) with what is known of their
// parents' keys.
func (c *Cache) planPublish(full []kvcache.FullBlock) []publishing {
	bs := c.layout.BlockSize
	c.mu.Lock()
	defer c.mu.Unlock()
	var plan []publishing
	for _, f := range full {
		if f.ID >= PrivateBase {
			continue // private fallback blocks are never shared
		}
		b, ok := c.blocks[f.ID]
		if !ok || b.shared || b.lost || len(f.Tokens)%bs != 0 || len(f.Tokens) == 0 {
			continue
		}
		p := publishing{b: b, id: f.ID, parentID: f.Parent, tokens: f.Tokens}
		if len(f.Tokens) == bs {
			p.known = true
		} else if pb, ok := c.blocks[f.Parent]; ok && pb.shared {
			p.parent, p.known = pb.key, true
		}
		plan = append(plan, p)
	}
	return plan
}

// keys computes each planned block's key, chaining from a parent earlier
// in the batch, a shared parent, or, for a private parent (its publish
// failed), by hashing the prefix.
func (c *Cache) keys(plan []publishing) {
	bs := c.layout.BlockSize
	inBatch := make(map[kvcache.BlockID]BlockKey, len(plan))
	for i := range plan {
		p := &plan[i]
		n := len(p.tokens)
		if !p.known {
			if k, ok := inBatch[p.parentID]; ok {
				p.parent = k
			} else {
				keys := c.identity.Chain(p.tokens[:n-bs], -1)
				p.parent = keys[len(keys)-1]
			}
		}
		p.key = c.identity.Key(p.parent, p.tokens[n-bs:])
		inBatch[p.id] = p.key
	}
}

func (c *Cache) publishFailed(plan []publishing, unsure bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range plan {
		c.stats.PublishFailed++
		p.b.unsure = p.b.unsure || unsure
	}
}
