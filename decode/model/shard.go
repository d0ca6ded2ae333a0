package model

import (
	"encoding/binary"
	"fmt"
	"runtime"

	"golang.org/x/sys/cpu"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/matmul"
)

// Shard returns rank's part of m for a tensor-parallel group of tp ranks:
// its Heads/tp query heads and KVHeads/tp key-value heads — or, with more
// ranks than key-value heads, the one its query heads share (replicated:
// tp/KVHeads ranks compute and keep it) — (rows of Wq, Wk, Wv, the
// matching columns of Wo) and its HiddenDim/tp FFN units (rows of
// W1 and W3, columns of W2); the embedding, the norms and the classifier
// are whole. reduce must sum a slice over the group's ranks in a fixed
// rank order (collective.Group.AllReduce): it is called twice per layer,
// on the attention's and the FFN's partial outputs, and every rank then
// holds the same residual stream, so every rank computes the same logits.
// A group's KV blocks have the whole model's layout: each rank writes and
// reads its own key-value heads' part of every position (a group shares
// its blocks, in the node's arena, and reuses those of any group of the
// same tp: the block identity's numerics id carries it).
//
// The sums differ from the whole model's order of operations: a shard's
// output is deterministic for its tp, and bit-identical between groups of
// the same tp (NumericsIDFor), not with tp 1.
func (m *Model) Shard(rank, tp int, reduce func([]float32) error) (*Model, error) {
	c := m.Config
	switch {
	case m.tp != 0:
		return nil, fmt.Errorf("model: shard of a shard")
	case tp < 1 || rank < 0 || rank >= tp:
		return nil, fmt.Errorf("model: rank %d of tp %d", rank, tp)
	case c.SplitsInto(tp) != nil:
		return nil, c.SplitsInto(tp)
	case tp > 1 && reduce == nil:
		return nil, fmt.Errorf("model: tp %d needs an all-reduce", tp)
	case len(m.W.Layers) > 0 && m.W.Layers[0].Bq != nil:
		return nil, fmt.Errorf("model: tensor-parallel groups of a model with attention biases are not built")
	case m.W.Typed():
		return nil, fmt.Errorf("model: tensor-parallel groups of a model with F16, BF16 or Q8_0 weights are not built")
	}
	s := *m
	s.tp, s.rank, s.reduce = tp, rank, reduce
	dim, qd, kvd, hl := c.Dim, s.qDim(), s.kvDim(), s.hidden()
	kv0 := s.kvStart() * c.HeadSize() // its first key-value row
	s.W.Layers = make([]Layer, len(m.W.Layers))
	for i, l := range m.W.Layers {
		s.W.Layers[i] = Layer{
			AttnNorm: l.AttnNorm, FFNNorm: l.FFNNorm,
			Wq: l.Wq[rank*qd*dim : (rank+1)*qd*dim],
			Wk: l.Wk[kv0*dim : (kv0+kvd)*dim],
			Wv: l.Wv[kv0*dim : (kv0+kvd)*dim],
			Wo: columns(l.Wo, dim, dim, rank*qd, qd),
			W1: l.W1[rank*hl*dim : (rank+1)*hl*dim],
			W3: l.W3[rank*hl*dim : (rank+1)*hl*dim],
			W2: columns(l.W2, dim, c.HiddenDim, rank*hl, hl),
		}
	}
	return &s, nil
}

// columns copies columns [from, from+n) of a rows×cols row-major matrix.
func columns(w []float32, rows, cols, from, n int) []float32 {
	out := make([]float32, rows*n)
	for r := 0; r < rows; r++ {
		copy(out[r*n:(r+1)*n], w[r*cols+from:r*cols+from+n])
	}
	return out
}

// NumericsIDFor is NumericsID for a tensor-parallel degree: outputs are
// bit-identical between engines of equal ids only.
func NumericsIDFor(tp int) string {
	id := fmt.Sprintf("%s;tp=%d;dtype=float32;kernel=%s;arch=%s", EngineVersion, tp, matmul.KernelName(), runtime.GOARCH)
	if runtime.GOARCH == "amd64" {
		id += fmt.Sprintf(";fma=%v", cpu.X86.HasFMA)
	}
	return id
}

// Lead returns rank 0 of a group that calls send with every Forward's
// inputs before computing them: the other ranks compute the same inputs
// (Follow) in their part of the model.
func (m *Model) Lead(send func([]Input) error) *Model {
	s := *m
	s.lead = send
	return &s
}

// EncodeInputs is the message Lead's send hands to the other ranks: each
// input's token, position and whether its logits are wanted, each block
// table once.
func EncodeInputs(in []Input) []byte {
	b := binary.AppendUvarint(nil, uint64(len(in)))
	var tables [][]int32
	index := map[*int32]int{}
	for _, inp := range in {
		b = binary.AppendUvarint(b, uint64(inp.Token))
		b = binary.AppendUvarint(b, uint64(inp.Pos))
		logits := uint64(0)
		if inp.Logits != nil {
			logits = 1
		}
		b = binary.AppendUvarint(b, logits)
		t := -1
		if len(inp.Blocks) > 0 {
			key := (*int32)(&inp.Blocks[0])
			i, ok := index[key]
			if !ok || len(tables[i]) != len(inp.Blocks) {
				i = len(tables)
				index[key] = i
				ids := make([]int32, len(inp.Blocks))
				for j, id := range inp.Blocks {
					ids[j] = int32(id)
				}
				tables = append(tables, ids)
			}
			t = i
		}
		b = binary.AppendVarint(b, int64(t))
	}
	b = binary.AppendUvarint(b, uint64(len(tables)))
	for _, ids := range tables {
		b = binary.AppendUvarint(b, uint64(len(ids)))
		for _, id := range ids {
			b = binary.AppendUvarint(b, uint64(id))
		}
	}
	return b
}

// DecodeInputs reads EncodeInputs' message, without the logits: only
// rank 0 samples, the others skip the classifier.
func DecodeInputs(b []byte) ([]Input, error) {
	r := &reader{b: b}
	n := r.uvarint()
	if r.err != nil || n > 1<<20 {
		return nil, fmt.Errorf("%w: a step of %d inputs", ErrBadInput, n)
	}
	in := make([]Input, n)
	tabs := make([]int64, n)
	for i := range in {
		in[i].Token, in[i].Pos = int(r.uvarint()), int(r.uvarint())
		r.uvarint() // logits wanted (at rank 0)
		tabs[i] = r.varint()
	}
	nt := r.uvarint()
	if r.err != nil || nt > n {
		return nil, fmt.Errorf("%w: %d block tables for %d inputs", ErrBadInput, nt, n)
	}
	tables := make([][]kvcache.BlockID, nt)
	for i := range tables {
		k := r.uvarint()
		if r.err != nil || k > 1<<20 {
			return nil, fmt.Errorf("%w: a block table of %d", ErrBadInput, k)
		}
		tables[i] = make([]kvcache.BlockID, k)
		for j := range tables[i] {
			tables[i][j] = kvcache.BlockID(r.uvarint())
		}
	}
	if r.err != nil || len(r.b) != 0 {
		return nil, fmt.Errorf("%w: a malformed step message", ErrBadInput)
	}
	for i, t := range tabs {
		if t >= int64(len(tables)) || t < -1 {
			return nil, fmt.Errorf("%w: input %d names block table %d of %d", ErrBadInput, i, t, len(tables))
		}
		if t >= 0 {
			in[i].Blocks = tables[t]
		}
	}
	return in, nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("short")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("short")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// Follow runs rank r>0 of a group: for every step rank 0 broadcasts
// (recv, idle: it blocks until the next step), it computes the same inputs
// in its part of the model on its own KV store, until recv fails (the
// group aborted, or a collective timed out): that error is returned.
func (m *Model) Follow(ws *Workspace, store kvcache.Store, recv func() ([]byte, error)) error {
	for {
		msg, err := recv()
		if err != nil {
			return err
		}
		in, err := DecodeInputs(msg)
		if err != nil {
			return err
		}
		if err := m.Forward(ws, store, in); err != nil {
			return err
		}
	}
}

// SplitsInto says whether a model of c splits into tp tensor-parallel
// ranks: tp must divide the query heads and the FFN units, and divide or
// be a multiple of the key-value heads.
func (c Config) SplitsInto(tp int) error {
	if tp < 1 || c.Heads%tp != 0 || (c.KVHeads%tp != 0 && tp%c.KVHeads != 0) || c.HiddenDim%tp != 0 {
		return fmt.Errorf("model: %s does not split %d ways (%d heads, %d key-value heads, hidden %d)", c.Name, tp, c.Heads, c.KVHeads, c.HiddenDim)
	}
	return nil
}
