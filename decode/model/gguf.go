package model

import (
	"errors"
	"fmt"
	"github.com/lifeline-llm/lifeline/decode/matmul"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/lifeline-llm/lifeline/decode/gguf"
)

// ErrUnsupportedGGUF: a GGUF file the reference engine does not compute
// (yet): another architecture, weight type or position encoding. The
// llama.cpp engine may serve it.
var ErrUnsupportedGGUF = errors.New("model: GGUF not supported by the reference engine")

// LoadGGUF maps a llama or qwen2 GGUF file with F32 weights read-only
// and computes on its weights in place: rotary embeddings in the layout
// llama.cpp gives the architecture (llama: adjacent pairs, as llama2.c;
// qwen2: NeoX halves), qwen2's query, key and value biases, RMS-norm
// epsilon and RoPE base from the file, the classifier tied to the
// embedding when output.weight is absent. Anything else is
// ErrUnsupportedGGUF, naming what.
func LoadGGUF(path string) (*Model, error) { return LoadGGUFCached(path, RevisionCache{}) }

// LoadGGUFCached is LoadGGUF with the revision taken from rc when the
// file was hashed before (the hash pass then runs in Model.Verify), else
// computed and kept there.
func LoadGGUFCached(path string, rc RevisionCache) (*Model, error) {
	gf, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	tensors := map[string]gguf.Tensor{}
	for _, t := range gf.Tensors {
		tensors[t.Name] = t
	}
	c, err := ggufConfig(gf, tensors)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if cpu.IsBigEndian || gf.Size > math.MaxInt {
		return nil, fmt.Errorf("%w: %s: a little-endian 64-bit host maps GGUF files", ErrUnsupportedGGUF, path)
	}
	data, err := mapFile(f, int(gf.Size), true)
	if err != nil {
		return nil, err
	}
	key := ""
	if st, err := f.Stat(); err == nil && fileIdentity(st) != "" {
		key = "gguf;" + fileIdentity(st)
	}
	w, err := ggufWeights(&c, data[gf.DataOffset:], tensors)
	if err == nil {
		var m *Model
		if m, err = newCached(c, w, rc, key); err == nil {
			return m, nil
		}
	}
	unmapFile(data)
	return nil, fmt.Errorf("%s: %w", path, err)
}

// CheckGGUF says whether LoadGGUF would compute gf's model, and its
// shape, from its header alone: the architecture, shape and every tensor's type and
// place (not the weights' values, which LoadGGUF hashes and checks).
func CheckGGUF(gf *gguf.File) (Config, error) {
	tensors := map[string]gguf.Tensor{}
	for _, t := range gf.Tensors {
		tensors[t.Name] = t
	}
	c, err := ggufConfig(gf, tensors)
	if err == nil {
		_, err = ggufWeights(&c, nil, tensors)
	}
	if err != nil {
		return c, fmt.Errorf("%s: %w", gf.Path, err)
	}
	return c, nil
}

// ggufConfig is the shape a llama GGUF's metadata states.
func ggufConfig(gf *gguf.File, tensors map[string]gguf.Tensor) (Config, error) {
	arch := gf.Architecture()
	if arch != "llama" && arch != "qwen2" {
		return Config{}, fmt.Errorf("%w: architecture %q (the reference engine computes llama and qwen2; serve it with the llama.cpp engine)", ErrUnsupportedGGUF, arch)
	}
	num := func(key string, def uint64) int {
		v, ok := gf.Uint(arch + "." + key)
		if !ok {
			v = def
		}
		return int(min(v, math.MaxInt32))
	}
	fl := func(key string, def float64) float64 {
		v, _ := gf.Get(arch + "." + key)
		switch x := v.(type) {
		case float32:
			return float64(x)
		case float64:
			return x
		}
		return def
	}
	if s, ok := gf.String(arch + ".rope.scaling.type"); ok && s != "none" {
		return Config{}, fmt.Errorf("%w: RoPE scaling %q", ErrUnsupportedGGUF, s)
	}
	emb := tensors["token_embd.weight"].Dims
	if len(emb) != 2 {
		return Config{}, fmt.Errorf("%w: no 2-D token_embd.weight", ErrUnsupportedGGUF)
	}
	c := Config{Name: filepath.Base(gf.Path), Dim: num("embedding_length", 0), HiddenDim: num("feed_forward_length", 0), Layers: num("block_count", 0),
		Heads: num("attention.head_count", 0), VocabSize: int(min(emb[1], math.MaxInt32)), ContextLen: num("context_length", 2048),
		RopeTheta: fl("rope.freq_base", 10000), NormEps: float32(fl("attention.layer_norm_rms_epsilon", 1e-5))}
	c.KVHeads = num("attention.head_count_kv", uint64(c.Heads))
	c.RopeNeox = arch == "qwen2"
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	if d := num("rope.dimension_count", uint64(c.HeadSize())); d != c.HeadSize() {
		return Config{}, fmt.Errorf("%w: RoPE over %d of a head's %d dimensions", ErrUnsupportedGGUF, d, c.HeadSize())
	}
	return c, nil
}

// ggufTypes are the GGUF tensor types of the matrices the engine
// computes on in place.
var ggufTypes = map[gguf.TensorType]matmul.Type{gguf.F32: matmul.F32, gguf.F16: matmul.F16, gguf.BF16: matmul.BF16, gguf.Q8_0: matmul.Q8_0}

// ggufWeights are c's weights over body, the file's data section (nil:
// only the directory is checked): matrices F32, F16, BF16 or Q8_0 used in
// place, vectors F32, each of the shape c says (ggml's dims: row length
// first).
func ggufWeights(cp *Config, body []byte, tensors map[string]gguf.Tensor) (*Weights, error) {
	c := *cp
	r := &ggufTensors{body: body, tensors: tensors, used: map[string]bool{}}
	if _, ok := tensors["rope_freqs.weight"]; ok { // Llama 3.1's RoPE frequency scaling
		f, err := r.take("rope_freqs.weight", 1, c.HeadSize()/2, false)
		if err != nil {
			return nil, err
		}
		cp.RopeFreqFactors = slices.Clone(f.F32)
	}
	names := ggufNames
	if _, ok := tensors["output.weight"]; !ok {
		names.classifier = ""
	}
	if !c.RopeNeox { // llama: no biases (qwen2 has them)
		names.bq, names.bk, names.bv = "", "", ""
	}
	w, err := assembleWeights(c, r, names)
	if err != nil {
		return nil, err
	}
	if name := unplaced(slices.Sorted(maps.Keys(tensors)), r.used); name != "" {
		// Biases, another architecture's tensors…: computing without them
		// would be another model.
		return nil, fmt.Errorf("%w: tensor %s has no place in the reference engine's llama", ErrUnsupportedGGUF, name)
	}
	return w, nil
}

// ggufNames are llama.cpp's tensor names.
var ggufNames = tensorNames{embedding: "token_embd.weight", finalNorm: "output_norm.weight", classifier: "output.weight",
	layer: func(i int) string { return fmt.Sprintf("blk.%d.", i) }, attnNorm: "attn_norm.weight", q: "attn_q.weight", k: "attn_k.weight",
	v: "attn_v.weight", o: "attn_output.weight", ffnNorm: "ffn_norm.weight", gate: "ffn_gate.weight", down: "ffn_down.weight", up: "ffn_up.weight",
	bq: "attn_q.bias", bk: "attn_k.bias", bv: "attn_v.bias"}

// ggufTensors hands out a file's tensors over its data section body
// (nil: only the directory is checked), noting which were used.
type ggufTensors struct {
	body    []byte
	tensors map[string]gguf.Tensor
	used    map[string]bool
}

// take is tensor name as rows×cols values: F32, or for a matrix F16,
// BF16 or Q8_0, in place.
func (r *ggufTensors) take(name string, rows, cols int, matrix bool) (matmul.Matrix, error) {
	t, ok := r.tensors[name]
	r.used[name] = true
	mt, known := ggufTypes[t.Type]
	switch {
	case !ok:
		return matmul.Matrix{}, fmt.Errorf("%w: tensor %s missing", ErrUnsupportedGGUF, name)
	case !known || (!matrix && mt != matmul.F32) || (mt == matmul.Q8_0 && cols%32 != 0):
		return matmul.Matrix{}, fmt.Errorf("%w: tensor %s is %s (the reference engine reads F32, and F16, BF16 or Q8_0 matrices)", ErrUnsupportedGGUF, name, t.Type)
	case !sameDims(t.Dims, cols, rows):
		return matmul.Matrix{}, fmt.Errorf("%w: tensor %s is %v, want [%d %d]", ErrUnsupportedGGUF, name, t.Dims, cols, rows)
	}
	size := uint64(rows * mt.RowBytes(cols))
	if r.body == nil {
		return matmul.Matrix{Type: mt}, nil // CheckGGUF: the directory only
	}
	if t.Offset+size > uint64(len(r.body)) || (uintptr(unsafe.Pointer(unsafe.SliceData(r.body)))+uintptr(t.Offset))%4 != 0 {
		return matmul.Matrix{}, fmt.Errorf("%w: tensor %s lies outside the file or unaligned", ErrUnsupportedGGUF, name)
	}
	raw := r.body[t.Offset : t.Offset+size : t.Offset+size]
	if mt == matmul.F32 {
		return matmul.Of(unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), rows*cols)), nil
	}
	return matmul.Matrix{Type: mt, Raw: raw}, nil
}

// sameDims says whether ggml dims d are [cols rows], or [cols] for a
// vector (rows 1).
func sameDims(d []uint64, cols, rows int) bool {
	if rows == 1 && len(d) == 1 {
		return d[0] == uint64(cols)
	}
	return len(d) == 2 && d[0] == uint64(cols) && d[1] == uint64(rows)
}
