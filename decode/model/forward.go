package model

import (
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/matmul"
)

// ErrBadInput is wrapped by errors about a Forward input.
var ErrBadInput = errors.New("model: bad forward input")

// Model is a loaded, immutable model. Forward may be called concurrently
// with distinct workspaces and disjoint KV blocks.
type Model struct {
	Config   Config
	W        Weights
	Revision string
	// unverified is set when Revision came from a RevisionCache.
	unverified *unverified
	ropeCos    []float32 // ContextLen × HeadSize/2
	ropeSin    []float32
	// tp, rank and reduce make the model one rank of a tensor-parallel
	// group (Shard): W.Layers hold the rank's heads and FFN columns, and
	// reduce sums a layer's partial output over the ranks. tp 0 or 1:
	// the whole model.
	tp, rank int
	reduce   func([]float32) error
	// lead, on rank 0 of a group, hands every Forward's inputs to the
	// other ranks before computing them (Lead).
	lead func([]Input) error
}

// TP is the model's tensor-parallel degree (1 for a whole model) and
// Rank its rank.
func (m *Model) TP() int {
	if m.tp < 1 {
		return 1
	}
	return m.tp
}
func (m *Model) Rank() int { return m.rank }

// Local widths: a rank holds heads/tp query and key-value heads and
// hidden/tp FFN units.
func (m *Model) heads() int { return m.Config.Heads / m.TP() }
func (m *Model) qDim() int  { return m.heads() * m.Config.HeadSize() }
func (m *Model) kvDim() int { return m.kvHeads() * m.Config.HeadSize() }

// kvHeads are a rank's key-value heads: KVHeads/tp, or the one its query
// heads share when there are more ranks than key-value heads (each then
// held by tp/KVHeads ranks, computed by each).
func (m *Model) kvHeads() int { return max(m.Config.KVHeads/m.TP(), 1) }

// kvStart is the first key-value head of the rank.
func (m *Model) kvStart() int { return m.rank * m.heads() / (m.Config.Heads / m.Config.KVHeads) }

// kvBase is where the rank's key-value heads sit in a position's row of a
// block: a group's blocks hold every head, each rank writes and reads its
// own (a rank never reads another's within a step: there is no barrier
// between a layer's KV write and its attention).
func (m *Model) kvBase() int { return m.kvStart() * m.Config.HeadSize() }
func (m *Model) hidden() int { return m.Config.HiddenDim / m.TP() }

// New checks the weights against the config and prepares the model.
func New(c Config, w *Weights) (*Model, error) { return newModel(c, w, "") }

// newModel is New; a known revision (cached for the weights' file) skips
// the hash pass, which Verify runs later.
func newModel(c Config, w *Weights, known string) (*Model, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := w.check(c); err != nil {
		return nil, err
	}
	rev := known
	if rev == "" {
		var err error
		if rev, err = revision(c, w); err != nil {
			return nil, err
		}
	}
	m := &Model{Config: c, W: *w, Revision: rev}
	half := c.HeadSize() / 2
	m.ropeCos = make([]float32, c.ContextLen*half)
	m.ropeSin = make([]float32, c.ContextLen*half)
	for pos := 0; pos < c.ContextLen; pos++ {
		for i := 0; i < half; i++ {
			freq := 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(c.HeadSize()))
			if c.RopeFreqFactors != nil {
				freq /= float64(c.RopeFreqFactors[i])
			}
			s, co := math.Sincos(float64(pos) * freq)
			m.ropeCos[pos*half+i] = float32(co)
			m.ropeSin[pos*half+i] = float32(s)
		}
	}
	return m, nil
}

// KVLayout is the layout of this model's KV blocks with the given block size.
func (m *Model) KVLayout(blockSize int) kvcache.Layout {
	return kvcache.NewLayout(m.Config.Layers, m.Config.KVDim(), blockSize)
}

// Input is one token position to compute.
type Input struct {
	Token int
	Pos   int
	// Blocks is the block table of the token's sequence: position p lives in
	// Blocks[p/BlockSize] at slot p%BlockSize. Positions before Pos must
	// already be written, or be inputs of the same call.
	Blocks []kvcache.BlockID
	// Seq is the slot of the token's sequence, for an engine that keeps
	// K/V per sequence itself (decode/sched.Engine); this model uses
	// Blocks.
	Seq int
	// Logits, when non-nil, receives this position's VocabSize logits.
	Logits []float32
}

// Workspace holds the activations of one Forward call; reuse it across
// calls to avoid allocation. The zero value is ready.
type Workspace struct {
	x, xb, q, k, v, att, hb, hb2, logitsIn, logitsOut []float32
	scores                                            [][]float32
	// attentionParts is how many parts the last layer's attention was
	// split into (tests look); groups are where its groups of inputs start.
	attentionParts int
	groups         []int
}

func grow(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// Forward computes the inputs of one batch: it writes each position's keys
// and values into its KV block and fills the requested logits.
func (m *Model) Forward(ws *Workspace, store kvcache.Store, in []Input) error {
	layout := store.Layout()
	if err := m.checkInputs(layout, in); err != nil {
		return err
	}
	if len(in) == 0 {
		return nil
	}
	if m.lead != nil {
		if err := m.lead(in); err != nil {
			return err
		}
	}
	ws.reserve(m, len(in))
	dim := m.Config.Dim
	for t, inp := range in {
		m.W.embedding(ws.x[t*dim:(t+1)*dim], inp.Token, dim)
	}
	for l := range m.W.Layers {
		if err := m.attentionBlock(ws, store, layout, in, l); err != nil {
			return err
		}
		if err := m.feedForward(ws, l, len(in)); err != nil {
			return err
		}
	}
	m.outputHead(ws, in)
	return nil
}

// sum adds a layer's partial output over the group's ranks (nothing to do
// for a whole model).
func (m *Model) sum(part []float32) error {
	if m.reduce == nil {
		return nil
	}
	return m.reduce(part)
}

// checkInputs rejects a store of another layout and any input outside the
// model's vocabulary, context or the input's block table.
func (m *Model) checkInputs(layout kvcache.Layout, in []Input) error {
	c := m.Config
	if layout != m.KVLayout(layout.BlockSize) {
		return fmt.Errorf("%w: store layout %s does not match model layout %s", ErrBadInput, layout, m.KVLayout(layout.BlockSize))
	}
	bs := layout.BlockSize
	for i, t := range in {
		switch {
		case t.Token < 0 || t.Token >= c.VocabSize:
			return fmt.Errorf("%w: input %d: token %d outside vocabulary of %d", ErrBadInput, i, t.Token, c.VocabSize)
		case t.Pos < 0 || t.Pos >= c.ContextLen:
			return fmt.Errorf("%w: input %d: position %d outside context of %d", ErrBadInput, i, t.Pos, c.ContextLen)
		case t.Pos/bs >= len(t.Blocks):
			return fmt.Errorf("%w: input %d: position %d has no block (table has %d)", ErrBadInput, i, t.Pos, len(t.Blocks))
		case t.Logits != nil && len(t.Logits) != c.VocabSize:
			return fmt.Errorf("%w: input %d: logits buffer of %d, want %d", ErrBadInput, i, len(t.Logits), c.VocabSize)
		}
	}
	return nil
}

// reserve sizes the per-layer activations of m for T positions.
func (ws *Workspace) reserve(m *Model, T int) {
	dim, qDim, kvDim, hidden := m.Config.Dim, m.qDim(), m.kvDim(), m.hidden()
	ws.x = grow(ws.x, T*dim)
	ws.xb = grow(ws.xb, T*dim)
	ws.q = grow(ws.q, T*qDim)
	ws.k = grow(ws.k, T*kvDim)
	ws.v = grow(ws.v, T*kvDim)
	ws.att = grow(ws.att, T*qDim)
	ws.hb = grow(ws.hb, T*hidden)
	ws.hb2 = grow(ws.hb2, T*hidden)
}

// attentionBlock is the attention half of layer l: it writes every input's
// rotated key and value into its KV block, then adds the attention output
// to the residual stream ws.x.
func (m *Model) attentionBlock(ws *Workspace, store kvcache.Store, layout kvcache.Layout, in []Input, l int) error {
	c := m.Config
	lw := &m.W.Layers[l]
	T, dim, qDim, kvDim, bs := len(in), c.Dim, m.qDim(), m.kvDim(), layout.BlockSize
	x, xb := ws.x, ws.xb
	for t := 0; t < T; t++ {
		rmsnorm(xb[t*dim:(t+1)*dim], x[t*dim:(t+1)*dim], lw.AttnNorm, c.NormEps)
	}
	mats := lw.matrices()
	matmul.MatMuls(xb[:T*dim], T, dim,
		matmul.Product{Out: ws.q, Typed: mats.Wq, M: qDim},
		matmul.Product{Out: ws.k, Typed: mats.Wk, M: kvDim},
		matmul.Product{Out: ws.v, Typed: mats.Wv, M: kvDim})
	if lw.Bq != nil {
		for t := range T {
			addInto(ws.q[t*qDim:(t+1)*qDim], lw.Bq)
			addInto(ws.k[t*kvDim:(t+1)*kvDim], lw.Bk)
			addInto(ws.v[t*kvDim:(t+1)*kvDim], lw.Bv)
		}
	}
	for t, inp := range in {
		m.rope(ws.q[t*qDim:(t+1)*qDim], inp.Pos)
		m.rope(ws.k[t*kvDim:(t+1)*kvDim], inp.Pos)
		blk := store.Block(inp.Blocks[inp.Pos/bs])
		slot := inp.Pos % bs
		// Each rank writes (and then reads) its own heads' part; the ranks
		// of a replicated head write the same bits.
		base := m.kvBase()
		copy(blk[layout.KeyOffset(l, slot)+base:][:kvDim], ws.k[t*kvDim:(t+1)*kvDim])
		copy(blk[layout.ValueOffset(l, slot)+base:][:kvDim], ws.v[t*kvDim:(t+1)*kvDim])
	}
	m.attention(ws, store, in, l)
	matmul.MatMulOf(xb, ws.att, T, mats.Wo, dim, qDim)
	if err := m.sum(xb[:T*dim]); err != nil {
		return err
	}
	addInto(x, xb)
	return nil
}

// feedForward is the SwiGLU half of layer l over T positions; it adds its
// output to the residual stream ws.x.
func (m *Model) feedForward(ws *Workspace, l, T int) error {
	c := m.Config
	lw := &m.W.Layers[l]
	dim, hidden := c.Dim, m.hidden()
	x, xb := ws.x, ws.xb
	for t := 0; t < T; t++ {
		rmsnorm(xb[t*dim:(t+1)*dim], x[t*dim:(t+1)*dim], lw.FFNNorm, c.NormEps)
	}
	hb, hb2 := ws.hb[:T*hidden], ws.hb2[:T*hidden]
	mats := lw.matrices()
	matmul.MatMuls(xb[:T*dim], T, dim,
		matmul.Product{Out: hb, Typed: mats.W1, M: hidden},
		matmul.Product{Out: hb2, Typed: mats.W3, M: hidden, Then: func(r0, r1 int) {
			// The gate of rows the same goroutine just computed of both.
			for t := 0; t < T; t++ {
				swiglu(hb[t*hidden+r0:t*hidden+r1], hb2[t*hidden+r0:t*hidden+r1])
			}
		}})
	matmul.MatMulOf(xb, ws.hb, T, mats.W2, dim, hidden)
	if err := m.sum(xb[:T*dim]); err != nil {
		return err
	}
	addInto(x, xb)
	return nil
}

// outputHead fills the logits of the inputs that asked for them. It is the
// widest product, so it runs only on those rows.
func (m *Model) outputHead(ws *Workspace, in []Input) {
	c := m.Config
	dim := c.Dim
	nl := 0
	for _, inp := range in {
		if inp.Logits != nil {
			nl++
		}
	}
	if nl == 0 {
		return
	}
	ws.logitsIn = grow(ws.logitsIn, nl*dim)
	ws.logitsOut = grow(ws.logitsOut, nl*c.VocabSize)
	j := 0
	for t, inp := range in {
		if inp.Logits != nil {
			rmsnorm(ws.logitsIn[j*dim:(j+1)*dim], ws.x[t*dim:(t+1)*dim], m.W.FinalNorm, c.NormEps)
			j++
		}
	}
	matmul.MatMulOf(ws.logitsOut, ws.logitsIn, nl, m.W.classifier(), c.VocabSize, dim)
	j = 0
	for _, inp := range in {
		if inp.Logits == nil {
			continue
		}
		copy(inp.Logits, ws.logitsOut[j*c.VocabSize:(j+1)*c.VocabSize])
		if m.W.OutputBias != nil {
			addInto(inp.Logits, m.W.OutputBias)
		}
		j++
	}
}

// swiglu sets a[i] = silu(a[i]) * b[i].
func swiglu(a, b []float32) { matmul.SiLUMul(a, b) }

func addInto(dst, src []float32) {
	for i := range dst {
		dst[i] += src[i]
	}
}

// rmsnorm follows llama2.c: a sequential float32 sum of squares.
func rmsnorm(out, x, weight []float32, eps float32) {
	var ss float32
	for _, v := range x {
		ss += float32(v * v)
	}
	ss = ss/float32(len(x)) + eps
	inv := float32(1 / math.Sqrt(float64(ss)))
	for i, v := range x {
		out[i] = weight[i] * float32(inv*v)
	}
}

// rope rotates each head's (2i, 2i+1) pairs — or (i, i+HeadSize/2)
// with Config.RopeNeox — by pos·θ^(-2i/HeadSize).
func (m *Model) rope(vec []float32, pos int) {
	hs := m.Config.HeadSize()
	half := hs / 2
	cos := m.ropeCos[pos*half : (pos+1)*half]
	sin := m.ropeSin[pos*half : (pos+1)*half]
	if m.Config.RopeNeox {
		for h := 0; h < len(vec); h += hs {
			v := vec[h : h+hs]
			for i := 0; i < half; i++ {
				a, b := v[i], v[i+half]
				v[i] = float32(a*cos[i]) - float32(b*sin[i])
				v[i+half] = float32(a*sin[i]) + float32(b*cos[i])
			}
		}
		return
	}
	for h := 0; h < len(vec); h += hs {
		v := vec[h : h+hs]
		for i := 0; i < half; i++ {
			a, b := v[2*i], v[2*i+1]
			v[2*i] = float32(a*cos[i]) - float32(b*sin[i])
			v[2*i+1] = float32(a*sin[i]) + float32(b*cos[i])
		}
	}
}

// minParallelAttention is the number of attended positions in a batch below
// which attention runs on one goroutine.
const minParallelAttention = 256

// attentionPartsPerWorker is how many parts a parallel attention is split
// into per goroutine that may run it, so that a goroutine that falls behind
// holds up one part, not a share.
const attentionPartsPerWorker = 4

// attentionGroup is how many consecutive inputs of one sequence (a
// prefill's) share one read of each key row.
const attentionGroup = 8

// attention computes ws.att for every input of layer l. The unit of work is
// one head of a group of inputs: consecutive inputs of one sequence (a
// prefill's, up to attentionGroup) take their scores against each key row
// in one strided product, and each input of a decode batch is a group of its
// own. A unit is computed by one goroutine with the same operation order
// whatever the split and the grouping, so a batch of one (decode at a long
// context) spreads its heads over the helpers instead of running them all
// on the caller while the helpers wait: `small` at ~1,900 positions of
// context decodes 195 -> 269 tokens/s on two vCPUs (medians of five
// interleaved rounds). Grouping a prefill's inputs took `small`'s
// 2,000-token prefill from ~1,990 to ~2,700 tokens/s (scores from tiles
// 2,370, values a block at a time 2,640-2,800; medians of three, runs
// interleaved): one input at a time, attention was 59 % of its CPU, each
// input reading every key and value row of its context again.
func (m *Model) attention(ws *Workspace, store kvcache.Store, in []Input, l int) {
	work := 0
	ws.groups = ws.groups[:0]
	for t, inp := range in {
		work += inp.Pos + 1
		if g := len(ws.groups) - 1; g >= 0 && t-ws.groups[g] < attentionGroup && sameTable(in[ws.groups[g]].Blocks, inp.Blocks) {
			continue
		}
		ws.groups = append(ws.groups, t)
	}
	groups := len(ws.groups)
	heads := m.heads()
	units := groups * heads
	parts := 1
	if workers := runtime.GOMAXPROCS(0); work >= minParallelAttention && workers > 1 {
		parts = min(units, attentionPartsPerWorker*workers)
	}
	for len(ws.scores) < parts {
		ws.scores = append(ws.scores, nil)
	}
	ws.attentionParts = parts
	per := (units + parts - 1) / parts
	matmul.Parallel((units+per-1)/per, func(w int) {
		for u := w * per; u < min((w+1)*per, units); u++ {
			// The last groups (the longest contexts) first, so that the
			// parts taken last are the short ones.
			g, h := groups-1-u/heads, u%heads
			t0, t1 := ws.groups[g], len(in)
			if g+1 < groups {
				t1 = ws.groups[g+1]
			}
			ws.scores[w] = m.attendGroup(ws, ws.scores[w], store, in, t0, t1, l, h)
		}
	})
}

// sameTable reports whether two inputs have the same block table: the same
// sequence.
func sameTable(a, b []kvcache.BlockID) bool {
	return len(a) == len(b) && len(a) > 0 && &a[0] == &b[0]
}

// attendGroup sets head h's attention output of the inputs in[t0:t1], one
// sequence's, from their rotated queries. Their scores against a block's
// keys come from one strided product, each key row read once for the group
// rather than once per input (a key past an input's position is scored and
// not used); then each input's softmax, and the weighted sums of values a
// block at a time. Every score is Dot of a query and a key row and every
// input adds its value rows in position order, so an input's output has the
// same bits in any group, one of its own included.
func (m *Model) attendGroup(ws *Workspace, scores []float32, store kvcache.Store, in []Input, t0, t1, l, h int) []float32 {
	c := m.Config
	layout := store.Layout()
	bs := layout.BlockSize
	hs, kvDim, qd := c.HeadSize(), layout.KVDim, m.qDim()
	kvOff := m.kvBase() + (h/(c.Heads/c.KVHeads))*hs
	nmax := 0
	for _, inp := range in[t0:t1] {
		nmax = max(nmax, inp.Pos+1)
	}
	G := t1 - t0
	scores = grow(scores, G*nmax)
	blocks := in[t0].Blocks
	for b := 0; b*bs < nmax; b++ {
		blk := store.Block(blocks[b])
		cnt := min(bs, nmax-b*bs)
		matmul.MatMulStrided(scores[b*bs:], nmax, ws.q[t0*qd+h*hs:], qd, G, blk[layout.KeyOffset(l, 0)+kvOff:], kvDim, cnt, hs)
	}
	scale := float32(math.Sqrt(float64(hs)))
	for i := range G {
		t := t0 + i
		s := scores[i*nmax : i*nmax+in[t].Pos+1]
		maxv := matmul.DivMax(s, scale)
		sum := matmul.SoftmaxExp(s, maxv)
		matmul.DivMax(s, sum)
		clear(ws.att[t*qd+h*hs : t*qd+(h+1)*hs])
	}
	// The weighted sums a block at a time, for every input of the group in
	// turn, so that the block's value rows are read from memory once; each
	// input still adds its rows in position order.
	for b := 0; b*bs < nmax; b++ {
		v := store.Block(blocks[b])[layout.ValueOffset(l, 0)+kvOff:]
		for i := range G {
			t := t0 + i
			n := in[t].Pos + 1
			if b*bs >= n {
				continue
			}
			cnt := min(bs, n-b*bs)
			matmul.AxpyRows(ws.att[t*qd+h*hs:t*qd+(h+1)*hs], scores[i*nmax+b*bs:i*nmax+b*bs+cnt], v, kvDim)
		}
	}
	return scores
}
