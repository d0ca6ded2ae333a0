// Package kvclient is the worker side of the node's KV arena: the client
// of the owner's KV service (sessions, leases renewed by keepalive,
// allocation, sealing and publishing, prefix lookups), the arena-backed
// block cache a worker's engine runs on (Cache), a tensor-parallel
// follower's read-only view of it (View), and the vocabulary the owner
// and its clients share: references, writers, the typed errors and their
// wire codes.
//
// A worker links this package and never the owner (package kv): the
// owner's manifests live in Badger, which only the node agent opens.
package kvclient

import (
	"errors"
	"fmt"

	"github.com/lifeline-llm/lifeline/kv/blockid"
	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

// BlockKey and Identity are the block names of kv/blockid.
type (
	BlockKey = blockid.BlockKey
	Identity = blockid.Identity
)

var (
	// ErrStaleRef is returned for a (slot, generation) reference whose slot
	// has been reused since: the block it named is gone.
	ErrStaleRef = errors.New("kv: stale block reference")
	// ErrNotOwner is returned when a session changes a block it does not write.
	ErrNotOwner = errors.New("kv: block belongs to another writer")
	// ErrChecksum is returned when a payload does not match its checksum.
	ErrChecksum = errors.New("kv: payload checksum mismatch")
	// ErrDuplicate is returned when publishing a key that is already published.
	ErrDuplicate = errors.New("kv: block key already published")
	// ErrNoFreeSlots is returned when every slot is in use or leased.
	ErrNoFreeSlots = errors.New("kv: no free slots")
	// ErrLeased is returned by Delete for a block that holds a live lease.
	ErrLeased = errors.New("kv: block is leased")
	// ErrUnknownSession is returned for a session that expired or never existed.
	ErrUnknownSession = errors.New("kv: unknown or expired session")
	// ErrIllegalTransition is returned for a state change the block state
	// machine forbids.
	ErrIllegalTransition = errors.New("kv: illegal state transition")
	// ErrBadRequest is wrapped by errors about malformed arguments.
	ErrBadRequest = errors.New("kv: bad request")
)

// Writer is a worker instance at one generation.
type Writer struct {
	Instance string
	Gen      uint64
}

func (w Writer) String() string { return fmt.Sprintf("%s@%d", w.Instance, w.Gen) }

// Ref names one block: a slot at one generation. Checksum and PayloadLen
// let a reader verify the bytes it maps.
type Ref struct {
	Slot       uint32
	Gen        uint64
	Checksum   uint32
	PayloadLen uint32
}

// BatchBlock is one block of a PublishBatch: a slot the session wrote
// (Ref.Slot, Gen and PayloadLen; the owner computes the checksum) and the
// key it is published under.
type BatchBlock struct {
	Ref    Ref
	Key    BlockKey
	Parent BlockKey
}

// BatchResult is what a PublishBatch did: per block, the published ref
// (its checksum set) where Errs[i] is nil; and the slots it allocated.
type BatchResult struct {
	Published []Ref
	Errs      []error
	Allocated []Ref
}

// DecodeKeys decodes wire keys: each exactly 32 bytes, or empty for the
// zero key where zero is allowed (a first block's parent). A chain of
// block keys allows no zero key.
func DecodeKeys(raw [][]byte, allowZero bool) ([]BlockKey, error) {
	keys := make([]BlockKey, len(raw))
	for i, b := range raw {
		if len(b) != len(keys[i]) && !(allowZero && len(b) == 0) {
			return nil, fmt.Errorf("%w: key %d has %d bytes", ErrBadRequest, i, len(b))
		}
		copy(keys[i][:], b)
		if !allowZero && keys[i].IsZero() {
			return nil, fmt.Errorf("%w: key %d is zero", ErrBadRequest, i)
		}
	}
	return keys, nil
}

var codeErrors = []struct {
	code kvpb.Code
	err  error
}{
	{kvpb.Code_STALE_REF, ErrStaleRef},
	{kvpb.Code_NOT_OWNER, ErrNotOwner},
	{kvpb.Code_CHECKSUM, ErrChecksum},
	{kvpb.Code_DUPLICATE, ErrDuplicate},
	{kvpb.Code_NO_FREE_SLOTS, ErrNoFreeSlots},
	{kvpb.Code_LEASED, ErrLeased},
	{kvpb.Code_UNKNOWN_SESSION, ErrUnknownSession},
	{kvpb.Code_ILLEGAL_TRANSITION, ErrIllegalTransition},
	{kvpb.Code_BAD_REQUEST, ErrBadRequest},
}

// CodeOf is the wire code of err: the code of the first of this package's
// errors it matches, INTERNAL for any other.
func CodeOf(err error) kvpb.Code {
	for _, c := range codeErrors {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return kvpb.Code_INTERNAL
}

// RemoteError is an error the owner returned; it matches the owner's
// sentinel errors with errors.Is.
type RemoteError struct {
	Code    kvpb.Code
	Message string
}

func (e *RemoteError) Error() string { return "kv: owner: " + e.Message }

func (e *RemoteError) Is(target error) bool {
	for _, c := range codeErrors {
		if c.code == e.Code && c.err == target {
			return true
		}
	}
	return false
}

// RefToPB and RefFromPB convert a reference to and from its wire form (a
// nil message is the zero Ref).
func RefToPB(r Ref) *kvpb.Ref {
	return &kvpb.Ref{Slot: r.Slot, Gen: r.Gen, Checksum: r.Checksum, PayloadLen: r.PayloadLen}
}

func RefFromPB(r *kvpb.Ref) Ref {
	if r == nil {
		return Ref{}
	}
	return Ref{Slot: r.Slot, Gen: r.Gen, Checksum: r.Checksum, PayloadLen: r.PayloadLen}
}

// RefsToPB and RefsFromPB convert lists of references.
func RefsToPB(rs []Ref) []*kvpb.Ref {
	var out []*kvpb.Ref
	for _, r := range rs {
		out = append(out, RefToPB(r))
	}
	return out
}

func RefsFromPB(rs []*kvpb.Ref) []Ref {
	out := make([]Ref, len(rs))
	for i, r := range rs {
		out[i] = RefFromPB(r)
	}
	return out
}
