// Package kv is the owner of a node's KV arena: the manifests of KV blocks
// named by kv/blockid in Badger, the block state machine, leases, the
// sweeper, crash recovery, the prefix index, and the service that lets
// worker processes use the node's shared-memory arena. Its clients —
// workers, the transfer engine's readers, operators — are in
// kv/kvclient, which never links this package.
//
// KV is derived state. Losing a block costs a recompute; reusing a block
// that belongs to another request, model revision or generation silently
// corrupts output. Everything here prefers a miss to a wrong hit.
package kv

import (
	"github.com/lifeline-llm/lifeline/kv/blockid"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
	"github.com/lifeline-llm/lifeline/kv/kvpb"
)

// The vocabulary the owner shares with its clients, named here because
// the owner's code speaks of little else.
type (
	BlockKey    = blockid.BlockKey
	Identity    = blockid.Identity
	Writer      = kvclient.Writer
	Ref         = kvclient.Ref
	BatchBlock  = kvclient.BatchBlock
	BatchResult = kvclient.BatchResult
	RemoteError = kvclient.RemoteError
)

// The owner's errors, matched with errors.Is on either side of the socket.
var (
	ErrStaleRef          = kvclient.ErrStaleRef
	ErrNotOwner          = kvclient.ErrNotOwner
	ErrChecksum          = kvclient.ErrChecksum
	ErrDuplicate         = kvclient.ErrDuplicate
	ErrNoFreeSlots       = kvclient.ErrNoFreeSlots
	ErrLeased            = kvclient.ErrLeased
	ErrUnknownSession    = kvclient.ErrUnknownSession
	ErrIllegalTransition = kvclient.ErrIllegalTransition
	ErrBadRequest        = kvclient.ErrBadRequest
)

func keyFromBytes(b []byte) (BlockKey, error) {
	keys, err := kvclient.DecodeKeys([][]byte{b}, true)
	if err != nil {
		return BlockKey{}, err
	}
	return keys[0], nil
}

func keysFromPB(ks *kvpb.Keys) ([]BlockKey, error) {
	if ks == nil {
		return nil, nil
	}
	return kvclient.DecodeKeys(ks.Keys, true)
}
