package shm

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// SlotState mirrors the KV block state of the slot's manifest.
type SlotState uint32

const (
	SlotFree SlotState = iota
	SlotAllocated
	SlotWriting
	SlotSealed
	SlotPublished
	SlotAborted
	numSlotStates
)

func (s SlotState) String() string {
	switch s {
	case SlotFree:
		return "FREE"
	case SlotAllocated:
		return "ALLOCATED"
	case SlotWriting:
		return "WRITING"
	case SlotSealed:
		return "SEALED"
	case SlotPublished:
		return "PUBLISHED"
	case SlotAborted:
		return "ABORTED"
	}
	return fmt.Sprintf("SlotState(%d)", uint32(s))
}

// MaxInstanceID is the longest writer instance id a header holds.
const MaxInstanceID = 24

// HeaderInstanceID fits an instance id into a header: ids up to
// MaxInstanceID bytes as they are, longer ones as a 15-byte prefix, '~',
// and 8 hex digits of their CRC-32C. The header's copy is for people
// inspecting the arena; the manifest keeps the whole id.
func HeaderInstanceID(id string) string {
	if len(id) <= MaxInstanceID {
		return id
	}
	return fmt.Sprintf("%s~%08x", id[:15], Checksum([]byte(id)))
}

// SlotHeader is the decoded header of one slot.
//
//	0  gen           uint64  slot generation, bumped on every reuse
//	8  state         uint32
//	12 payload_len   uint32
//	16 checksum      uint32  CRC-32C of the payload's first payload_len bytes
//	20 reserved      uint32
//	24 writer_gen    uint64
//	32 writer_id     [24]byte, NUL-padded
//	56 header_crc    uint32  CRC-32C of bytes 0..56
//	60 reserved      uint32
type SlotHeader struct {
	Gen            uint64
	State          SlotState
	PayloadLen     uint32
	Checksum       uint32
	WriterGen      uint64
	WriterInstance string
}

// Encode renders the header; it fails for an instance id that does not fit.
func (h SlotHeader) Encode() ([SlotHeaderSize]byte, error) {
	var b [SlotHeaderSize]byte
	if len(h.WriterInstance) > MaxInstanceID || bytes.IndexByte([]byte(h.WriterInstance), 0) >= 0 {
		return b, fmt.Errorf("%w: writer instance id %q (at most %d bytes, no NUL)", ErrBadHeader, h.WriterInstance, MaxInstanceID)
	}
	if h.State >= numSlotStates {
		return b, fmt.Errorf("%w: state %d", ErrBadHeader, h.State)
	}
	binary.LittleEndian.PutUint64(b[0:], h.Gen)
	binary.LittleEndian.PutUint32(b[8:], uint32(h.State))
	binary.LittleEndian.PutUint32(b[12:], h.PayloadLen)
	binary.LittleEndian.PutUint32(b[16:], h.Checksum)
	binary.LittleEndian.PutUint64(b[24:], h.WriterGen)
	copy(b[32:56], h.WriterInstance)
	binary.LittleEndian.PutUint32(b[56:], Checksum(b[:56]))
	return b, nil
}

// DecodeSlotHeader parses a header, rejecting anything torn or corrupt.
func DecodeSlotHeader(b []byte) (SlotHeader, error) {
	if len(b) != SlotHeaderSize {
		return SlotHeader{}, fmt.Errorf("%w: %d bytes", ErrBadHeader, len(b))
	}
	if binary.LittleEndian.Uint32(b[56:]) != Checksum(b[:56]) {
		return SlotHeader{}, fmt.Errorf("%w: checksum mismatch", ErrBadHeader)
	}
	h := SlotHeader{
		Gen:        binary.LittleEndian.Uint64(b[0:]),
		State:      SlotState(binary.LittleEndian.Uint32(b[8:])),
		PayloadLen: binary.LittleEndian.Uint32(b[12:]),
		Checksum:   binary.LittleEndian.Uint32(b[16:]),
		WriterGen:  binary.LittleEndian.Uint64(b[24:]),
	}
	if h.State >= numSlotStates {
		return SlotHeader{}, fmt.Errorf("%w: state %d", ErrBadHeader, h.State)
	}
	if binary.LittleEndian.Uint32(b[20:]) != 0 || binary.LittleEndian.Uint32(b[60:]) != 0 {
		return SlotHeader{}, fmt.Errorf("%w: reserved bytes set", ErrBadHeader)
	}
	id := b[32:56]
	if i := bytes.IndexByte(id, 0); i >= 0 {
		if bytes.IndexFunc(id[i:], func(r rune) bool { return r != 0 }) >= 0 {
			return SlotHeader{}, fmt.Errorf("%w: writer id not NUL-padded", ErrBadHeader)
		}
		id = id[:i]
	}
	h.WriterInstance = string(id)
	return h, nil
}
