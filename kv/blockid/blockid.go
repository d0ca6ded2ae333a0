// Package blockid names KV blocks: the Identity that decides a block's
// bytes and the chained BlockKey of a block's tokens. It is a leaf so that
// a frontend can compute the keys of a prompt for cache-aware routing
// without importing the node's arena or manifest store.
package blockid

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
)

// BlockKey names the content of one KV block: a hash over the block's
// identity, its parent's key and its token ids. Because the parent key is
// hashed in, a key names the whole prefix up to and including the block.
type BlockKey [32]byte

func (k BlockKey) String() string { return hex.EncodeToString(k[:8]) }

// IsZero reports whether k is the zero key (the parent of a first block).
func (k BlockKey) IsZero() bool { return k == BlockKey{} }

// Identity is everything besides the tokens that decides the bytes of a
// block. Any field that differs makes a different key: a miss.
type Identity struct {
	Model           string
	ModelRevision   string
	TokenizerHash   string
	Adapter         string
	AdapterRevision string
	// Layout names the arrangement of floats in a block (with its shape);
	// DType their element type.
	Layout string
	DType  string
	// RopeTheta is the positional parameter; RoPE tables differ otherwise.
	RopeTheta float64
	BlockSize int
	// NumericsID names the kernels that computed the block: blocks from
	// other kernels can differ in the last bit, which would break
	// bit-exact continuation.
	NumericsID string
}

func (id *Identity) hashInto(h interface{ Write([]byte) (int, error) }) {
	var buf [8]byte
	str := func(s string) {
		binary.LittleEndian.PutUint64(buf[:], uint64(len(s)))
		h.Write(buf[:])
		h.Write([]byte(s))
	}
	h.Write([]byte("lifeline-kv-block/v1"))
	for _, s := range []string{id.Model, id.ModelRevision, id.TokenizerHash, id.Adapter, id.AdapterRevision, id.Layout, id.DType, id.NumericsID} {
		str(s)
	}
	binary.LittleEndian.PutUint64(buf[:], math.Float64bits(id.RopeTheta))
	h.Write(buf[:])
	binary.LittleEndian.PutUint64(buf[:], uint64(id.BlockSize))
	h.Write(buf[:])
}

// Key is the key of the block holding tokens (exactly BlockSize of them)
// after the prefix named by parent.
func (id *Identity) Key(parent BlockKey, tokens []int) BlockKey {
	h := sha256.New()
	id.hashInto(h)
	h.Write(parent[:])
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(len(tokens)))
	h.Write(buf[:])
	for _, t := range tokens {
		binary.LittleEndian.PutUint64(buf[:], uint64(int64(t)))
		h.Write(buf[:])
	}
	var k BlockKey
	h.Sum(k[:0])
	return k
}

// Chain returns the keys of the full blocks of tokens, at most max of them
// (max < 0: all).
func (id *Identity) Chain(tokens []int, max int) []BlockKey {
	n := len(tokens) / id.BlockSize
	if max >= 0 && n > max {
		n = max
	}
	keys := make([]BlockKey, n)
	var parent BlockKey
	for i := range keys {
		keys[i] = id.Key(parent, tokens[i*id.BlockSize:(i+1)*id.BlockSize])
		parent = keys[i]
	}
	return keys
}

// KeyBytes encodes keys for the wire (each its 32 bytes; the slices alias
// keys).
func KeyBytes(keys []BlockKey) [][]byte {
	out := make([][]byte, len(keys))
	for i := range keys {
		out[i] = keys[i][:]
	}
	return out
}
