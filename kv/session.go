package kv

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// sessionLocked returns the live session sid.
func (o *Owner) sessionLocked(sid SessionID) (*session, error) {
	s := o.sessions[sid]
	if s == nil || !o.opts.Now().Before(s.expires) {
		return nil, fmt.Errorf("%w: %d", ErrUnknownSession, sid)
	}
	return s, nil
}

// Hello opens a session for writer. owned lists WRITING/SEALED blocks the
// writer had before (its previous session, or the previous owner process),
// leased the published blocks it still reads; each is re-attached if the
// reference still names the same block, and the answers say which were.
func (o *Owner) Hello(w Writer, owned, leased []Ref) (SessionID, []bool, []bool, error) {
	if w.Instance == "" || len(w.Instance) > MaxInstanceID || strings.IndexByte(w.Instance, 0) >= 0 {
		return 0, nil, nil, fmt.Errorf("%w: writer instance id %q (1..%d bytes, no NUL)", ErrBadRequest, w.Instance, MaxInstanceID)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	sid := SessionID(rand.Uint64() | 1)
	s := &session{id: sid, writer: w, expires: o.opts.Now().Add(o.opts.LeaseTTL), owned: map[uint32]struct{}{}, leased: map[uint32]struct{}{}}
	o.sessions[sid] = s
	ownedOK := make([]bool, len(owned))
	for i, r := range owned {
		if !o.refLive(r) {
			continue
		}
		sl := &o.slots[r.Slot]
		if (sl.state != Writing && sl.state != Sealed) || sl.writer != w {
			continue
		}
		if old := o.sessions[sl.session]; old != nil {
			delete(old.owned, r.Slot)
		}
		sl.session = sid
		s.owned[r.Slot] = struct{}{}
		ownedOK[i] = true
	}
	leasedOK := make([]bool, len(leased))
	for i, r := range leased {
		if o.refLive(r) && o.slots[r.Slot].state == Published {
			o.leaseLocked(s, r.Slot)
			leasedOK[i] = true
		}
	}
	return sid, ownedOK, leasedOK, nil
}

// KeepAlive renews a session's lease.
func (o *Owner) KeepAlive(sid SessionID) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, err := o.sessionLocked(sid)
	if err != nil {
		return err
	}
	s.expires = o.opts.Now().Add(o.opts.LeaseTTL)
	return nil
}

// EndReplaced ends session old of writer w once w's session sid has taken
// over what it re-attached: whatever old still holds, its writer gave up
// (a lease an unanswered Acquire took, a block it forgot), and it would
// otherwise be held until old expired, the owner's own stalls added. A
// session of another writer, or sid itself, is left alone. It reports
// whether old was ended.
func (o *Owner) EndReplaced(w Writer, sid, old SessionID) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.sessions[old]
	if s == nil || old == sid || s.writer != w {
		return false
	}
	o.endSessionLocked(old)
	o.stats.SessionsReplaced++
	return true
}

// EndSession ends a session at once: its leases are released and any
// block it still writes is freed. It returns how many blocks were freed.
func (o *Owner) EndSession(sid SessionID) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sessions[sid] == nil {
		return 0
	}
	return o.endSessionLocked(sid)
}

// endSessionLocked frees the blocks session sid writes, drops its leases
// and forgets it; it returns how many blocks were freed.
func (o *Owner) endSessionLocked(sid SessionID) int {
	s := o.sessions[sid]
	n := 0
	for i := range s.owned {
		o.freeSlot(i)
		o.stats.OrphansReclaimed++
		n++
	}
	for i := range s.leased {
		delete(o.slots[i].leases, sid)
	}
	delete(o.sessions, sid)
	return n
}

// WriterDead is how the agent reports that a writer's process died: its
// unpublished blocks are reclaimed and its leases released at once,
// without waiting for the lease to expire.
func (o *Owner) WriterDead(w Writer) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stats.WritersReportDead++
	n := 0
	for sid, s := range o.sessions {
		if s.writer == w {
			n += o.endSessionLocked(sid)
		}
	}
	// Blocks recovered from before a restart have no session yet.
	for i := range o.slots {
		sl := &o.slots[i]
		if sl.session == 0 && sl.writer == w && (sl.state == Writing || sl.state == Sealed) {
			o.freeSlot(uint32(i))
			o.stats.OrphansReclaimed++
			n++
		}
	}
	return n
}
