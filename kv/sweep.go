package kv

import (
	"slices"
	"time"
)

// SweepResult says what one sweep reclaimed.
type SweepResult struct {
	SessionsExpired, OrphansReclaimed, Evicted int
}

// Sweep is one mark-and-sweep pass. Mark: blocks held by a live session
// (as writer or lease holder). Sweep: sessions past their lease end, once
// Options.Fence made sure their writer can write no more, taking their
// unpublished blocks with them; unpublished blocks with no session
// once the start-up grace is over; and, above the high-water mark,
// unleased published blocks, least recently used first. A block with a
// live lease is never reclaimed.
func (o *Owner) Sweep() SweepResult {
	o.mu.Lock()
	defer o.mu.Unlock()
	var res SweepResult
	now := o.opts.Now()
	// If the owner itself stalled (a slow disk under the lock, a paused
	// process), writers could not renew either: give them the lost time
	// back rather than expire live sessions.
	if gap := now.Sub(o.lastSweep); !o.lastSweep.IsZero() && gap > o.opts.LeaseTTL/2 {
		for _, s := range o.sessions {
			s.expires = s.expires.Add(gap)
		}
	}
	o.lastSweep = now
	for sid, s := range o.sessions {
		if !now.Before(s.expires) {
			// A writer with another live session gave this one up itself
			// (its client forgets what a session it could not renew
			// held): only a writer with none may still write into it.
			if o.opts.Fence != nil && !o.liveSessionLocked(s.writer, now) && !o.opts.Fence(s.writer) {
				continue
			}
			res.OrphansReclaimed += o.endSessionLocked(sid)
			res.SessionsExpired++
			o.stats.SessionsExpired++
		}
	}
	if !now.Before(o.graceUntil) {
		for i := range o.slots {
			sl := &o.slots[i]
			orphan := sl.state == Allocated || sl.state == Aborted ||
				((sl.state == Writing || sl.state == Sealed) && o.sessions[sl.session] == nil)
			if orphan {
				o.freeSlot(uint32(i))
				o.stats.OrphansReclaimed++
				res.OrphansReclaimed++
			}
		}
	}
	inUse := len(o.slots) - len(o.free)
	high := int(o.opts.HighWater * float64(len(o.slots)))
	if inUse > high {
		res.Evicted = o.evictLocked(inUse - high)
	}
	return res
}

// evictLocked frees up to n unleased published blocks, least recently used
// first, and returns how many it freed.
func (o *Owner) evictLocked(n int) int {
	if n <= 0 || o.opts.Now().Before(o.graceUntil) {
		return 0
	}
	var cands []uint32
	for i := range o.slots {
		if sl := &o.slots[i]; sl.state == Published && len(sl.leases) == 0 {
			cands = append(cands, uint32(i))
		}
	}
	slices.SortFunc(cands, func(a, b uint32) int { return o.slots[a].lastUsed.Compare(o.slots[b].lastUsed) })
	freed := 0
	for _, i := range cands[:min(n, len(cands))] {
		if o.freeSlot(i) == nil {
			freed++
		}
	}
	o.stats.Evicted += uint64(freed)
	return freed
}

// liveSessionLocked reports whether w holds a session that has not
// expired at now.
func (o *Owner) liveSessionLocked(w Writer, now time.Time) bool {
	for _, s := range o.sessions {
		if s.writer == w && now.Before(s.expires) {
			return true
		}
	}
	return false
}
