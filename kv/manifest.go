package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/lifeline-llm/lifeline/shm"
)

// State is a block's state; the arena's slot headers mirror it.
//
//	ALLOCATED → WRITING → SEALED → PUBLISHED
//	WRITING → ABORTED, SEALED → ABORTED
//
// Only PUBLISHED blocks are readable by anyone but their writer.
type State = shm.SlotState

const (
	Free      = shm.SlotFree
	Allocated = shm.SlotAllocated
	Writing   = shm.SlotWriting
	Sealed    = shm.SlotSealed
	Published = shm.SlotPublished
	Aborted   = shm.SlotAborted
)

var legal = map[[2]State]bool{
	{Free, Allocated}:    true,
	{Allocated, Writing}: true,
	{Writing, Sealed}:    true,
	{Sealed, Published}:  true,
	{Writing, Aborted}:   true,
	{Sealed, Aborted}:    true,
	{Allocated, Aborted}: true,
	{Aborted, Free}:      true,
	{Published, Free}:    true, // eviction or compare-and-delete
}

// Transition checks a state change.
func Transition(from, to State) error {
	if !legal[[2]State{from, to}] {
		return fmt.Errorf("%w: %s → %s", ErrIllegalTransition, from, to)
	}
	return nil
}

// ErrBadManifest is wrapped by every manifest decoding error.
var ErrBadManifest = errors.New("kv: bad manifest")

// Manifest is the durable record of one slot's block, kept in Badger under
// the slot number.
type Manifest struct {
	Slot           uint32
	SlotGen        uint64
	State          State
	Key            BlockKey // set from SEALED on
	Parent         BlockKey
	PayloadLen     uint32
	Checksum       uint32
	WriterInstance string
	WriterGen      uint64
	Updated        time.Time
}

const manifestVersion = 1

// Encode renders a manifest: a version byte, fixed fields, the writer id,
// and a CRC-32C of everything before it.
func (m *Manifest) Encode() []byte {
	b := make([]byte, 0, 128)
	b = append(b, manifestVersion)
	b = binary.LittleEndian.AppendUint32(b, m.Slot)
	b = binary.LittleEndian.AppendUint64(b, m.SlotGen)
	b = append(b, byte(m.State))
	b = append(b, m.Key[:]...)
	b = append(b, m.Parent[:]...)
	b = binary.LittleEndian.AppendUint32(b, m.PayloadLen)
	b = binary.LittleEndian.AppendUint32(b, m.Checksum)
	b = binary.LittleEndian.AppendUint64(b, m.WriterGen)
	b = binary.LittleEndian.AppendUint64(b, uint64(m.Updated.UnixNano()))
	b = append(b, byte(len(m.WriterInstance)))
	b = append(b, m.WriterInstance...)
	return binary.LittleEndian.AppendUint32(b, shm.Checksum(b))
}

const manifestFixed = 1 + 4 + 8 + 1 + 32 + 32 + 4 + 4 + 8 + 8 + 1

// DecodeManifest parses a manifest, rejecting anything corrupt.
func DecodeManifest(b []byte) (Manifest, error) {
	var m Manifest
	if len(b) < manifestFixed+4 {
		return m, fmt.Errorf("%w: %d bytes", ErrBadManifest, len(b))
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if shm.Checksum(body) != sum {
		return m, fmt.Errorf("%w: checksum mismatch", ErrBadManifest)
	}
	if body[0] != manifestVersion {
		return m, fmt.Errorf("%w: version %d", ErrBadManifest, body[0])
	}
	p := body[1:]
	m.Slot = binary.LittleEndian.Uint32(p)
	m.SlotGen = binary.LittleEndian.Uint64(p[4:])
	m.State = State(p[12])
	copy(m.Key[:], p[13:45])
	copy(m.Parent[:], p[45:77])
	m.PayloadLen = binary.LittleEndian.Uint32(p[77:])
	m.Checksum = binary.LittleEndian.Uint32(p[81:])
	m.WriterGen = binary.LittleEndian.Uint64(p[85:])
	m.Updated = time.Unix(0, int64(binary.LittleEndian.Uint64(p[93:])))
	n := int(p[101])
	if len(p) != 102+n {
		return Manifest{}, fmt.Errorf("%w: writer id of %d bytes in %d", ErrBadManifest, n, len(p)-102)
	}
	m.WriterInstance = string(p[102:])
	switch m.State {
	case Allocated, Writing, Sealed, Published:
	default:
		return Manifest{}, fmt.Errorf("%w: state %s is never stored", ErrBadManifest, m.State)
	}
	return m, nil
}
