package kv

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
	"github.com/lifeline-llm/lifeline/shm"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// writeBlocks allocates n blocks from cache, fills each with a pattern of
// its own, and returns them as a step would hand them to PublishBlocks.
func writeBlocks(t *testing.T, cache *kvclient.Cache, tokens []int, n int) []kvcache.FullBlock {
	t.Helper()
	var full []kvcache.FullBlock
	var ids []kvcache.BlockID
	for b := 0; b < n; b++ {
		id, err := cache.Alloc()
		if err != nil || id >= kvclient.PrivateBase {
			t.Fatalf("alloc %d: %v (id %d)", b, err, id)
		}
		blk := cache.Block(id)
		for i := range blk {
			blk[i] = float32(b*100_000 + i)
		}
		full = append(full, kvcache.FullBlock{ID: id, Parent: parentOf(ids), Tokens: tokens[:(b+1)*16]})
		ids = append(ids, id)
	}
	return full
}

func batchTokens(n, base int) []int {
	tokens := make([]int, n*16+1)
	for i := range tokens {
		tokens[i] = base + i
	}
	return tokens
}

// TestPublishBlocksOneBatchAllReadable: a step's eight blocks published in
// one call are all readable by another cache, each verified against the
// checksum the owner computed over the payload in the arena.
func TestPublishBlocksOneBatchAllReadable(t *testing.T) {
	t.Parallel()
	o, sock := serveOwner(t, 64, 3*time.Second)
	w, _ := newTestCache(t, sock, "writer")
	tokens := batchTokens(8, 100)
	full := writeBlocks(t, w, tokens, 8)
	w.PublishBlocks(full)
	if st := w.Stats(); st.Published != 8 || st.PublishFailed != 0 {
		t.Fatalf("writer stats %+v", st)
	}
	o.mu.Lock() // the sweeper runs
	for _, f := range full {
		sum := shm.Checksum(w.Arena().Payload(int(f.ID))[:cacheLayout.BlockBytes()])
		if got := o.slots[f.ID].checksum; got != sum || o.slots[f.ID].state != Published {
			o.mu.Unlock()
			t.Fatalf("block %d: owner checksum %08x state %s, payload %08x", f.ID, got, o.slots[f.ID].state, sum)
		}
	}
	o.mu.Unlock()
	r, _ := newTestCache(t, sock, "reader")
	got := r.AcquirePrefix(tokens, 8)
	if len(got) != 8 || r.Stats().CorruptOnRead != 0 {
		t.Fatalf("reader acquired %v (stats %+v), want all 8 verified", got, r.Stats())
	}
	for i, id := range got {
		if id != full[i].ID || r.Block(id)[3] != float32(i*100_000+3) {
			t.Fatalf("block %d: acquired %d, want %d with its contents", i, id, full[i].ID)
		}
	}
}

// TestPublishBlocksPerBlockResults: in one batch, blocks whose keys are
// already published are refused one by one and stay private, while the
// new blocks after them publish and chain onto the right keys.
func TestPublishBlocksPerBlockResults(t *testing.T) {
	t.Parallel()
	_, sock := serveOwner(t, 64, 3*time.Second)
	a, _ := newTestCache(t, sock, "a")
	tokens := batchTokens(6, 500)
	a.PublishBlocks(writeBlocks(t, a, tokens, 3))
	b, _ := newTestCache(t, sock, "b")
	full := writeBlocks(t, b, tokens, 6) // the same first three, then three new
	b.PublishBlocks(full)
	if st := b.Stats(); st.Published != 3 || st.PublishFailed != 3 {
		t.Fatalf("second writer %+v: want its 3 duplicates refused and 3 new blocks published", st)
	}
	for i, f := range full {
		if b.Shared(f.ID) != (i >= 3) {
			t.Fatalf("block %d shared %v", i, b.Shared(f.ID))
		}
	}
	r, _ := newTestCache(t, sock, "reader")
	if got := r.AcquirePrefix(tokens, 6); len(got) != 6 || r.Stats().CorruptOnRead != 0 {
		t.Fatalf("reader got %d of 6 blocks (stats %+v)", len(got), r.Stats())
	}
}

// TestPublishBatchOwnerRefusesPerBlock: the owner refuses a stale ref, a
// foreign block, a bad length and a key twice in one batch, each alone;
// the others publish, and the refused blocks stay WRITING for their
// writer to abort.
func TestPublishBatchOwnerRefusesPerBlock(t *testing.T) {
	t.Parallel()
	env := newOwnerEnv(t, 16)
	o := env.open(t)
	defer o.Close()
	sid, _, _, _ := o.Hello(Writer{Instance: "w", Gen: 1}, nil, nil)
	other, _, _, _ := o.Hello(Writer{Instance: "x", Gen: 1}, nil, nil)
	refs, err := o.Allocate(sid, 5)
	if err != nil {
		t.Fatal(err)
	}
	foreign, _ := o.Allocate(other, 1)
	stale := refs[1]
	stale.Gen++
	key := func(i byte) BlockKey { return BlockKey{i, 7} }
	blk := func(r Ref, k BlockKey, n uint32) BatchBlock { r.PayloadLen = n; return BatchBlock{Ref: r, Key: k} }
	blocks := []BatchBlock{
		blk(refs[0], key(1), 64), blk(stale, key(2), 64), blk(foreign[0], key(3), 64), blk(refs[2], key(4), 1<<20),
		blk(refs[3], key(5), 64), blk(refs[4], key(5), 64),
	}
	res, err := o.PublishBatch(sid, blocks, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []error{nil, ErrStaleRef, ErrNotOwner, ErrBadRequest, nil, ErrDuplicate}
	for i, w := range want {
		if (w == nil) != (res.Errs[i] == nil) || (w != nil && !errors.Is(res.Errs[i], w)) {
			t.Fatalf("block %d: %v, want %v", i, res.Errs[i], w)
		}
	}
	if len(res.Allocated) != 2 || o.Lookup([]BlockKey{key(1)}) != 1 || o.Lookup([]BlockKey{key(5)}) != 1 {
		t.Fatalf("allocated %v; published key 1 %d, key 5 %d", res.Allocated, o.Lookup([]BlockKey{key(1)}), o.Lookup([]BlockKey{key(5)}))
	}
	if sum, _ := o.arena.PayloadChecksum(int(refs[0].Slot), 64); res.Published[0].Checksum != sum {
		t.Fatalf("published checksum %08x, payload %08x", res.Published[0].Checksum, sum)
	}
	for _, r := range []Ref{refs[1], refs[2], refs[4]} {
		if st := o.slots[r.Slot].state; st != Writing {
			t.Fatalf("refused slot %d is %s", r.Slot, st)
		}
		if err := o.Abort(sid, r); err != nil {
			t.Fatalf("abort refused slot %d: %v", r.Slot, err)
		}
	}
	// A retry of the batch (its reply lost) answers the published blocks
	// again instead of refusing them as duplicates.
	again, err := o.PublishBatch(sid, blocks[:1], 0)
	if err != nil || again.Errs[0] != nil || again.Published[0] != res.Published[0] {
		t.Fatalf("retry: %+v %v", again, err)
	}
}

// TestCachePoolReturnedOnClose: the slots a cache allocated ahead of need
// are WRITING at the owner while it runs and handed back by Close with
// everything else: nothing leaks.
func TestCachePoolReturnedOnClose(t *testing.T) {
	t.Parallel()
	o, sock := serveOwner(t, 64, 3*time.Second)
	c, err := kvclient.Dial(t.Context(), sock, Writer{Instance: "w", Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cache, err := kvclient.NewCache(c, cacheLayout, cacheIdentity(), 32)
	if err != nil {
		t.Fatal(err)
	}
	cache.PoolIdle = time.Hour // counted below: no hand-back for idleness
	cache.Prepare(true)        // a scheduler with work: slots come ahead of need
	tokens := batchTokens(3, 900)
	full := writeBlocks(t, cache, tokens, 3)
	pooled := cache.Pooled()
	if pooled == 0 || cache.NumFree() != 32-3 {
		t.Fatalf("pooled %d, free %d: want a pool beside the 3 blocks in use and them alone counted", pooled, cache.NumFree())
	}
	if st := o.Stats(); st.ByState["WRITING"] != 3+pooled {
		t.Fatalf("owner %+v, want %d WRITING", st, 3+pooled)
	}
	// A block never published goes back to the pool: still WRITING and
	// ours at the owner, no round trip.
	if err := cache.Free(full[2].ID); err != nil || cache.Pooled() != pooled+1 || o.Stats().ByState["WRITING"] != 3+pooled {
		t.Fatalf("free: %v; pooled %d (was %d), owner %+v", err, cache.Pooled(), pooled, o.Stats())
	}
	cache.PublishBlocks(full[:2])
	if err := cache.Close(); err != nil {
		t.Fatal(err)
	}
	if st := o.Stats(); st.ByState["WRITING"] != 0 || st.Leases != 0 || st.SlotsInUse != 2 || st.ByState["PUBLISHED"] != 2 {
		t.Fatalf("after close: %+v; want the 2 published blocks cached and nothing else held", st)
	}
}

// TestCachePoolHandedBackWhenIdle: a cache whose scheduler had no work
// (beyond canaries) for PoolIdle hands its pool back (the owner holds only
// the blocks in use); a canary's allocation takes one slot and nothing
// ahead; the next request's allocation takes a pool again.
func TestCachePoolHandedBackWhenIdle(t *testing.T) {
	t.Parallel()
	o, sock := serveOwner(t, 64, 3*time.Second)
	c, err := kvclient.Dial(t.Context(), sock, Writer{Instance: "w", Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cache, err := kvclient.NewCache(c, cacheLayout, cacheIdentity(), 32)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	cache.PoolIdle = 50 * time.Millisecond
	cache.Prepare(true)
	full := writeBlocks(t, cache, batchTokens(2, 500), 2)
	if cache.Pooled() == 0 {
		t.Fatal("no pool after the first allocations")
	}
	proctest.WaitFor(t, 5*time.Second, "the idle pool handed back", func() (bool, string) {
		st := o.Stats()
		return cache.Pooled() == 0 && st.ByState["WRITING"] == 2, fmt.Sprintf("pooled %d, owner %+v", cache.Pooled(), st)
	})
	cache.PublishBlocks(full)
	// A canary's step (no other work): one slot for it, nothing ahead.
	cache.Prepare(false)
	if _, err := cache.Alloc(); err != nil || cache.Pooled() != 0 {
		t.Fatalf("a canary's allocation: %v, pooled %d; want nothing ahead", err, cache.Pooled())
	}
	cache.Prepare(true) // a new request
	if _, err := cache.Alloc(); err != nil || cache.Pooled() == 0 {
		t.Fatalf("an allocation after the hand-back: %v, pooled %d", err, cache.Pooled())
	}
}

// TestCachePoolReclaimedWhenWriterDies: a writer that stops renewing (its
// process gone) loses its pool with its lease: the sweeper takes back
// every slot, pool included.
func TestCachePoolReclaimedWhenWriterDies(t *testing.T) {
	t.Parallel()
	o, sock := serveOwner(t, 64, 300*time.Millisecond)
	c, err := kvclient.Dial(t.Context(), sock, Writer{Instance: "w", Gen: 1})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := kvclient.NewCache(c, cacheLayout, cacheIdentity(), 32)
	if err != nil {
		t.Fatal(err)
	}
	cache.PoolIdle = time.Hour
	cache.Prepare(true)
	writeBlocks(t, cache, batchTokens(1, 50), 1)
	if cache.Pooled() == 0 {
		t.Fatal("no pool")
	}
	c.Close() // keepalives stop: as far as the owner knows, the writer died
	proctest.WaitFor(t, 10*time.Second, "the lease expiry to reclaim the pool", func() (bool, string) {
		st := o.Stats()
		return st.SlotsInUse == 0 && st.Sessions == 0, fmt.Sprintf("%+v", st)
	})
	cache.Arena().Close()
}
