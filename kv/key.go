// Package kv keeps the manifests of KV blocks named by kv/blockid: the
// block state machine, manifests in Badger, leases, the sweeper, the prefix
// index, and the service that lets worker processes use the node's
// shared-memory arena through its owner.
//
// KV is derived state. Losing a block costs a recompute; reusing a block
// that belongs to another request, model revision or generation silently
// corrupts output. Everything here prefers a miss to a wrong hit.
package kv

import (
	"fmt"

	"github.com/lifeline-llm/lifeline/kv/blockid"
)

// BlockKey and Identity are the block names of kv/blockid, aliased because
// the owner's code speaks of little else.
type (
	BlockKey = blockid.BlockKey
	Identity = blockid.Identity
)

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
