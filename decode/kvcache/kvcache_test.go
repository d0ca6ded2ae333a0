package kvcache

import (
	"errors"
	"testing"
)

func TestMemStoreAllocFree(t *testing.T) {
	s, err := NewMemStore(NewLayout(2, 8, 4), 3)
	if err != nil {
		t.Fatal(err)
	}
	var ids []BlockID
	for i := 0; i < 3; i++ {
		id, err := s.Alloc()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, err := s.Alloc(); !errors.Is(err, ErrNoFreeBlocks) {
		t.Fatalf("alloc past capacity: %v, want ErrNoFreeBlocks", err)
	}
	if err := s.Free(ids[1]); err != nil {
		t.Fatal(err)
	}
	if err := s.Free(ids[1]); !errors.Is(err, ErrBadBlock) {
		t.Fatalf("double free: %v, want ErrBadBlock", err)
	}
	if err := s.Free(99); !errors.Is(err, ErrBadBlock) {
		t.Fatalf("free out of range: %v, want ErrBadBlock", err)
	}
	if s.NumFree() != 1 {
		t.Fatalf("NumFree = %d, want 1", s.NumFree())
	}
	b := s.Block(ids[0])
	if len(b) != s.Layout().BlockFloats() || cap(b) != len(b) {
		t.Fatalf("block len %d cap %d", len(b), cap(b))
	}
	if _, err := NewMemStore(NewLayout(2, 8, 4), 0); err == nil {
		t.Fatal("empty store accepted")
	}
}

func TestLayoutOffsetsDisjoint(t *testing.T) {
	l := NewLayout(3, 8, 4)
	seen := make([]bool, l.BlockFloats())
	for layer := 0; layer < l.Layers; layer++ {
		for i := 0; i < l.BlockSize; i++ {
			for _, off := range []int{l.KeyOffset(layer, i), l.ValueOffset(layer, i)} {
				for d := 0; d < l.KVDim; d++ {
					if seen[off+d] {
						t.Fatalf("layer %d pos %d overlaps at %d", layer, i, off+d)
					}
					seen[off+d] = true
				}
			}
		}
	}
}
