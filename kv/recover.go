package kv

import (
	"fmt"
	"slices"

	"github.com/dgraph-io/badger/v4"

	"github.com/lifeline-llm/lifeline/shm"
)

// slotEvidence is what recovery reads about one slot before it decides
// what becomes of it.
type slotEvidence struct {
	// HeaderOK says the slot header verified its checksum; Header means
	// something only then.
	HeaderOK bool
	Header   shm.SlotHeader
	// ArenaGen is the header's generation field, read even from a header
	// that fails its checksum: SetHeader stores it last, so a torn header
	// still holds the highest generation ever handed out for the slot.
	ArenaGen uint64
	// HasManifest says a manifest for the slot decoded; Manifest means
	// something only then.
	HasManifest bool
	Manifest    Manifest
	// KeyTaken says a slot recovered earlier holds a published block under
	// the manifest's key.
	KeyTaken bool
	// PayloadOK says the payload matches the manifest's length and
	// checksum (read for published manifests only).
	PayloadOK bool
}

// recoveryAction is what recovery does with one slot.
type recoveryAction int

const (
	// recoverFree: no manifest and a FREE header; the slot is free.
	recoverFree recoveryAction = iota
	// recoverHold: no manifest, and a header that is not FREE or cannot be
	// read. The slot may be in a live writer's hands (ALLOCATED): it is
	// out of use (ABORTED) until the start-up grace ends.
	recoverHold
	// recoverPublished: a published block whose header and payload verify
	// is readable again.
	recoverPublished
	// recoverUnfinished: a WRITING or SEALED block whose header agrees is
	// kept unreadable, for a live writer to re-attach; the sweeper
	// reclaims it after the grace.
	recoverUnfinished
	// recoverDrop: the manifest does not verify against the slot. It is
	// deleted and the slot held as for recoverHold.
	recoverDrop
)

func (a recoveryAction) String() string {
	return [...]string{"free", "hold", "published", "unfinished", "drop"}[a]
}

// recoveryDecision is the fate of one slot and the generation it keeps.
type recoveryDecision struct {
	Action recoveryAction
	Gen    uint64
}

// decideRecovery is the restart decision for one slot, from what was read
// about it alone: it does no I/O.
func decideRecovery(ev slotEvidence) recoveryDecision {
	if !ev.HasManifest {
		if ev.HeaderOK && ev.Header.State == Free {
			return recoveryDecision{recoverFree, ev.ArenaGen}
		}
		return recoveryDecision{recoverHold, ev.ArenaGen}
	}
	m := ev.Manifest
	drop := recoveryDecision{recoverDrop, max(ev.ArenaGen, m.SlotGen)}
	if !headerAgrees(ev, m) {
		return drop
	}
	switch m.State {
	case Published:
		if ev.KeyTaken || !ev.PayloadOK {
			return drop
		}
		return recoveryDecision{recoverPublished, m.SlotGen}
	case Writing, Sealed:
		return recoveryDecision{recoverUnfinished, m.SlotGen}
	}
	return drop
}

// headerAgrees says the slot header is the manifest's, at the same
// generation. The manifest is written before the header, so a crash
// between the two leaves the header one state behind.
func headerAgrees(ev slotEvidence, m Manifest) bool {
	if !ev.HeaderOK || ev.Header.Gen != m.SlotGen {
		return false
	}
	h := ev.Header.State
	// A publish batch seals headers before its PUBLISHED manifests are
	// written: a crash in between leaves SEALED over WRITING.
	return h == m.State || (m.State == Published && h == Sealed) || (m.State == Sealed && h == Writing) ||
		(m.State == Writing && (h == Allocated || h == Sealed))
}

// recover rebuilds the owner's state from the manifests and slot headers
// at start-up: it reads each slot, decides (decideRecovery), and writes
// the headers and manifest deletions the decisions call for.
func (o *Owner) recover() error {
	manifests, bad, err := o.readManifests()
	if err != nil {
		return err
	}
	o.graceUntil = o.opts.Now().Add(o.opts.LeaseTTL)
	var held []uint32
	for i := range o.slots {
		ev := o.readSlot(uint32(i), manifests)
		d := decideRecovery(ev)
		o.slots[i].gen = d.Gen
		switch d.Action {
		case recoverFree:
			o.resetSlot(uint32(i), true)
		case recoverHold:
			held = append(held, uint32(i))
		case recoverDrop:
			o.stats.DroppedAtStartup++
			bad = append(bad, manifestKey(uint32(i)))
			held = append(held, uint32(i))
		case recoverPublished, recoverUnfinished:
			if err := o.restore(uint32(i), ev.Manifest, d.Action == recoverPublished); err != nil {
				return err
			}
		}
	}
	// Held slots may still be in a live writer's hands: they return to the
	// pool only after the grace (see Sweep).
	for _, i := range held {
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

// readManifests decodes every stored manifest by slot, and returns the
// keys of those that do not decode or name no slot of this arena.
func (o *Owner) readManifests() (map[uint32]Manifest, [][]byte, error) {
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
		return nil, nil, fmt.Errorf("kv: read manifests: %w", err)
	}
	return manifests, bad, nil
}

// readSlot gathers the evidence about slot i: its header, its manifest,
// and for a published manifest whether its key is taken and its payload
// verifies.
func (o *Owner) readSlot(i uint32, manifests map[uint32]Manifest) slotEvidence {
	h, herr := o.arena.Header(int(i))
	m, ok := manifests[i]
	ev := slotEvidence{HeaderOK: herr == nil, Header: h, ArenaGen: o.arena.Gen(int(i)), HasManifest: ok, Manifest: m}
	if ok && m.State == Published {
		_, ev.KeyTaken = o.byKey[m.Key]
		ev.PayloadOK = !ev.KeyTaken && o.payloadVerifies(i, m.PayloadLen, m.Checksum)
	}
	return ev
}

// restore puts a kept block back in slot i as its manifest describes it,
// and rewrites its header (completing a publish the header had missed).
func (o *Owner) restore(i uint32, m Manifest, published bool) error {
	if published {
		o.stats.RecoveredAtStart++
		o.byKey[m.Key] = i
	}
	o.slots[i] = slot{gen: m.SlotGen, state: m.State, key: m.Key, parent: m.Parent, writer: Writer{Instance: m.WriterInstance, Gen: m.WriterGen},
		payloadLen: m.PayloadLen, checksum: m.Checksum, lastUsed: m.Updated}
	return o.setHeader(i)
}
