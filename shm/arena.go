// Package shm is the node's KV arena: one file under /dev/shm of fixed-size
// block slots, created by the arena owner (the node agent) and mapped by
// worker processes. A named file rather than an anonymous memfd, because the
// arena must outlive an agent restart: workers keep decoding from it while
// the agent is down, and the restarted agent re-opens it and checks every
// slot against its manifests.
//
// Each slot has a 64-byte header — slot generation, state, writer
// (instance, generation), payload length, payload checksum and a checksum of
// the header itself — and a page-aligned payload. Only the owner writes
// headers; writers write payload bytes straight into their mapped slot.
//
// Checksums are CRC-32C (Castagnoli): hash/crc32 computes it with the SSE4.2
// CRC32 instruction at memory speed, it is in the standard library, and it
// detects every burst error up to 32 bits, which is what a torn or
// scribbled block looks like. It is not a defence against an adversary; the
// arena file is mode 0600 and owned by the agent's user.
package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

var (
	// ErrBadArena is wrapped by errors about a malformed arena file.
	ErrBadArena = errors.New("shm: malformed arena file")
	// ErrGeometry means an existing arena has another slot count or size.
	ErrGeometry = errors.New("shm: arena geometry differs")
	// ErrBadHeader is wrapped by errors decoding a slot header.
	ErrBadHeader = errors.New("shm: bad slot header")
	// ErrNotOwned means the arena path is not a regular file of this
	// process's user: another user could read or write what it holds.
	ErrNotOwned = errors.New("shm: arena not owned by this user")
	// ErrBadSlot is returned for a slot index out of range.
	ErrBadSlot = errors.New("shm: slot out of range")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC-32C of b.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

const (
	magic          = "LLARENA1"
	version        = 1
	fileHeaderSize = 4096
	// SlotHeaderSize is the size of one slot header: one cache line.
	SlotHeaderSize = 64
	pageSize       = 4096
	maxSlots       = 1 << 24
	maxPayload     = 1 << 30
)

// Geometry is the shape of an arena.
type Geometry struct {
	Slots int
	// PayloadSize is the usable bytes per slot; the file rounds it up to a
	// page so that every payload is page-aligned.
	PayloadSize int
}

func (g Geometry) validate() error {
	if g.Slots <= 0 || g.Slots > maxSlots || g.PayloadSize <= 0 || g.PayloadSize > maxPayload {
		return fmt.Errorf("shm: geometry %d slots × %d bytes out of range", g.Slots, g.PayloadSize)
	}
	return nil
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }

func (g Geometry) stride() int       { return roundUp(g.PayloadSize, pageSize) }
func (g Geometry) headersSize() int  { return roundUp(g.Slots*SlotHeaderSize, pageSize) }
func (g Geometry) payloadStart() int { return fileHeaderSize + g.headersSize() }

// FileSize is the size of the arena file.
func (g Geometry) FileSize() int64 {
	return int64(g.payloadStart()) + int64(g.Slots)*int64(g.stride())
}

// Arena is a mapped arena file.
type Arena struct {
	path string
	geo  Geometry
	mem  []byte
}

func encodeFileHeader(g Geometry) []byte {
	b := make([]byte, 64)
	copy(b, magic)
	binary.LittleEndian.PutUint32(b[8:], version)
	binary.LittleEndian.PutUint32(b[12:], uint32(g.Slots))
	binary.LittleEndian.PutUint64(b[16:], uint64(g.PayloadSize))
	binary.LittleEndian.PutUint32(b[24:], SlotHeaderSize)
	binary.LittleEndian.PutUint32(b[28:], Checksum(b[:28]))
	return b
}

// DecodeFileHeader parses an arena's first bytes.
func DecodeFileHeader(b []byte) (Geometry, error) {
	if len(b) < 32 {
		return Geometry{}, fmt.Errorf("%w: header of %d bytes", ErrBadArena, len(b))
	}
	if string(b[:8]) != magic {
		return Geometry{}, fmt.Errorf("%w: bad magic %q", ErrBadArena, b[:8])
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != version {
		return Geometry{}, fmt.Errorf("%w: version %d", ErrBadArena, v)
	}
	if binary.LittleEndian.Uint32(b[28:]) != Checksum(b[:28]) {
		return Geometry{}, fmt.Errorf("%w: header checksum", ErrBadArena)
	}
	if hs := binary.LittleEndian.Uint32(b[24:]); hs != SlotHeaderSize {
		return Geometry{}, fmt.Errorf("%w: slot header size %d", ErrBadArena, hs)
	}
	payload := binary.LittleEndian.Uint64(b[16:])
	if payload > maxPayload {
		return Geometry{}, fmt.Errorf("%w: payload size %d", ErrBadArena, payload)
	}
	g := Geometry{Slots: int(binary.LittleEndian.Uint32(b[12:])), PayloadSize: int(payload)}
	if err := g.validate(); err != nil {
		return Geometry{}, fmt.Errorf("%w: %v", ErrBadArena, err)
	}
	return g, nil
}

// OpenOrCreate opens the arena at path, creating it (mode 0600) when it does
// not exist. An existing arena must have geometry g. created reports whether
// the file is new; a reopened arena keeps every slot as it was.
func OpenOrCreate(path string, g Geometry) (a *Arena, created bool, err error) {
	if err := g.validate(); err != nil {
		return nil, false, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		a, err := open(path, true)
		if err != nil {
			return nil, false, err
		}
		if a.geo != g {
			a.Close()
			return nil, false, fmt.Errorf("%w: %s has %d slots × %d bytes, want %d × %d", ErrGeometry, path, a.geo.Slots, a.geo.PayloadSize, g.Slots, g.PayloadSize)
		}
		return a, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("shm: create %s: %w", path, err)
	}
	defer f.Close()
	if err := f.Chmod(0o600); err != nil { // exactly, whatever the umask
		os.Remove(path)
		return nil, false, fmt.Errorf("shm: chmod %s: %w", path, err)
	}
	// Allocate every page now: a full /dev/shm then fails here, with an
	// error, instead of as a SIGBUS in a worker's first write, and writers
	// never pay for page allocation on the hot path.
	if err := unix.Fallocate(int(f.Fd()), 0, 0, g.FileSize()); err != nil {
		os.Remove(path)
		return nil, false, fmt.Errorf("shm: allocate %d bytes for %s: %w", g.FileSize(), path, err)
	}
	mem, err := mapArena(f, g)
	if err != nil {
		os.Remove(path)
		return nil, false, fmt.Errorf("shm: map %s: %w", path, err)
	}
	a = &Arena{path: path, geo: g, mem: mem}
	for i := 0; i < g.Slots; i++ {
		if err := a.SetHeader(i, SlotHeader{State: SlotFree}); err != nil {
			a.Close()
			os.Remove(path)
			return nil, false, err
		}
	}
	// The file header goes last: a crash before it leaves a file Open rejects.
	copy(mem, encodeFileHeader(g))
	return a, true, nil
}

// Open maps an existing arena read-write. It must be a regular file of
// this process's user, not a link: /dev/shm is writable by everyone, and
// an arena another user planted there would be theirs to read and write.
func Open(path string) (*Arena, error) { return open(path, false) }

// open is Open; the owner (narrow) also sets the file's mode to 0600.
func open(path string, narrow bool) (*Arena, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: open %s: %w", path, err)
	}
	defer f.Close()
	if err := checkOwned(f, path, narrow); err != nil {
		return nil, err
	}
	hdr := make([]byte, 64)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadArena, path, err)
	}
	g, err := DecodeFileHeader(hdr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shm: stat %s: %w", path, err)
	}
	if st.Size() != g.FileSize() {
		return nil, fmt.Errorf("%w: %s is %d bytes, geometry needs %d", ErrBadArena, path, st.Size(), g.FileSize())
	}
	mem, err := mapArena(f, g)
	if err != nil {
		return nil, fmt.Errorf("shm: map %s: %w", path, err)
	}
	return &Arena{path: path, geo: g, mem: mem}, nil
}

// checkOwned refuses a file that is not a regular file of this process's
// effective user; with narrow, it leaves the file mode 0600.
func checkOwned(f *os.File, path string, narrow bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("shm: stat %s: %w", path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("%w: %s is not a regular file", ErrNotOwned, path)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%w: %s belongs to uid %d, this process runs as uid %d", ErrNotOwned, path, st.Uid, os.Geteuid())
	case narrow && st.Mode&0o777 != 0o600:
		if err := f.Chmod(0o600); err != nil {
			return fmt.Errorf("shm: chmod %s: %w", path, err)
		}
	}
	return nil
}

// mapArena maps the whole file shared and faults every page in writable
// up front (MADV_POPULATE_WRITE, Linux 5.14+), so that no reader or writer
// takes a page fault on the token path: on these VMs a first write to a
// shared page costs about 5 µs, 160 µs per 128 KiB block. On an older
// kernel the advice fails and pages fault in lazily instead.
func mapArena(f *os.File, g Geometry) ([]byte, error) {
	mem, err := unix.Mmap(int(f.Fd()), 0, int(g.FileSize()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	return mem, nil
}

// OpenWorker maps an arena for a worker: payloads read-write, slot headers
// read-only, so that a worker bug cannot scribble on the owner's fences.
func OpenWorker(path string) (*Arena, error) {
	a, err := Open(path)
	if err != nil {
		return nil, err
	}
	if err := unix.Mprotect(a.mem[:a.geo.payloadStart()], unix.PROT_READ); err != nil {
		a.Close()
		return nil, fmt.Errorf("shm: protect headers of %s: %w", path, err)
	}
	return a, nil
}

// Close unmaps the arena; slices from it must not be used afterwards.
func (a *Arena) Close() error {
	if a.mem == nil {
		return nil
	}
	err := unix.Munmap(a.mem)
	a.mem = nil
	return err
}

// Path is the arena file's path.
func (a *Arena) Path() string { return a.path }

// Geometry is the arena's shape.
func (a *Arena) Geometry() Geometry { return a.geo }

func (a *Arena) check(slot int) error {
	if slot < 0 || slot >= a.geo.Slots {
		return fmt.Errorf("%w: %d of %d", ErrBadSlot, slot, a.geo.Slots)
	}
	return nil
}

// Payload returns the slot's payload bytes, aliasing the mapping.
func (a *Arena) Payload(slot int) []byte {
	off := a.geo.payloadStart() + slot*a.geo.stride()
	return a.mem[off : off+a.geo.PayloadSize : off+a.geo.PayloadSize]
}

// Float32s returns the slot's payload as n float32 values, aliasing the
// mapping (payloads are page-aligned).
func (a *Arena) Float32s(slot, n int) []float32 {
	p := a.Payload(slot)
	if n*4 > len(p) {
		panic(fmt.Sprintf("shm: %d floats do not fit a %d-byte slot", n, len(p)))
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&p[0])), n)
}

// Base is the address of the mapping, for zero-copy assertions.
func (a *Arena) Base() uintptr { return uintptr(unsafe.Pointer(&a.mem[0])) }

// Mem is the whole mapping (headers and payloads): what an RDMA device
// registers as one memory region.
func (a *Arena) Mem() []byte { return a.mem }

func (a *Arena) headerBytes(slot int) []byte {
	off := fileHeaderSize + slot*SlotHeaderSize
	return a.mem[off : off+SlotHeaderSize : off+SlotHeaderSize]
}

// Gen loads the slot's generation atomically: the fence a reader checks
// before and after using a slot.
func (a *Arena) Gen(slot int) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&a.headerBytes(slot)[0])))
}

// State loads the slot's state atomically.
func (a *Arena) State(slot int) SlotState {
	return SlotState(atomic.LoadUint32((*uint32)(unsafe.Pointer(&a.headerBytes(slot)[8]))))
}

// Header decodes the slot's header, verifying its checksum.
func (a *Arena) Header(slot int) (SlotHeader, error) {
	if err := a.check(slot); err != nil {
		return SlotHeader{}, err
	}
	var b [SlotHeaderSize]byte
	copy(b[:], a.headerBytes(slot))
	return DecodeSlotHeader(b[:])
}

// SetHeader writes the slot's header. Only the arena owner calls it. The
// generation is stored last and atomically, so a reader that sees the new
// generation sees the rest of the header.
func (a *Arena) SetHeader(slot int, h SlotHeader) error {
	if err := a.check(slot); err != nil {
		return err
	}
	b, err := h.Encode()
	if err != nil {
		return err
	}
	dst := a.headerBytes(slot)
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&dst[8])), uint32(h.State))
	copy(dst[12:], b[12:])
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&dst[0])), h.Gen)
	return nil
}

// PayloadChecksum is the CRC-32C of the first n payload bytes of slot.
func (a *Arena) PayloadChecksum(slot, n int) (uint32, error) {
	if err := a.check(slot); err != nil {
		return 0, err
	}
	if n < 0 || n > a.geo.PayloadSize {
		return 0, fmt.Errorf("shm: checksum of %d bytes of a %d-byte slot", n, a.geo.PayloadSize)
	}
	return Checksum(a.Payload(slot)[:n]), nil
}
