package kv

import (
	"fmt"
	"sort"
	"time"
)

// Stats counts slots by state and what the owner refused or reclaimed.
type Stats struct {
	Slots      int
	ByState    map[string]int
	Sessions   int
	Leases     int
	SlotsInUse int
	// Unpublished counts, per writer session ("instance@gen session N"),
	// the slots held ALLOCATED, WRITING or SEALED: what a leak names.
	Unpublished map[string]int
	// LeasesBy counts, per session ("instance@gen session N", "expired"
	// once past its lease end), the published slots it holds leased.
	LeasesBy map[string]int

	StaleRejects      uint64 // reads or changes through a stale reference
	StaleDeletes      uint64 // compare-and-deletes refused for a stale generation
	ChecksumFailures  uint64 // seals or reads whose payload did not verify
	CorruptDropped    uint64 // published blocks dropped for a bad payload
	OrphansReclaimed  uint64 // WRITING/SEALED/ALLOCATED blocks of dead or expired writers
	Evicted           uint64 // unleased published blocks evicted under pressure
	DroppedAtStartup  uint64 // manifests that did not verify when the owner started
	RecoveredAtStart  uint64 // published manifests that verified when the owner started
	DuplicatePublish  uint64
	SessionsExpired   uint64
	SessionsReplaced  uint64 // ended by their writer's next hello (EndReplaced)
	WritersReportDead uint64
	// Quarantined lists an arena file or manifest directory that could not
	// be opened at start-up and was moved aside (the owner started empty).
	Quarantined []string
}

// Stats returns counts by state and the owner's counters.
func (o *Owner) Stats() Stats {
	o.mu.Lock()
	defer o.mu.Unlock()
	st := o.stats
	st.Slots = len(o.slots)
	st.ByState = map[string]int{}
	for i := range o.slots {
		sl := &o.slots[i]
		st.ByState[sl.state.String()]++
		st.Leases += len(sl.leases)
		if sl.state == Allocated || sl.state == Writing || sl.state == Sealed {
			if st.Unpublished == nil {
				st.Unpublished = map[string]int{}
			}
			st.Unpublished[fmt.Sprintf("%s session %d", sl.writer, sl.session)]++
		}
	}
	now := o.opts.Now()
	for sid, s := range o.sessions {
		if len(s.leased) == 0 {
			continue
		}
		if st.LeasesBy == nil {
			st.LeasesBy = map[string]int{}
		}
		name := fmt.Sprintf("%s session %d", s.writer, sid)
		if !now.Before(s.expires) {
			name += " expired"
		}
		st.LeasesBy[name] = len(s.leased)
	}
	st.Sessions = len(o.sessions)
	st.SlotsInUse = len(o.slots) - len(o.free)
	return st
}

// SlotInfo describes one slot that is not free, for operators.
type SlotInfo struct {
	Slot       uint32    `json:"slot"`
	Generation uint64    `json:"generation"`
	State      string    `json:"state"`
	Key        string    `json:"key,omitempty"`
	Writer     string    `json:"writer"`
	PayloadLen uint32    `json:"payload_len"`
	Leases     int       `json:"leases"`
	LastUsed   time.Time `json:"last_used,omitzero"`
}

// List returns every slot that is not free, in slot order.
func (o *Owner) List() []SlotInfo {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []SlotInfo
	for i := range o.slots {
		sl := &o.slots[i]
		if sl.state == Free {
			continue
		}
		info := SlotInfo{Slot: uint32(i), Generation: sl.gen, State: sl.state.String(), Writer: sl.writer.String(),
			PayloadLen: sl.payloadLen, Leases: len(sl.leases), LastUsed: sl.lastUsed}
		if !sl.key.IsZero() {
			info.Key = sl.key.String()
		}
		out = append(out, info)
	}
	return out
}

// PublishedKeys returns the keys of up to max published blocks, most
// recently used first: a node's prefix summary.
func (o *Owner) PublishedKeys(max int) []BlockKey {
	o.mu.Lock()
	type used struct {
		key BlockKey
		at  time.Time
	}
	all := make([]used, 0, len(o.byKey))
	for k, i := range o.byKey {
		all = append(all, used{k, o.slots[i].lastUsed})
	}
	o.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].at.After(all[j].at) })
	if len(all) > max {
		all = all[:max]
	}
	keys := make([]BlockKey, len(all))
	for i, u := range all {
		keys[i] = u.key
	}
	return keys
}
