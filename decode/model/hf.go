package model

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/lifeline-llm/lifeline/decode/matmul"
)

// ErrUnsupportedHF: a Hugging Face model directory the reference engine
// does not compute (yet), or a malformed one; the error names what.
var ErrUnsupportedHF = errors.New("model: Hugging Face checkpoint not supported by the reference engine")

// hfConfig is what config.json says that the reference engine reads.
type hfConfig struct {
	Architectures []string        `json:"architectures"`
	ModelType     string          `json:"model_type"`
	Hidden        int             `json:"hidden_size"`
	Intermediate  int             `json:"intermediate_size"`
	Layers        int             `json:"num_hidden_layers"`
	Heads         int             `json:"num_attention_heads"`
	KVHeads       int             `json:"num_key_value_heads"`
	Vocab         int             `json:"vocab_size"`
	MaxPositions  int             `json:"max_position_embeddings"`
	RopeTheta     float64         `json:"rope_theta"`
	NormEps       float64         `json:"rms_norm_eps"`
	TieEmbeddings bool            `json:"tie_word_embeddings"`
	RopeScaling   json.RawMessage `json:"rope_scaling"`
	HeadDim       int             `json:"head_dim"`
	SlidingWindow json.RawMessage `json:"use_sliding_window"`
	Window        int             `json:"sliding_window"`
}

// hfRopeScaling is config.json's rope_scaling of type llama3.
type hfRopeScaling struct {
	RopeType       string  `json:"rope_type"`
	Type           string  `json:"type"`
	Factor         float64 `json:"factor"`
	LowFreqFactor  float64 `json:"low_freq_factor"`
	HighFreqFactor float64 `json:"high_freq_factor"`
	OriginalMax    float64 `json:"original_max_position_embeddings"`
}

func (r hfRopeScaling) factors(theta float64, headSize int) ([]float32, error) {
	if cmp.Or(r.RopeType, r.Type) != "llama3" {
		return nil, fmt.Errorf("%w: rope_scaling of type %q (llama3's is computed)", ErrUnsupportedHF, cmp.Or(r.RopeType, r.Type))
	}
	// The converter's defaults for what config.json leaves out.
	factor, low, high, orig := cmp.Or(r.Factor, 8), cmp.Or(r.LowFreqFactor, 1), cmp.Or(r.HighFreqFactor, 4), cmp.Or(r.OriginalMax, 8192)
	if !(factor > 0 && low > 0 && high > low && orig > 0) {
		return nil, fmt.Errorf("%w: rope_scaling %+v", ErrUnsupportedHF, r)
	}
	return Llama3RopeFactors(theta, headSize, factor, low, high, orig), nil
}

// Llama3RopeFactors are Llama 3's per-pair frequency divisors as
// llama.cpp's converter computes them into a GGUF's rope_freqs from
// rope_scaling — long wavelengths slowed by factor, short ones kept, the
// band between interpolated — step by step in float32 as its torch code
// does, so that a directory and its converted GGUF rotate alike.
func Llama3RopeFactors(theta float64, headSize int, factor, low, high, originalMax float64) []float32 {
	lowWave, highWave := float32(originalMax/low), float32(originalMax/high)
	out := make([]float32, headSize/2)
	for i := range out {
		e := float32(2*i) / float32(headSize)
		freq := 1 / float32(math.Pow(float64(float32(theta)), float64(e)))
		wave := float32(2*math.Pi) / freq
		switch {
		case wave < highWave:
			out[i] = 1
		case wave > lowWave:
			out[i] = float32(factor)
		default:
			smooth := (float32(originalMax)/wave - float32(low)) / float32(high-low)
			out[i] = 1 / ((1-smooth)/float32(factor) + smooth)
		}
	}
	return out
}

// LoadHF maps a Hugging Face model directory — config.json and
// model.safetensors, or the shards model.safetensors.index.json names —
// of a llama or qwen2 model with F32 weights read-only, and computes on
// them in place. Hugging Face keeps the query and key rows in the
// rotate-half layout: the model rotates NeoX halves (Config.RopeNeox),
// as llama.cpp's converter would otherwise permute them.
func LoadHF(dir string) (*Model, error) { return loadHF(dir, false, RevisionCache{}) }

// LoadHFCached is LoadHF with the revision taken from rc when the
// directory's config.json and weight files were hashed before (the hash
// pass then runs in Model.Verify), else computed and kept there.
func LoadHFCached(dir string, rc RevisionCache) (*Model, error) { return loadHF(dir, false, rc) }

// CheckHF says whether LoadHF would compute dir's model, and its shape:
// its
// configuration and every tensor's type and shape (not the weights'
// values, which LoadHF hashes and checks).
func CheckHF(dir string) (Config, error) {
	m, err := loadHF(dir, true, RevisionCache{})
	if err != nil {
		return Config{}, err
	}
	return m.Config, nil
}

func loadHF(dir string, checkOnly bool, rc RevisionCache) (*Model, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnsupportedHF, err)
	}
	var hc hfConfig
	if err := json.Unmarshal(raw, &hc); err != nil {
		return nil, fmt.Errorf("%w: %s/config.json: %v", ErrUnsupportedHF, dir, err)
	}
	c, err := hc.config(filepath.Base(dir))
	if err != nil {
		return nil, err
	}
	tensors, err := mapSafetensors(dir)
	if err != nil {
		return nil, err
	}
	w, err := hfWeights(c, hc, tensors)
	if err == nil && checkOnly {
		for _, f := range tensors.files {
			unmapFile(f)
		}
		return &Model{Config: c}, nil
	}
	if err == nil {
		var m *Model
		if m, err = newCached(c, w, rc, hfIdentity(dir, tensors.names)); err == nil {
			return m, nil
		}
	}
	for _, f := range tensors.files {
		unmapFile(f)
	}
	return nil, fmt.Errorf("%s: %w", dir, err)
}

func (hc hfConfig) config(name string) (Config, error) {
	switch {
	case hc.ModelType != "llama" && hc.ModelType != "qwen2" && hc.ModelType != "mistral":
		return Config{}, fmt.Errorf("%w: model_type %q (llama, mistral and qwen2 are computed)", ErrUnsupportedHF, hc.ModelType)
	case hc.HeadDim != 0 && hc.Heads > 0 && hc.HeadDim != hc.Hidden/hc.Heads:
		return Config{}, fmt.Errorf("%w: head_dim %d is not hidden_size/num_attention_heads", ErrUnsupportedHF, hc.HeadDim)
	case string(hc.SlidingWindow) == "true":
		return Config{}, fmt.Errorf("%w: use_sliding_window", ErrUnsupportedHF)
	}
	c := Config{Name: name, Dim: hc.Hidden, HiddenDim: hc.Intermediate, Layers: hc.Layers, Heads: hc.Heads, KVHeads: cmp.Or(hc.KVHeads, hc.Heads),
		VocabSize: hc.Vocab, ContextLen: cmp.Or(hc.MaxPositions, 2048), RopeTheta: cmp.Or(hc.RopeTheta, 10000), NormEps: float32(cmp.Or(hc.NormEps, 1e-6)), RopeNeox: true}
	if hc.ModelType == "mistral" && hc.Window > 0 {
		// Within its sliding window, attention is plain attention.
		c.ContextLen = min(c.ContextLen, hc.Window)
	}
	if len(hc.RopeScaling) > 0 && string(hc.RopeScaling) != "null" {
		var rs hfRopeScaling
		if err := json.Unmarshal(hc.RopeScaling, &rs); err != nil {
			return Config{}, fmt.Errorf("%w: rope_scaling %s: %v", ErrUnsupportedHF, hc.RopeScaling, err)
		}
		if c.Heads > 0 {
			var err error
			if c.RopeFreqFactors, err = rs.factors(c.RopeTheta, c.Dim/c.Heads); err != nil {
				return Config{}, err
			}
		}
	}
	return c, c.Validate()
}

// hfIdentity is the identity of a directory's config.json and weight
// files ("" when one has none).
func hfIdentity(dir string, names []string) string {
	id := "hf"
	for _, n := range append([]string{"config.json"}, names...) {
		st, err := os.Stat(filepath.Join(dir, n))
		if err != nil || fileIdentity(st) == "" {
			return ""
		}
		id += ";" + n + "=" + fileIdentity(st)
	}
	return id
}

// safetensors are the tensors of a directory's mapped safetensors files.
type safetensors struct {
	names  []string
	files  [][]byte
	byName map[string]stTensor
}

type stTensor struct {
	dtype string
	shape []int
	data  []byte
}

// mapSafetensors maps model.safetensors, or every shard the index names.
func mapSafetensors(dir string) (*safetensors, error) {
	names := []string{"model.safetensors"}
	if raw, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json")); err == nil {
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(raw, &idx); err != nil {
			return nil, fmt.Errorf("%w: model.safetensors.index.json: %v", ErrUnsupportedHF, err)
		}
		names = names[:0]
		for _, f := range idx.WeightMap {
			if filepath.Base(f) != f {
				return nil, fmt.Errorf("%w: the index names %q, outside the directory", ErrUnsupportedHF, f)
			}
			if !slices.Contains(names, f) {
				names = append(names, f)
			}
		}
		slices.Sort(names)
	}
	st := &safetensors{names: names, byName: map[string]stTensor{}}
	for _, name := range names {
		if err := st.add(filepath.Join(dir, name)); err != nil {
			for _, f := range st.files {
				unmapFile(f)
			}
			return nil, err
		}
	}
	return st, nil
}

// add maps one safetensors file: an 8-byte little-endian header length,
// a JSON header of {name: {dtype, shape, data_offsets}}, the data.
func (st *safetensors) add(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnsupportedHF, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() < 8 || fi.Size() > math.MaxInt || cpu.IsBigEndian {
		return fmt.Errorf("%w: %s: %d bytes", ErrUnsupportedHF, path, fi.Size())
	}
	data, err := mapFile(f, int(fi.Size()), true)
	if err != nil {
		return err
	}
	st.files = append(st.files, data)
	n := binary.LittleEndian.Uint64(data)
	if n > uint64(len(data)-8) {
		return fmt.Errorf("%w: %s: a header of %d bytes in a file of %d", ErrUnsupportedHF, path, n, len(data))
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &hdr); err != nil {
		return fmt.Errorf("%w: %s: header: %v", ErrUnsupportedHF, path, err)
	}
	body := data[8+n:]
	for name, raw := range hdr {
		if name == "__metadata__" {
			continue
		}
		var t struct {
			Dtype   string   `json:"dtype"`
			Shape   []int    `json:"shape"`
			Offsets []uint64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &t); err != nil || len(t.Offsets) != 2 || t.Offsets[0] > t.Offsets[1] || t.Offsets[1] > uint64(len(body)) {
			return fmt.Errorf("%w: %s: tensor %s: bad entry %s", ErrUnsupportedHF, path, name, raw)
		}
		if _, dup := st.byName[name]; dup {
			return fmt.Errorf("%w: tensor %s in two files", ErrUnsupportedHF, name)
		}
		st.byName[name] = stTensor{dtype: t.Dtype, shape: t.Shape, data: body[t.Offsets[0]:t.Offsets[1]]}
	}
	return nil
}

// hfTypes are the safetensors dtypes the engine reads.
var hfTypes = map[string]matmul.Type{"F32": matmul.F32, "F16": matmul.F16, "BF16": matmul.BF16}

// hfWeights are c's weights from the tensors, each of the shape c says
// ([rows, cols]), every tensor placed: matrices F32, F16 or BF16 used in
// place; vectors (norms, biases) F32 in place or decoded to float32.
func hfWeights(c Config, hc hfConfig, st *safetensors) (*Weights, error) {
	names := hfNames
	if _, ok := st.byName["lm_head.weight"]; !ok && hc.TieEmbeddings {
		names.classifier = ""
	}
	if hc.ModelType != "qwen2" {
		names.bq, names.bk, names.bv = "", "", ""
	}
	used := map[string]bool{}
	w, err := assembleWeights(c, hfTensors{st, used}, names)
	if err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(st.byName)) {
		if !isRotaryCache(name) && !used[name] {
			return nil, fmt.Errorf("%w: tensor %s has no place in the reference engine's %s", ErrUnsupportedHF, name, hc.ModelType)
		}
	}
	return w, nil
}

// hfNames are Hugging Face's tensor names.
var hfNames = tensorNames{embedding: "model.embed_tokens.weight", finalNorm: "model.norm.weight", classifier: "lm_head.weight",
	layer: func(i int) string { return fmt.Sprintf("model.layers.%d.", i) }, attnNorm: "input_layernorm.weight",
	q: "self_attn.q_proj.weight", k: "self_attn.k_proj.weight", v: "self_attn.v_proj.weight", o: "self_attn.o_proj.weight",
	ffnNorm: "post_attention_layernorm.weight", gate: "mlp.gate_proj.weight", down: "mlp.down_proj.weight", up: "mlp.up_proj.weight",
	bq: "self_attn.q_proj.bias", bk: "self_attn.k_proj.bias", bv: "self_attn.v_proj.bias"}

// hfTensors hands out a directory's tensors, noting which were used.
type hfTensors struct {
	st   *safetensors
	used map[string]bool
}

// take is tensor name as rows×cols values ([rows, cols], or [cols] for
// a vector) of a dtype the engine reads, in place.
func (h hfTensors) take(name string, rows, cols int, _ bool) (matmul.Matrix, error) {
	t, ok := h.st.byName[name]
	h.used[name] = true
	mt, known := hfTypes[t.dtype]
	want := []int{rows, cols}
	if rows == 1 {
		want = want[1:]
	}
	switch {
	case !ok:
		return matmul.Matrix{}, fmt.Errorf("%w: tensor %s missing", ErrUnsupportedHF, name)
	case !known:
		return matmul.Matrix{}, fmt.Errorf("%w: tensor %s is %s (the reference engine reads F32, F16 and BF16)", ErrUnsupportedHF, name, t.dtype)
	case !slices.Equal(t.shape, want) && !slices.Equal(t.shape, []int{rows, cols}) || len(t.data) != rows*mt.RowBytes(cols):
		return matmul.Matrix{}, fmt.Errorf("%w: tensor %s is %v, want %v", ErrUnsupportedHF, name, t.shape, want)
	case mt != matmul.F32:
		return matmul.Matrix{Type: mt, Raw: t.data}, nil
	case uintptr(unsafe.Pointer(unsafe.SliceData(t.data)))%4 != 0:
		return matmul.Matrix{}, fmt.Errorf("%w: tensor %s is not 4-byte aligned in its file", ErrUnsupportedHF, name)
	}
	return matmul.Of(unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(t.data))), rows*cols)), nil
}

// isRotaryCache: older checkpoints store RoPE's inverse frequencies, which
// the engine computes from rope_theta.
func isRotaryCache(name string) bool {
	return filepath.Ext(name) == ".inv_freq"
}
