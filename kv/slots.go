package kv

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/lifeline-llm/lifeline/shm"
)

// manifestKey is the Badger key of slot's manifest.
func manifestKey(slot uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte("s/"), slot)
}

// payloadVerifies checksums the first n bytes of the slot's payload.
func (o *Owner) payloadVerifies(slot, n, sum uint32) bool {
	got, err := o.arena.PayloadChecksum(int(slot), int(n))
	return err == nil && got == sum
}

// resetSlot marks a slot free in memory and in its header. Its generation
// is kept; the next allocation bumps it, fencing every old reference.
func (o *Owner) resetSlot(i uint32, headerAlreadyFree bool) {
	s := &o.slots[i]
	if s.key != (BlockKey{}) && o.byKey[s.key] == i && s.state == Published {
		delete(o.byKey, s.key)
	}
	*s = slot{gen: s.gen, state: Free}
	if !headerAlreadyFree {
		o.arena.SetHeader(int(i), shm.SlotHeader{Gen: s.gen, State: Free})
	}
	o.free = append(o.free, i)
}

// manifestOf renders slot i's in-memory state as its manifest.
func (o *Owner) manifestOf(i uint32, now time.Time) *Manifest {
	s := &o.slots[i]
	return &Manifest{Slot: i, SlotGen: s.gen, State: s.state, Key: s.key, Parent: s.parent, PayloadLen: s.payloadLen,
		Checksum: s.checksum, WriterInstance: s.writer.Instance, WriterGen: s.writer.Gen, Updated: now}
}

// persist writes slot i's manifest in one Badger transaction.
func (o *Owner) persist(i uint32) error {
	m := o.manifestOf(i, o.opts.Now())
	return o.db.Update(func(txn *badger.Txn) error { return txn.Set(manifestKey(i), m.Encode()) })
}

// setHeader writes slot i's in-memory state to its arena header.
func (o *Owner) setHeader(i uint32) error {
	s := &o.slots[i]
	if err := o.arena.SetHeader(int(i), shm.SlotHeader{Gen: s.gen, State: s.state, PayloadLen: s.payloadLen, Checksum: s.checksum,
		WriterGen: s.writer.Gen, WriterInstance: shm.HeaderInstanceID(s.writer.Instance)}); err != nil {
		return fmt.Errorf("kv: slot %d header: %w", i, err)
	}
	return nil
}

// freeSlot deletes a block's manifest and returns its slot to the pool.
func (o *Owner) freeSlot(i uint32) error {
	s := &o.slots[i]
	for sid := range s.leases {
		if ss := o.sessions[sid]; ss != nil {
			delete(ss.leased, i)
		}
	}
	if ss := o.sessions[s.session]; ss != nil {
		delete(ss.owned, i)
	}
	err := o.db.Update(func(txn *badger.Txn) error { return txn.Delete(manifestKey(i)) })
	o.resetSlot(i, false)
	return err
}

// refLive reports whether r names the block now in its slot.
func (o *Owner) refLive(r Ref) bool {
	return int(r.Slot) < len(o.slots) && o.slots[r.Slot].gen == r.Gen && o.slots[r.Slot].state != Free
}
