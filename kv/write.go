package kv

import (
	"fmt"

	"github.com/dgraph-io/badger/v4"
)

// Allocate hands the session n slots in WRITING state, each at a new
// generation. When no slot is free it evicts unleased published blocks,
// least recently used first; when none is evictable it fails with
// ErrNoFreeSlots and allocates nothing.
func (o *Owner) Allocate(sid SessionID, n int) ([]Ref, error) {
	if n <= 0 || n > len(o.slots) {
		return nil, fmt.Errorf("%w: allocate %d slots", ErrBadRequest, n)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	s, err := o.sessionLocked(sid)
	if err != nil {
		return nil, err
	}
	if len(o.free) < n {
		o.evictLocked(n - len(o.free))
	}
	if len(o.free) < n {
		return nil, fmt.Errorf("%w: need %d, %d free", ErrNoFreeSlots, n, len(o.free))
	}
	wb := o.db.NewWriteBatch()
	defer wb.Cancel()
	taken, err := o.takeSlotsLocked(s, sid, n, wb)
	if err != nil {
		return nil, err
	}
	if err := wb.Flush(); err != nil {
		o.undoTakeLocked(taken)
		return nil, fmt.Errorf("kv: persist allocation: %w", err)
	}
	return o.commitTakenLocked(s, taken)
}

// takeSlotsLocked takes n free slots for the session and stages their
// WRITING manifests in wb. It bumps every generation in the headers first
// (ALLOCATED fences old references at once); the caller flushes wb, then
// calls commitTakenLocked to mark the headers WRITING, or undoTakeLocked.
// A crash in between leaves ALLOCATED headers without manifests, which a
// restart frees at the bumped generation.
func (o *Owner) takeSlotsLocked(s *session, sid SessionID, n int, wb *badger.WriteBatch) ([]uint32, error) {
	taken := o.free[len(o.free)-n:]
	o.free = o.free[:len(o.free)-n]
	taken = append([]uint32(nil), taken...)
	now := o.opts.Now()
	for _, i := range taken {
		sl := &o.slots[i]
		sl.gen++
		sl.state, sl.writer, sl.session = Allocated, s.writer, sid
		if err := o.setHeader(i); err != nil {
			o.undoTakeLocked(taken)
			return nil, err
		}
		sl.state = Writing
		if err := wb.Set(manifestKey(i), o.manifestOf(i, now).Encode()); err != nil {
			o.undoTakeLocked(taken)
			return nil, fmt.Errorf("kv: stage allocation: %w", err)
		}
	}
	return taken, nil
}

// undoTakeLocked returns slots taken by takeSlotsLocked to the pool.
func (o *Owner) undoTakeLocked(taken []uint32) {
	for _, i := range taken {
		o.resetSlot(i, false)
	}
}

// commitTakenLocked marks taken slots WRITING once their manifests are
// durable and hands them to the session.
func (o *Owner) commitTakenLocked(s *session, taken []uint32) ([]Ref, error) {
	refs := make([]Ref, 0, len(taken))
	for _, i := range taken {
		if err := o.setHeader(i); err != nil {
			return nil, err
		}
		s.owned[i] = struct{}{}
		refs = append(refs, Ref{Slot: i, Gen: o.slots[i].gen})
	}
	return refs, nil
}

// ownedLocked checks that r names a live block the session writes.
func (o *Owner) ownedLocked(sid SessionID, r Ref) (*slot, error) {
	if _, err := o.sessionLocked(sid); err != nil {
		return nil, err
	}
	if int(r.Slot) >= len(o.slots) {
		return nil, fmt.Errorf("%w: slot %d", ErrBadRequest, r.Slot)
	}
	sl := &o.slots[r.Slot]
	if sl.gen != r.Gen {
		o.stats.StaleRejects++
		return nil, fmt.Errorf("%w: slot %d is at generation %d, not %d", ErrStaleRef, r.Slot, sl.gen, r.Gen)
	}
	if sl.session != sid || (sl.state != Writing && sl.state != Sealed) {
		return nil, fmt.Errorf("%w: slot %d (%s)", ErrNotOwner, r.Slot, sl.state)
	}
	return sl, nil
}

// Seal records a fully written block under its key. The owner checksums
// the payload in the arena itself; a mismatch with the writer's checksum
// fails the seal and leaves the block WRITING.
func (o *Owner) Seal(sid SessionID, r Ref, key, parent BlockKey) error {
	if int(r.PayloadLen) > o.opts.Geometry.PayloadSize || key.IsZero() {
		return fmt.Errorf("%w: seal of %d bytes, key %s", ErrBadRequest, r.PayloadLen, key)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	sl, err := o.ownedLocked(sid, r)
	if err != nil {
		return err
	}
	if sl.state == Sealed && sl.key == key && sl.parent == parent && sl.checksum == r.Checksum && sl.payloadLen == r.PayloadLen {
		return nil // a retry of a seal whose answer was lost
	}
	if err := Transition(sl.state, Sealed); err != nil {
		return err
	}
	if !o.payloadVerifies(r.Slot, r.PayloadLen, r.Checksum) {
		o.stats.ChecksumFailures++
		return fmt.Errorf("%w: sealing slot %d", ErrChecksum, r.Slot)
	}
	sl.state, sl.key, sl.parent, sl.payloadLen, sl.checksum = Sealed, key, parent, r.PayloadLen, r.Checksum
	if err := o.persist(r.Slot); err != nil {
		sl.state = Writing
		return fmt.Errorf("kv: persist seal: %w", err)
	}
	return o.setHeader(r.Slot)
}

// Abort discards a WRITING or SEALED block and frees its slot.
func (o *Owner) Abort(sid SessionID, r Ref) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	sl, err := o.ownedLocked(sid, r)
	if err != nil {
		return err
	}
	if err := Transition(sl.state, Aborted); err != nil {
		return err
	}
	sl.state = Aborted
	return o.freeSlot(r.Slot)
}
