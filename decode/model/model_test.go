package model

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/matmul"
)

func tinyModel(t testing.TB) *Model {
	t.Helper()
	m, err := Synthetic("tiny", 7)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// seqRunner computes one sequence position by position in its own store.
type seqRunner struct {
	m      *Model
	store  *kvcache.MemStore
	blocks []kvcache.BlockID
	ws     Workspace
}

func newSeqRunner(t testing.TB, m *Model, positions int) *seqRunner {
	t.Helper()
	store, err := kvcache.NewMemStore(m.KVLayout(kvcache.DefaultBlockSize), 64)
	if err != nil {
		t.Fatal(err)
	}
	r := &seqRunner{m: m, store: store}
	for i := 0; i*kvcache.DefaultBlockSize < positions; i++ {
		id, err := store.Alloc()
		if err != nil {
			t.Fatal(err)
		}
		r.blocks = append(r.blocks, id)
	}
	return r
}

// run computes tokens[from:to] in one call and returns the logits of each.
func (r *seqRunner) run(t testing.TB, tokens []int, from, to int) [][]float32 {
	t.Helper()
	var in []Input
	var out [][]float32
	for p := from; p < to; p++ {
		l := make([]float32, r.m.Config.VocabSize)
		in = append(in, Input{Token: tokens[p], Pos: p, Blocks: r.blocks, Logits: l})
		out = append(out, l)
	}
	if err := r.m.Forward(&r.ws, r.store, in); err != nil {
		t.Fatal(err)
	}
	return out
}

func testTokens(n int, salt int) []int {
	toks := make([]int, n)
	for i := range toks {
		toks[i] = 300 + (i*37+salt*101)%2000
	}
	return toks
}

func sameBits(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// TestCachedDecodeEqualsRecompute checks, at every position, that logits
// from token-by-token decoding against the KV cache, from one prefill of
// the whole sequence, from chunked prefill, and from recomputing the whole
// prefix from scratch are bit-identical.
func TestCachedDecodeEqualsRecompute(t *testing.T) {
	for _, kernel := range []string{"active", "generic"} {
		t.Run(kernel, func(t *testing.T) {
			if kernel == "generic" {
				defer matmul.UseGeneric()()
			}
			m := tinyModel(t)
			const n = 53 // crosses three block boundaries
			toks := testTokens(n, 1)
			prefill := newSeqRunner(t, m, n).run(t, toks, 0, n)
			dec := newSeqRunner(t, m, n)
			chunked := newSeqRunner(t, m, n)
			var chunkLogits [][]float32
			for from := 0; from < n; from += 7 {
				chunkLogits = append(chunkLogits, chunked.run(t, toks, from, min(from+7, n))...)
			}
			for p := 0; p < n; p++ {
				step := dec.run(t, toks, p, p+1)[0]
				recompute := newSeqRunner(t, m, p+1).run(t, toks, 0, p+1)[p]
				for name, got := range map[string][]float32{"prefill": prefill[p], "chunked": chunkLogits[p], "recompute": recompute} {
					if i := sameBits(step, got); i >= 0 {
						t.Fatalf("position %d: decode and %s logits differ at %d: %v vs %v", p, name, i, step[i], got[i])
					}
				}
			}
			// The K/V bytes themselves are equal too.
			prefillBlocks := newSeqRunnerBlocks(t, m, toks)
			for i, id := range dec.blocks {
				if j := sameBits(dec.store.Block(id), prefillBlocks[i]); j >= 0 {
					t.Fatalf("block %d: decode and prefill K/V differ at float %d", i, j)
				}
			}
		})
	}
}

func newSeqRunnerBlocks(t *testing.T, m *Model, toks []int) [][]float32 {
	r := newSeqRunner(t, m, len(toks))
	r.run(t, toks, 0, len(toks))
	var out [][]float32
	for _, id := range r.blocks {
		out = append(out, r.store.Block(id))
	}
	return out
}

// TestBatchInvariance computes one sequence alone and inside a batch with
// other sequences of different lengths and phases.
func TestBatchInvariance(t *testing.T) {
	m := tinyModel(t)
	const n = 40
	toks := testTokens(n, 2)
	alone := newSeqRunner(t, m, n).run(t, toks, 0, n)

	store, _ := kvcache.NewMemStore(m.KVLayout(kvcache.DefaultBlockSize), 256)
	alloc := func(positions int) []kvcache.BlockID {
		var ids []kvcache.BlockID
		for i := 0; i*kvcache.DefaultBlockSize < positions; i++ {
			id, err := store.Alloc()
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	target := alloc(n)
	others := make([][]kvcache.BlockID, 31)
	otherToks := make([][]int, 31)
	for i := range others {
		otherToks[i] = testTokens(5+3*i, 10+i)
		others[i] = alloc(len(otherToks[i]))
	}
	var ws Workspace
	got := make([][]float32, n)
	// Feed the target 3 tokens per step, others one or more per step.
	for p, step := 0, 0; p < n; step++ {
		var in []Input
		for i := range others {
			q := step*(1+i%3) + 0
			for k := 0; k < 1+i%3; k++ {
				if q+k < len(otherToks[i]) {
					in = append(in, Input{Token: otherToks[i][q+k], Pos: q + k, Blocks: others[i], Logits: make([]float32, m.Config.VocabSize)})
				}
			}
			if i == 15 {
				for k := 0; k < 3 && p < n; k, p = k+1, p+1 {
					got[p] = make([]float32, m.Config.VocabSize)
					in = append(in, Input{Token: toks[p], Pos: p, Blocks: target, Logits: got[p]})
				}
			}
		}
		if err := m.Forward(&ws, store, in); err != nil {
			t.Fatal(err)
		}
	}
	for p := range got {
		if i := sameBits(alone[p], got[p]); i >= 0 {
			t.Fatalf("position %d: alone and batched logits differ at %d", p, i)
		}
	}
	// The K/V the target wrote in the batch equal those it wrote alone.
	aloneBlocks := newSeqRunnerBlocks(t, m, toks)
	for i, id := range target {
		if j := sameBits(aloneBlocks[i], store.Block(id)); j >= 0 {
			t.Fatalf("block %d: alone and batched K/V differ at float %d", i, j)
		}
	}
}

// TestInvarianceWithTails repeats the decode/recompute and batch checks on a
// shape whose hidden size (172, as in llama2.c's stories260K) and head size
// (12) are not multiples of 8, so every kernel's scalar tail runs.
func TestInvarianceWithTails(t *testing.T) {
	c := Config{Name: "odd", Dim: 48, HiddenDim: 172, Layers: 2, Heads: 4, KVHeads: 2, VocabSize: 300, ContextLen: 64, RopeTheta: 10000, NormEps: 1e-5}
	m, err := Random(c, 11)
	if err != nil {
		t.Fatal(err)
	}
	const n = 37
	toks := make([]int, n)
	for i := range toks {
		toks[i] = (i*31 + 7) % c.VocabSize
	}
	prefill := newSeqRunner(t, m, n).run(t, toks, 0, n)
	dec := newSeqRunner(t, m, n)
	for p := 0; p < n; p++ {
		step := dec.run(t, toks, p, p+1)[0]
		if i := sameBits(step, prefill[p]); i >= 0 {
			t.Fatalf("position %d: decode and prefill logits differ at %d", p, i)
		}
	}
}

func TestForwardRejectsBadInput(t *testing.T) {
	m := tinyModel(t)
	r := newSeqRunner(t, m, 16)
	for name, in := range map[string]Input{
		"token":    {Token: -1, Pos: 0, Blocks: r.blocks},
		"big id":   {Token: m.Config.VocabSize, Pos: 0, Blocks: r.blocks},
		"position": {Token: 5, Pos: m.Config.ContextLen, Blocks: r.blocks},
		"no block": {Token: 5, Pos: 16, Blocks: r.blocks},
		"logits":   {Token: 5, Pos: 0, Blocks: r.blocks, Logits: make([]float32, 3)},
	} {
		if err := m.Forward(&r.ws, r.store, []Input{in}); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", name, err)
		}
	}
	other, _ := kvcache.NewMemStore(kvcache.NewLayout(3, 8, 16), 2)
	if err := m.Forward(&r.ws, other, []Input{{Token: 5, Pos: 0, Blocks: []kvcache.BlockID{0}}}); !errors.Is(err, ErrBadInput) {
		t.Errorf("mismatched layout: %v", err)
	}
}

func TestSyntheticDeterministicAndDistinct(t *testing.T) {
	a, b := tinyModel(t), tinyModel(t)
	if a.Revision != b.Revision {
		t.Fatal("same preset and seed gave different revisions")
	}
	c, _ := Synthetic("tiny", 8)
	if c.Revision == a.Revision {
		t.Fatal("different seeds share a revision")
	}
	if _, err := Synthetic("huge", 1); !errors.Is(err, ErrUnknownPreset) {
		t.Fatalf("unknown preset: %v", err)
	}
	small, err := PresetConfig("small")
	if err != nil {
		t.Fatal(err)
	}
	if p := small.Params(); p < 13e6 || p > 17e6 {
		t.Fatalf("small has %d parameters, want about 15M", p)
	}
}

func TestLlama2CRoundTrip(t *testing.T) {
	src := tinyModel(t)
	w := src.W
	w.OutputBias = nil
	for _, shared := range []bool{false, true} {
		if shared {
			w.Classifier = w.Embedding
		}
		m, err := New(src.Config, &w)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "model.bin")
		var buf bytes.Buffer
		if err := WriteLlama2C(&buf, m); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		loaded, err := LoadLlama2C(path)
		if err != nil {
			t.Fatal(err)
		}
		if loaded.Revision != m.Revision {
			t.Fatalf("shared=%v: revision %s after round trip, want %s", shared, loaded.Revision, m.Revision)
		}
		toks := testTokens(20, 3)
		a := newSeqRunner(t, m, 20).run(t, toks, 0, 20)
		b := newSeqRunner(t, loaded, 20).run(t, toks, 0, 20)
		for p := range a {
			if i := sameBits(a[p], b[p]); i >= 0 {
				t.Fatalf("shared=%v position %d: logits differ after round trip", shared, p)
			}
		}
		// Corruptions are clear errors.
		data := buf.Bytes()
		for name, bad := range map[string][]byte{
			"truncated":  data[:len(data)-4],
			"extra":      append(append([]byte{}, data...), 0, 0, 0, 0),
			"zero dim":   append([]byte{0, 0, 0, 0}, data[4:]...),
			"header":     data[:10],
			"huge layer": append(append(append([]byte{}, data[:8]...), 0xff, 0xff, 0xff, 0x7f), data[12:]...),
		} {
			if _, err := ReadLlama2C(bytes.NewReader(bad), int64(len(bad))); !errors.Is(err, ErrBadCheckpoint) {
				t.Errorf("%s: %v, want ErrBadCheckpoint", name, err)
			}
		}
	}
}

// TestLlama2CVocabSize: the header's vocabulary size, read without
// loading; a file cut short of what its header implies is refused as
// LoadLlama2C refuses it.
func TestLlama2CVocabSize(t *testing.T) {
	src := tinyModel(t)
	w := src.W
	w.OutputBias = nil
	m, err := New(src.Config, &w)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteLlama2C(&buf, m); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "model.bin")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := Llama2CVocabSize(path); err != nil || n != m.Config.VocabSize {
		t.Fatalf("Llama2CVocabSize = %d, %v; want %d", n, err, m.Config.VocabSize)
	}
	if err := os.WriteFile(path, buf.Bytes()[:buf.Len()-4], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Llama2CVocabSize(path); !errors.Is(err, ErrBadCheckpoint) {
		t.Fatalf("a cut file: %v, want ErrBadCheckpoint", err)
	}
}

// TestAttentionSplitByHead: a batch of one at a long context spreads its
// heads over the helpers, and the logits and K/V are bit for bit those of
// the same position computed on one goroutine and inside a prefill.
func TestAttentionSplitByHead(t *testing.T) {
	m := tinyModel(t)
	const n = 300 // past minParallelAttention at batch 1
	toks := testTokens(n, 3)
	decodeLast := func(procs int) ([]float32, []float32, int) {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		r := newSeqRunner(t, m, n)
		r.run(t, toks, 0, n-1)
		logits := r.run(t, toks, n-1, n)[0]
		last := r.store.Block(r.blocks[len(r.blocks)-1])
		return logits, slices.Clone(last), r.ws.attentionParts
	}
	split, splitKV, parts := decodeLast(2)
	if parts < 2 {
		t.Fatalf("batch 1 at position %d on 2 procs: attention ran in %d part(s)", n-1, parts)
	}
	serial, serialKV, parts := decodeLast(1)
	if parts != 1 {
		t.Fatalf("on 1 proc attention ran in %d parts", parts)
	}
	prefill := newSeqRunner(t, m, n).run(t, toks, 0, n)[n-1]
	for name, got := range map[string][]float32{"one goroutine": serial, "prefill": prefill} {
		if i := sameBits(split, got); i >= 0 {
			t.Fatalf("heads split over goroutines and %s: logits differ at %d: %v vs %v", name, i, split[i], got[i])
		}
	}
	if i := sameBits(splitKV, serialKV); i >= 0 {
		t.Fatalf("heads split over goroutines and one goroutine: K/V differ at float %d", i)
	}
}

// TestAttentionMatchesReference: each input's attention output, whether
// its head runs alone (a decode batch, a batch of one split over the
// helpers) or in a group (a prefill's consecutive inputs), is softmax(q·k /
// √d)·v over the positions up to its own, as a plain float64 computation
// gives it (to float32 rounding). The invariance tests compare paths with
// each other; this one pins what they all compute.
func TestAttentionMatchesReference(t *testing.T) {
	m := tinyModel(t)
	c := m.Config
	layout := m.KVLayout(kvcache.DefaultBlockSize)
	store, err := kvcache.NewMemStore(layout, 128)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	table := func(positions int) []kvcache.BlockID {
		var ids []kvcache.BlockID
		for i := 0; i*layout.BlockSize < positions; i++ {
			id, err := store.Alloc()
			if err != nil {
				t.Fatal(err)
			}
			blk := store.Block(id)
			for j := range blk {
				blk[j] = float32(r.NormFloat64())
			}
			ids = append(ids, id)
		}
		return ids
	}
	long, prefill := table(300), table(40)
	batch := []Input{{Pos: 299, Blocks: long}}
	var prefillIn, decodeIn []Input
	for p := 20; p < 40; p++ {
		prefillIn = append(prefillIn, Input{Pos: p, Blocks: prefill})
	}
	for i := range 5 {
		decodeIn = append(decodeIn, Input{Pos: 3 + 17*i, Blocks: table(4 + 17*i)})
	}
	hs, qd, group := c.HeadSize(), m.qDim(), c.Heads/c.KVHeads
	for name, in := range map[string][]Input{"batch of one at 300": batch, "prefill of 20": prefillIn, "decode batch of 5": decodeIn} {
		var ws Workspace
		ws.reserve(m, len(in))
		for i := range ws.q[:len(in)*qd] {
			ws.q[i] = float32(r.NormFloat64())
		}
		const l = 1
		m.attention(&ws, store, in, l)
		for ti, inp := range in {
			for h := 0; h < m.heads(); h++ {
				q := ws.q[ti*qd+h*hs : ti*qd+(h+1)*hs]
				kvOff := (h / group) * hs
				n := inp.Pos + 1
				w := make([]float64, n)
				maxw := math.Inf(-1)
				for p := range n {
					blk := store.Block(inp.Blocks[p/layout.BlockSize])
					k := blk[layout.KeyOffset(l, p%layout.BlockSize)+kvOff:][:hs]
					var d float64
					for i := range hs {
						d += float64(q[i]) * float64(k[i])
					}
					w[p] = d / math.Sqrt(float64(hs))
					maxw = max(maxw, w[p])
				}
				var sum float64
				for p := range w {
					w[p] = math.Exp(w[p] - maxw)
					sum += w[p]
				}
				for i := range hs {
					var want float64
					for p := range n {
						blk := store.Block(inp.Blocks[p/layout.BlockSize])
						want += w[p] / sum * float64(blk[layout.ValueOffset(l, p%layout.BlockSize)+kvOff+i])
					}
					got := float64(ws.att[ti*qd+h*hs+i])
					if math.Abs(got-want) > 1e-4*(1+math.Abs(want)) {
						t.Fatalf("%s: input %d (position %d) head %d dim %d: %v, reference %v", name, ti, inp.Pos, h, i, got, want)
					}
				}
			}
		}
	}
}
