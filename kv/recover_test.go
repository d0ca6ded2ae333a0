package kv

import (
	"testing"

	"github.com/lifeline-llm/lifeline/shm"
)

// TestDecideRecovery scripts what a restarted owner reads for one slot and
// checks the decision, one case per row of the decision table.
func TestDecideRecovery(t *testing.T) {
	t.Parallel()
	hdr := func(gen uint64, st State) shm.SlotHeader { return shm.SlotHeader{Gen: gen, State: st} }
	man := func(gen uint64, st State) Manifest { return Manifest{SlotGen: gen, State: st, Key: BlockKey{1}} }
	for _, c := range []struct {
		name string
		ev   slotEvidence
		want recoveryAction
		gen  uint64
	}{
		// No manifest: only a FREE header frees the slot; anything else may
		// be a live writer's allocation.
		{"no manifest, header free", slotEvidence{HeaderOK: true, Header: hdr(4, Free), ArenaGen: 4}, recoverFree, 4},
		{"no manifest, header allocated", slotEvidence{HeaderOK: true, Header: hdr(5, Allocated), ArenaGen: 5}, recoverHold, 5},
		{"no manifest, header published (manifest deleted first)", slotEvidence{HeaderOK: true, Header: hdr(5, Published), ArenaGen: 5}, recoverHold, 5},
		{"no manifest, header torn", slotEvidence{ArenaGen: 9}, recoverHold, 9},

		// Published manifests: the header agrees, the key is not taken and
		// the payload verifies, or the manifest goes.
		{"published, header published",
			slotEvidence{HeaderOK: true, Header: hdr(3, Published), ArenaGen: 3, HasManifest: true, Manifest: man(3, Published), PayloadOK: true}, recoverPublished, 3},
		{"published, header one behind (sealed)",
			slotEvidence{HeaderOK: true, Header: hdr(3, Sealed), ArenaGen: 3, HasManifest: true, Manifest: man(3, Published), PayloadOK: true}, recoverPublished, 3},
		{"published, payload does not verify",
			slotEvidence{HeaderOK: true, Header: hdr(3, Published), ArenaGen: 3, HasManifest: true, Manifest: man(3, Published)}, recoverDrop, 3},
		{"published, key taken by an earlier slot",
			slotEvidence{HeaderOK: true, Header: hdr(3, Published), ArenaGen: 3, HasManifest: true, Manifest: man(3, Published), KeyTaken: true, PayloadOK: true}, recoverDrop, 3},
		{"published, header two behind (writing)",
			slotEvidence{HeaderOK: true, Header: hdr(3, Writing), ArenaGen: 3, HasManifest: true, Manifest: man(3, Published), PayloadOK: true}, recoverDrop, 3},
		{"published, header free",
			slotEvidence{HeaderOK: true, Header: hdr(3, Free), ArenaGen: 3, HasManifest: true, Manifest: man(3, Published), PayloadOK: true}, recoverDrop, 3},
		{"published, header at a newer generation",
			slotEvidence{HeaderOK: true, Header: hdr(7, Published), ArenaGen: 7, HasManifest: true, Manifest: man(3, Published), PayloadOK: true}, recoverDrop, 7},
		{"published, header torn at an older generation",
			slotEvidence{ArenaGen: 2, HasManifest: true, Manifest: man(3, Published), PayloadOK: true}, recoverDrop, 3},

		// Unfinished manifests: kept unreadable when the header agrees;
		// their payload is not checked (nobody reads it).
		{"sealed, header sealed",
			slotEvidence{HeaderOK: true, Header: hdr(6, Sealed), ArenaGen: 6, HasManifest: true, Manifest: man(6, Sealed)}, recoverUnfinished, 6},
		{"sealed, header one behind (writing)",
			slotEvidence{HeaderOK: true, Header: hdr(6, Writing), ArenaGen: 6, HasManifest: true, Manifest: man(6, Sealed)}, recoverUnfinished, 6},
		{"sealed, header ahead (published)",
			slotEvidence{HeaderOK: true, Header: hdr(6, Published), ArenaGen: 6, HasManifest: true, Manifest: man(6, Sealed)}, recoverDrop, 6},
		{"sealed, header at another generation",
			slotEvidence{HeaderOK: true, Header: hdr(8, Sealed), ArenaGen: 8, HasManifest: true, Manifest: man(6, Sealed)}, recoverDrop, 8},
		{"writing, header writing",
			slotEvidence{HeaderOK: true, Header: hdr(2, Writing), ArenaGen: 2, HasManifest: true, Manifest: man(2, Writing)}, recoverUnfinished, 2},
		{"writing, header one behind (allocated)",
			slotEvidence{HeaderOK: true, Header: hdr(2, Allocated), ArenaGen: 2, HasManifest: true, Manifest: man(2, Writing)}, recoverUnfinished, 2},
		{"writing, header sealed (a publish batch cut before its manifests)",
			slotEvidence{HeaderOK: true, Header: hdr(2, Sealed), ArenaGen: 2, HasManifest: true, Manifest: man(2, Writing)}, recoverUnfinished, 2},
		{"writing, header free",
			slotEvidence{HeaderOK: true, Header: hdr(2, Free), ArenaGen: 2, HasManifest: true, Manifest: man(2, Writing)}, recoverDrop, 2},
		{"writing, header torn",
			slotEvidence{ArenaGen: 2, HasManifest: true, Manifest: man(2, Writing)}, recoverDrop, 2},

		// An ALLOCATED manifest is never written by an owner: it goes.
		{"allocated manifest, header allocated",
			slotEvidence{HeaderOK: true, Header: hdr(1, Allocated), ArenaGen: 1, HasManifest: true, Manifest: man(1, Allocated)}, recoverDrop, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := decideRecovery(c.ev)
			if got.Action != c.want || got.Gen != c.gen {
				t.Fatalf("decision %v at generation %d, want %v at %d", got.Action, got.Gen, c.want, c.gen)
			}
		})
	}
}
