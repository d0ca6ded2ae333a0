package kv

import (
	"fmt"
	"slices"

	"github.com/dgraph-io/badger/v4"
)

func (o *Owner) recover() error {
	manifests := map[uint32]Manifest{}
	var bad [][]byte
	err := o.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte("s/")})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			v, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			m, err := DecodeManifest(v)
			if err != nil || int(m.Slot) >= len(o.slots) || !slices.Equal(item.Key(), manifestKey(m.Slot)) {
				bad = append(bad, item.KeyCopy(nil))
				continue
			}
			manifests[m.Slot] = m
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kv: read manifests: %w", err)
	}
	now := o.opts.Now()
	o.graceUntil = now.Add(o.opts.LeaseTTL)
	var quarantine []uint32
	for i := range o.slots {
		s := &o.slots[i]
		h, herr := o.arena.Header(i)
		// The generation is read even from a header that fails its
		// checksum: SetHeader stores it last, so a torn header still holds
		// the highest generation ever handed out for the slot.
		s.gen = o.arena.Gen(i)
		m, ok := manifests[uint32(i)]
		if ok {
			s.gen = max(s.gen, m.SlotGen)
		}
		if !ok {
			if herr == nil && h.State == Free {
				o.resetSlot(uint32(i), true)
			} else {
				// Possibly in a live writer's hands (ALLOCATED, or a header
				// we cannot read): out of use until the grace ends.
				quarantine = append(quarantine, uint32(i))
			}
			continue
		}
		keep := false
		// The manifest is written before the header, so a crash between the
		// two leaves the header one state behind at the same generation.
		headerOK := herr == nil && h.Gen == m.SlotGen && (h.State == m.State ||
			(m.State == Published && h.State == Sealed) || (m.State == Sealed && h.State == Writing) ||
			(m.State == Writing && h.State == Allocated))
		switch m.State {
		case Published:
			_, dup := o.byKey[m.Key]
			keep = headerOK && !dup && o.payloadVerifies(uint32(i), m.PayloadLen, m.Checksum)
			if keep {
				o.stats.RecoveredAtStart++
				o.byKey[m.Key] = uint32(i)
			}
		case Writing, Sealed:
			// Possibly a live writer's block: unreadable, reclaimable after grace.
			keep = headerOK
		}
		if !keep {
			o.stats.DroppedAtStartup++
			bad = append(bad, manifestKey(uint32(i)))
			quarantine = append(quarantine, uint32(i))
			continue
		}
		*s = slot{gen: m.SlotGen, state: m.State, key: m.Key, parent: m.Parent, writer: Writer{m.WriterInstance, m.WriterGen},
			payloadLen: m.PayloadLen, checksum: m.Checksum, lastUsed: m.Updated}
		if err := o.setHeader(uint32(i)); err != nil {
			return err
		}
	}
	// Dropped and unreadable slots may still be in a live writer's hands:
	// they return to the pool only after the grace (see Sweep).
	for _, i := range quarantine {
		s := &o.slots[i]
		*s = slot{gen: s.gen, state: Aborted}
		if err := o.setHeader(i); err != nil {
			return err
		}
	}
	if len(bad) > 0 {
		wb := o.db.NewWriteBatch()
		for _, k := range bad {
			wb.Delete(k)
		}
		if err := wb.Flush(); err != nil {
			return fmt.Errorf("kv: drop bad manifests: %w", err)
		}
	}
	return nil
}
