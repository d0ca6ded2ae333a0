package kv

import (
	"fmt"

	"github.com/lifeline-llm/lifeline/internal/failpoint"
)

// FailOwnerAfterPublishManifest is hit in the owner between the PUBLISHED
// manifest write and the header write.
const FailOwnerAfterPublishManifest = "kv.owner.after-publish-manifest"

// Publish makes a sealed block readable with one manifest write. The
// publishing session keeps a lease on it (its sequence still reads it).
func (o *Owner) Publish(sid SessionID, r Ref) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ok, err := o.republishedLocked(sid, r); ok || err != nil {
		return err
	}
	sl, err := o.ownedLocked(sid, r)
	if err != nil {
		return err
	}
	if err := Transition(sl.state, Published); err != nil {
		return err
	}
	if _, dup := o.byKey[sl.key]; dup {
		o.stats.DuplicatePublish++
		return fmt.Errorf("%w: %s", ErrDuplicate, sl.key)
	}
	sl.state = Published
	if err := o.persist(r.Slot); err != nil {
		sl.state = Sealed
		return fmt.Errorf("kv: persist publish: %w", err)
	}
	// A crash here leaves a PUBLISHED manifest over a SEALED header at the
	// same generation; a restarted owner completes the publish.
	failpoint.Hit(FailOwnerAfterPublishManifest)
	if err := o.setHeader(r.Slot); err != nil {
		return err
	}
	o.byKey[sl.key] = r.Slot
	s := o.sessions[sid]
	delete(s.owned, r.Slot)
	sl.session = 0
	o.leaseLocked(s, r.Slot)
	return nil
}

// SealPublish seals and publishes a batch of blocks the session wrote, in
// order, with one manifest batch write: the path for blocks that arrive
// whole (a KV transfer), where a separate seal and publish per block
// would cost two writes each. A block whose payload does not match its
// checksum fails the batch before anything is written; a block whose key
// is already published is skipped (left WRITING, for the caller to abort)
// and reported in dup. verified says the caller, in this process, has
// already checked every payload against its checksum (nobody else writes
// a session's WRITING slots): the owner then does not checksum the bytes
// a second time under its lock.
func (o *Owner) SealPublish(sid SessionID, refs []Ref, keys, parents []BlockKey, verified bool) (dup []bool, err error) {
	if len(keys) != len(refs) || len(parents) != len(refs) {
		return nil, fmt.Errorf("%w: %d refs, %d keys, %d parents", ErrBadRequest, len(refs), len(keys), len(parents))
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	s, err := o.sessionLocked(sid)
	if err != nil {
		return nil, err
	}
	dup = make([]bool, len(refs))
	seen := map[BlockKey]bool{}
	for i, r := range refs {
		if int(r.PayloadLen) > o.opts.Geometry.PayloadSize || keys[i].IsZero() {
			return nil, fmt.Errorf("%w: seal of %d bytes, key %s", ErrBadRequest, r.PayloadLen, keys[i])
		}
		sl, err := o.ownedLocked(sid, r)
		if err != nil {
			return nil, err
		}
		if sl.state != Writing {
			return nil, fmt.Errorf("%w: slot %d is %s", ErrBadRequest, r.Slot, sl.state)
		}
		if !verified && !o.payloadVerifies(r.Slot, r.PayloadLen, r.Checksum) {
			o.stats.ChecksumFailures++
			return nil, fmt.Errorf("%w: sealing slot %d", ErrChecksum, r.Slot)
		}
		if _, published := o.byKey[keys[i]]; published || seen[keys[i]] {
			o.stats.DuplicatePublish++
			dup[i] = true
		}
		seen[keys[i]] = true
	}
	wb := o.db.NewWriteBatch()
	defer wb.Cancel()
	now := o.opts.Now()
	for i, r := range refs {
		if dup[i] {
			continue
		}
		sl := &o.slots[r.Slot]
		sl.state, sl.key, sl.parent, sl.payloadLen, sl.checksum = Published, keys[i], parents[i], r.PayloadLen, r.Checksum
		wb.Set(manifestKey(r.Slot), o.manifestOf(r.Slot, now).Encode())
	}
	if err := wb.Flush(); err != nil {
		for i, r := range refs {
			if !dup[i] {
				o.slots[r.Slot].state = Writing
			}
		}
		return nil, fmt.Errorf("kv: persist publish: %w", err)
	}
	for i, r := range refs {
		if dup[i] {
			continue
		}
		if err := o.setHeader(r.Slot); err != nil {
			return nil, err
		}
		o.byKey[keys[i]] = r.Slot
		delete(s.owned, r.Slot)
		o.slots[r.Slot].session = 0
		o.leaseLocked(s, r.Slot)
	}
	return dup, nil
}

// republishedLocked answers a Publish retried after its reply was lost: the
// block is already PUBLISHED at the same generation by the same writer, so
// the retry succeeds and the (possibly new) session takes the lease.
func (o *Owner) republishedLocked(sid SessionID, r Ref) (bool, error) {
	s, err := o.sessionLocked(sid)
	if err != nil || int(r.Slot) >= len(o.slots) {
		return false, nil
	}
	sl := &o.slots[r.Slot]
	if sl.gen != r.Gen || sl.state != Published || sl.writer != s.writer || o.byKey[sl.key] != r.Slot {
		return false, nil
	}
	o.leaseLocked(s, r.Slot)
	return true, nil
}

// Delete removes a published block by compare-and-delete on (slot,
// generation): a late delete from an old generation never removes the
// block that now lives in the slot. A leased block is not deleted.
func (o *Owner) Delete(r Ref) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if int(r.Slot) >= len(o.slots) {
		return fmt.Errorf("%w: slot %d", ErrBadRequest, r.Slot)
	}
	sl := &o.slots[r.Slot]
	if sl.gen != r.Gen || sl.state != Published {
		o.stats.StaleDeletes++
		return fmt.Errorf("%w: delete slot %d gen %d (slot is %s at %d)", ErrStaleRef, r.Slot, r.Gen, sl.state, sl.gen)
	}
	if len(sl.leases) > 0 {
		return fmt.Errorf("%w: slot %d has %d leases", ErrLeased, r.Slot, len(sl.leases))
	}
	return o.freeSlot(r.Slot)
}

// ReportCorrupt is how a reader says a published block did not verify. The
// owner checks the payload itself and drops the block if it is corrupt.
func (o *Owner) ReportCorrupt(r Ref) (dropped bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.refLive(r) || o.slots[r.Slot].state != Published {
		o.stats.StaleRejects++
		return false, fmt.Errorf("%w: slot %d gen %d", ErrStaleRef, r.Slot, r.Gen)
	}
	sl := &o.slots[r.Slot]
	if o.payloadVerifies(r.Slot, sl.payloadLen, sl.checksum) {
		return false, nil
	}
	o.stats.ChecksumFailures++
	o.stats.CorruptDropped++
	return true, o.freeSlot(r.Slot)
}
