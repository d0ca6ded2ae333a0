package shm

import (
	"errors"
	"os"
	"testing"
	"unsafe"
)

func tempArenaPath(t testing.TB) string {
	t.Helper()
	dir := "/dev/shm"
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = t.TempDir()
	}
	f, err := os.CreateTemp(dir, "lifeline-test-*")
	if err != nil {
		t.Fatal(err)
	}
	p := f.Name()
	f.Close()
	os.Remove(p) // OpenOrCreate creates it exclusively
	t.Cleanup(func() { os.Remove(p) })
	return p
}

func TestCreateReopenKeepsSlots(t *testing.T) {
	path := tempArenaPath(t)
	g := Geometry{Slots: 8, PayloadSize: 5000}
	a, created, err := OpenOrCreate(path, g)
	if err != nil || !created {
		t.Fatalf("create: %v (created %v)", err, created)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("arena mode %v, want 0600", st.Mode().Perm())
	}
	copy(a.Payload(3), "hello arena")
	h := SlotHeader{Gen: 7, State: SlotPublished, PayloadLen: 11, Checksum: Checksum([]byte("hello arena")), WriterGen: 3, WriterInstance: "decode-1"}
	if err := a.SetHeader(3, h); err != nil {
		t.Fatal(err)
	}
	// A second mapping (as another process would have) sees the bytes.
	b, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b.Payload(3)[:11]) != "hello arena" || b.Gen(3) != 7 || b.State(3) != SlotPublished {
		t.Fatal("second mapping does not see the slot")
	}
	copy(b.Payload(3), "HELLO")
	if string(a.Payload(3)[:5]) != "HELLO" {
		t.Fatal("writes through one mapping are not visible through the other")
	}
	b.Close()
	a.Close()

	a, created, err = OpenOrCreate(path, g)
	if err != nil || created {
		t.Fatalf("reopen: %v (created %v)", err, created)
	}
	defer a.Close()
	got, err := a.Header(3)
	if err != nil || got != h {
		t.Fatalf("header after reopen %+v, %v; want %+v", got, err, h)
	}
	if _, _, err := OpenOrCreate(path, Geometry{Slots: 9, PayloadSize: 5000}); !errors.Is(err, ErrGeometry) {
		t.Fatalf("other geometry: %v", err)
	}
	if uintptr(unsafe.Pointer(&a.Payload(1)[0]))%pageSize != 0 {
		t.Fatal("payload stride not page-aligned")
	}
}

func TestCorruptionDetected(t *testing.T) {
	path := tempArenaPath(t)
	a, _, err := OpenOrCreate(path, Geometry{Slots: 4, PayloadSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	a.SetHeader(1, SlotHeader{Gen: 2, State: SlotSealed, WriterInstance: "w"})
	a.headerBytes(1)[40] ^= 0xff // scribble on the writer id
	if _, err := a.Header(1); !errors.Is(err, ErrBadHeader) {
		t.Fatalf("scribbled header: %v", err)
	}
	if _, err := a.Header(4); !errors.Is(err, ErrBadSlot) {
		t.Fatalf("slot out of range: %v", err)
	}
	a.mem[3] = 'X' // the file header's magic
	a.Close()
	if _, err := Open(path); !errors.Is(err, ErrBadArena) {
		t.Fatalf("corrupt file header: %v", err)
	}
	os.Truncate(path, 100)
	if _, err := Open(path); !errors.Is(err, ErrBadArena) {
		t.Fatalf("truncated arena: %v", err)
	}
}

func TestHeaderEncodeRejects(t *testing.T) {
	if _, err := (SlotHeader{WriterInstance: "an-instance-id-that-is-far-too-long"}).Encode(); !errors.Is(err, ErrBadHeader) {
		t.Fatalf("long id: %v", err)
	}
	if _, err := (SlotHeader{State: 99}).Encode(); !errors.Is(err, ErrBadHeader) {
		t.Fatalf("bad state: %v", err)
	}
}

func FuzzDecodeSlotHeader(f *testing.F) {
	for _, h := range []SlotHeader{{}, {Gen: 1 << 40, State: SlotPublished, PayloadLen: 9, Checksum: 77, WriterGen: 5, WriterInstance: "decode-7"}} {
		b, _ := h.Encode()
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeSlotHeader(b)
		if err != nil {
			if !errors.Is(err, ErrBadHeader) {
				t.Fatalf("error %v does not wrap ErrBadHeader", err)
			}
			return
		}
		enc, err := h.Encode()
		if err != nil {
			t.Fatalf("decoded header does not encode: %v", err)
		}
		if string(enc[:]) != string(b) {
			t.Fatalf("re-encoding differs")
		}
	})
}

func FuzzDecodeFileHeader(f *testing.F) {
	f.Add(encodeFileHeader(Geometry{Slots: 8, PayloadSize: 4096}))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := DecodeFileHeader(b)
		if err != nil {
			if !errors.Is(err, ErrBadArena) {
				t.Fatalf("error %v does not wrap ErrBadArena", err)
			}
			return
		}
		if g.validate() != nil {
			t.Fatalf("accepted invalid geometry %+v", g)
		}
	})
}
