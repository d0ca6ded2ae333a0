package kv

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/dgraph-io/badger/v4"

	"github.com/lifeline-llm/lifeline/internal/failpoint"
)

// PublishBatch seals and publishes blocks the session wrote, and allocates
// up to allocate fresh WRITING slots for it, with one manifest batch
// write: a writer's step of finished blocks and its pool refill cost one
// round trip and one Badger write instead of three of each per block.
//
// The owner checksums every payload itself (in parallel, one block per
// CPU). Each block succeeds or fails on its own: a stale or foreign ref,
// a bad length or a key already published (ErrDuplicate, also for a key
// twice in the batch) fails that block only, which stays WRITING for its
// writer to reuse or abort. Headers go SEALED before the manifests are
// written and PUBLISHED after, so a crash anywhere in between leaves no
// block readable until a restart has verified its payload (see
// decideRecovery). The allocation takes what is free (evicting as
// Allocate does), possibly fewer than asked, never failing the publish.
// An error is returned only for the whole batch: an unknown session, or
// a manifest write that failed (nothing published, nothing allocated).
func (o *Owner) PublishBatch(sid SessionID, blocks []BatchBlock, allocate int) (BatchResult, error) {
	if allocate < 0 || allocate > len(o.slots) {
		return BatchResult{}, fmt.Errorf("%w: allocate %d slots", ErrBadRequest, allocate)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	s, err := o.sessionLocked(sid)
	if err != nil {
		return BatchResult{}, err
	}
	res := BatchResult{Published: make([]Ref, len(blocks)), Errs: make([]error, len(blocks))}
	todo := o.checkBatchLocked(sid, blocks, &res)
	o.checksumBatchLocked(blocks, todo, &res)
	wb := o.db.NewWriteBatch()
	defer wb.Cancel()
	var taken []uint32
	if allocate > 0 {
		if len(o.free) < allocate {
			o.evictLocked(allocate - len(o.free))
		}
		if n := min(allocate, len(o.free)); n > 0 {
			if taken, err = o.takeSlotsLocked(s, sid, n, wb); err != nil {
				return BatchResult{}, err
			}
		}
	}
	if err := o.stageBatchLocked(blocks, todo, &res, wb); err != nil {
		o.unstageBatchLocked(blocks, todo)
		o.undoTakeLocked(taken)
		return BatchResult{}, err
	}
	if err := wb.Flush(); err != nil {
		o.unstageBatchLocked(blocks, todo)
		o.undoTakeLocked(taken)
		return BatchResult{}, fmt.Errorf("kv: persist publish batch: %w", err)
	}
	// A crash here leaves PUBLISHED manifests over SEALED headers; a
	// restarted owner verifies each payload and completes the publish.
	failpoint.Hit(FailOwnerAfterPublishManifest)
	for _, i := range todo {
		slot := blocks[i].Ref.Slot
		if err := o.setHeader(slot); err != nil {
			res.Errs[i] = err
			continue
		}
		o.byKey[blocks[i].Key] = slot
		delete(s.owned, slot)
		o.slots[slot].session = 0
		o.leaseLocked(s, slot)
	}
	if res.Allocated, err = o.commitTakenLocked(s, taken); err != nil {
		return BatchResult{}, err
	}
	return res, nil
}

// checkBatchLocked decides which blocks of a batch can be published,
// filling in the errors of those that cannot and the answers of retries
// (a block already published by this writer at this generation: a batch
// whose reply was lost). It returns the indexes left to publish.
func (o *Owner) checkBatchLocked(sid SessionID, blocks []BatchBlock, res *BatchResult) []int {
	var todo []int
	seen := make(map[BlockKey]bool, len(blocks))
	for i, b := range blocks {
		r := b.Ref
		if ok, _ := o.republishedLocked(sid, r); ok {
			sl := &o.slots[r.Slot]
			res.Published[i] = Ref{Slot: r.Slot, Gen: sl.gen, Checksum: sl.checksum, PayloadLen: sl.payloadLen}
			seen[sl.key] = true
			continue
		}
		if int(r.PayloadLen) > o.opts.Geometry.PayloadSize || r.PayloadLen == 0 || b.Key.IsZero() {
			res.Errs[i] = fmt.Errorf("%w: publish of %d bytes, key %s", ErrBadRequest, r.PayloadLen, b.Key)
			continue
		}
		sl, err := o.ownedLocked(sid, r)
		if err != nil {
			res.Errs[i] = err
			continue
		}
		if sl.state != Writing {
			res.Errs[i] = fmt.Errorf("%w: slot %d is %s", ErrIllegalTransition, r.Slot, sl.state)
			continue
		}
		if _, published := o.byKey[b.Key]; published || seen[b.Key] {
			o.stats.DuplicatePublish++
			res.Errs[i] = fmt.Errorf("%w: %s", ErrDuplicate, b.Key)
			continue
		}
		seen[b.Key] = true
		todo = append(todo, i)
	}
	return todo
}

// checksumBatchLocked checksums the payloads of the blocks to publish,
// spread over the CPUs: the CRC is most of a block's publish cost.
func (o *Owner) checksumBatchLocked(blocks []BatchBlock, todo []int, res *BatchResult) {
	workers := min(runtime.GOMAXPROCS(0), len(todo))
	sumFrom := func(w int) {
		for k := w; k < len(todo); k += workers {
			r := blocks[todo[k]].Ref
			// Slot and length were checked: this cannot fail.
			sum, _ := o.arena.PayloadChecksum(int(r.Slot), int(r.PayloadLen))
			res.Published[todo[k]] = Ref{Slot: r.Slot, Gen: r.Gen, Checksum: sum, PayloadLen: r.PayloadLen}
		}
	}
	if workers <= 1 {
		sumFrom(0) // one block: no goroutine
		return
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sumFrom(w)
		}()
	}
	wg.Wait()
}

// stageBatchLocked seals the blocks to publish (state, key, checksum and
// a SEALED header) and stages their PUBLISHED manifests in wb.
func (o *Owner) stageBatchLocked(blocks []BatchBlock, todo []int, res *BatchResult, wb *badger.WriteBatch) error {
	now := o.opts.Now()
	for _, i := range todo {
		r, b := res.Published[i], blocks[i]
		sl := &o.slots[r.Slot]
		sl.state, sl.key, sl.parent, sl.payloadLen, sl.checksum = Sealed, b.Key, b.Parent, r.PayloadLen, r.Checksum
		if err := o.setHeader(r.Slot); err != nil {
			return err
		}
		sl.state = Published
		if err := wb.Set(manifestKey(r.Slot), o.manifestOf(r.Slot, now).Encode()); err != nil {
			return fmt.Errorf("kv: stage publish: %w", err)
		}
	}
	return nil
}

// unstageBatchLocked puts the blocks of a batch whose manifest write
// failed back to WRITING, header included.
func (o *Owner) unstageBatchLocked(blocks []BatchBlock, todo []int) {
	// The slots are the ones checkBatchLocked accepted: WRITING before.
	for _, i := range todo {
		slot := blocks[i].Ref.Slot
		s := &o.slots[slot]
		s.state, s.key, s.parent, s.payloadLen, s.checksum = Writing, BlockKey{}, BlockKey{}, 0, 0
		o.setHeader(slot)
	}
}
