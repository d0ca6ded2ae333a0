package localcluster

import (
	"strings"
	"testing"
)

// TestArenaSize: the arena per node is an eighth of the memory this
// machine may use split between the nodes, within its bounds, and says
// where the figure came from; more nodes get smaller arenas.
func TestArenaSize(t *testing.T) {
	avail, from := memoryAvailable()
	if avail == 0 || from == "" {
		t.Fatalf("no memory figure on this machine (%d, %q)", avail, from)
	}
	one, why := ArenaSize(1)
	three, _ := ArenaSize(3)
	want := int(min(max(avail/ArenaShare/ArenaSlotBytes, MinArenaSlots), AutoArenaSlots))
	if one != want || !strings.Contains(why, from) {
		t.Fatalf("one node: %d slots (%s), want %d from %s", one, why, want, from)
	}
	if three > one || three < MinArenaSlots || one > AutoArenaSlots {
		t.Fatalf("1 node %d slots, 3 nodes %d each", one, three)
	}
	if got := PromptsHeld(256, 2048); got != 2 {
		t.Fatalf("256 slots hold %d prompts of 2,048 tokens, want 2", got)
	}
	t.Logf("this machine: %d slots (%d MiB) per node for 1 node, %d for 3 (%s)", one, one*ArenaSlotBytes>>20, three, why)
}

func TestArenaMBValidated(t *testing.T) {
	for _, mb := range []int{-1, 1, MaxArenaSlots*ArenaSlotBytes>>20 + 1} {
		o := Options{DataDir: "d", Nodes: 1, Preset: "tiny", ArenaMB: mb}
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "arena-mb") {
			t.Errorf("arena-mb %d: %v", mb, err)
		}
	}
}
