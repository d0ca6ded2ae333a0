package kv

import "fmt"

// leaseLocked gives session s a lease on published slot i and marks the
// block used now.
func (o *Owner) leaseLocked(s *session, i uint32) {
	sl := &o.slots[i]
	if sl.leases == nil {
		sl.leases = map[SessionID]struct{}{}
	}
	sl.leases[s.id] = struct{}{}
	s.leased[i] = struct{}{}
	sl.lastUsed = o.opts.Now()
}

// Lookup returns how many leading keys are published, without leasing.
func (o *Owner) Lookup(keys []BlockKey) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, k := range keys {
		if _, ok := o.byKey[k]; !ok {
			break
		}
		n++
	}
	return n
}

// Acquire leases the published blocks of the longest published prefix of
// keys to the session and returns their references.
func (o *Owner) Acquire(sid SessionID, keys []BlockKey) ([]Ref, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, err := o.sessionLocked(sid)
	if err != nil {
		return nil, err
	}
	var refs []Ref
	for _, k := range keys {
		i, ok := o.byKey[k]
		if !ok {
			break
		}
		sl := &o.slots[i]
		o.leaseLocked(s, i)
		refs = append(refs, Ref{Slot: i, Gen: sl.gen, Checksum: sl.checksum, PayloadLen: sl.payloadLen})
	}
	return refs, nil
}

// Release drops the session's lease on a published block.
func (o *Owner) Release(sid SessionID, r Ref) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, err := o.sessionLocked(sid)
	if err != nil {
		return err
	}
	if int(r.Slot) >= len(o.slots) || o.slots[r.Slot].gen != r.Gen {
		o.stats.StaleRejects++
		return fmt.Errorf("%w: release slot %d gen %d", ErrStaleRef, r.Slot, r.Gen)
	}
	delete(o.slots[r.Slot].leases, sid)
	delete(s.leased, r.Slot)
	return nil
}
