package model

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/cpu"

	"github.com/lifeline-llm/lifeline/decode/matmul"
)

// Shard returns rank's part of m for a tensor-parallel group of tp ranks:
// its Heads/tp query heads and KVHeads/tp key-value heads (rows of Wq, Wk,
// Wv, the matching columns of Wo) and its HiddenDim/tp FFN units (rows of
// W1 and W3, columns of W2); the embedding, the norms and the classifier
// are whole. reduce must sum a slice over the group's ranks in a fixed
// rank order (collective.Group.AllReduce): it is called twice per layer,
// on the attention's and the FFN's partial outputs, and every rank then
// holds the same residual stream, so every rank computes the same logits.
// The rank's KV blocks hold its own heads only (KVLayout).
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
	case c.Heads%tp != 0 || c.KVHeads%tp != 0 || c.HiddenDim%tp != 0:
		return nil, fmt.Errorf("model: %s does not split %d ways (%d heads, %d key-value heads, hidden %d)", c.Name, tp, c.Heads, c.KVHeads, c.HiddenDim)
	case tp > 1 && reduce == nil:
		return nil, fmt.Errorf("model: tp %d needs an all-reduce", tp)
	}
	s := *m
	s.tp, s.rank, s.reduce = tp, rank, reduce
	s.Revision = fmt.Sprintf("%s/tp%d.%d", m.Revision, tp, rank)
	dim, qd, kvd, hl := c.Dim, s.qDim(), s.kvDim(), s.hidden()
	s.W.Layers = make([]Layer, len(m.W.Layers))
	for i, l := range m.W.Layers {
		s.W.Layers[i] = Layer{
			AttnNorm: l.AttnNorm, FFNNorm: l.FFNNorm,
			Wq: l.Wq[rank*qd*dim : (rank+1)*qd*dim],
			Wk: l.Wk[rank*kvd*dim : (rank+1)*kvd*dim],
			Wv: l.Wv[rank*kvd*dim : (rank+1)*kvd*dim],
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
