package model

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/lifeline-llm/lifeline/decode/gguf"
)

// ErrBadCheckpoint is wrapped by every error about a malformed model.bin.
var ErrBadCheckpoint = errors.New("model: malformed llama2.c checkpoint")

// llama2.c's legacy model.bin: seven int32 (dim, hidden_dim, n_layers,
// n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means the
// classifier is stored separately), then float32 tensors in a fixed order,
// with the RoPE tables (unused here) before the optional classifier.
const llama2CHeaderInts = 7

// LoadLlama2C loads a llama2.c model.bin. On a little-endian Linux host
// the weights are the file's own pages, mapped read-only and shared with
// the page cache (as llama2.c's run.c does): start-up costs the header
// and size checks, one parallel pass that refuses non-finite weights and
// the revision hash, and no copy. Elsewhere, or when the file cannot be
// mapped, the weights are read into memory (ReadLlama2C).
//
// A mapping is never unmapped: a worker loads its model once, and every
// model made from it (Shard, FirstLayers, Lead) shares its weights. They
// are never written (a write would fault: the pages are read-only).
// Replace a checkpoint by renaming a new file over it: a file rewritten
// or truncated in place changes or takes away the weights of a running
// model.
func LoadLlama2C(path string) (*Model, error) { return LoadLlama2CCached(path, RevisionCache{}) }

// LoadLlama2CCached is LoadLlama2C with a revision cache: a mapped
// checkpoint whose file the cache knows is ready without the hash pass
// (Verify runs it; until then the model is Unverified); one it does not
// know is hashed and recorded.
func LoadLlama2CCached(path string, rc RevisionCache) (*Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("model: load %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("model: load %s: %w", path, err)
	}
	if err := notGGUF(f, path); err != nil {
		return nil, err
	}
	key := fileIdentity(st)
	known, _ := rc.lookup(key)
	m, err := mapLlama2C(f, st.Size(), known)
	if errors.Is(err, errNotMapped) {
		known = ""
		m, err = ReadLlama2C(bufio.NewReaderSize(f, 1<<20), st.Size())
	}
	if err != nil {
		return nil, fmt.Errorf("model: load %s: %w", path, err)
	}
	if known != "" {
		m.unverified = &unverified{cache: rc, key: key}
	} else {
		rc.store(key, m.Revision)
	}
	m.Config.Name = "llama2c:" + filepath.Base(path)
	return m, nil
}

// notGGUF refuses a GGUF file given as a llama2.c checkpoint, saying what
// it is (its header's summary) instead of misreading its magic as a
// dimension.
func notGGUF(f *os.File, path string) error {
	var magic [4]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil || string(magic[:]) != gguf.Magic {
		return nil
	}
	what := "a GGUF file"
	if h, err := gguf.Open(path); err == nil {
		what += " (" + h.Summary() + ")"
	} else {
		what += ", and a bad one: " + err.Error()
	}
	return fmt.Errorf("model: load %s: %w: it is %s, not a llama2.c checkpoint; GGUF models are served through llama.cpp (build tag llamacpp), which the worker does not serve through yet", path, ErrBadCheckpoint, what)
}

// errNotMapped says that a checkpoint is to be read instead of mapped;
// nothing of the file was consumed.
var errNotMapped = errors.New("model: checkpoint not mapped")

// mapLlama2C is the model over a mapping of f's size bytes; known is
// its cached revision, or "".
func mapLlama2C(f *os.File, size int64, known string) (*Model, error) {
	if cpu.IsBigEndian || size < 4*llama2CHeaderInts || size > math.MaxInt {
		// Too short: the reader says why the header is bad.
		return nil, errNotMapped
	}
	data, err := mapFile(f, int(size), known == "")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNotMapped, err)
	}
	m, err := llama2CFromBytes(data, known)
	if err != nil {
		unmapFile(data)
		return nil, err
	}
	return m, nil
}

// llama2CFromBytes decodes a whole checkpoint whose weights stay in data
// (the model keeps data for good): a little-endian host only, data
// 4-byte aligned after the header. known is its revision if cached.
func llama2CFromBytes(data []byte, known string) (*Model, error) {
	var hdr [llama2CHeaderInts]int32
	if len(data) < 4*len(hdr) {
		return nil, fmt.Errorf("%w: header: %d bytes", ErrBadCheckpoint, len(data))
	}
	for i := range hdr {
		hdr[i] = int32(binary.LittleEndian.Uint32(data[4*i:]))
	}
	c, shared, err := llama2CShape(hdr, int64(len(data)))
	if err != nil {
		return nil, err
	}
	body := data[4*len(hdr):]
	if cpu.IsBigEndian || uintptr(unsafe.Pointer(unsafe.SliceData(body)))%4 != 0 {
		return nil, errNotMapped
	}
	floats := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(body))), len(body)/4)
	w, err := llama2CWeights(c, shared, func(n int) ([]float32, error) {
		v := floats[:n:n]
		floats = floats[n:]
		return v, nil
	}, func(n int) error {
		floats = floats[n:]
		return nil
	})
	if err != nil {
		return nil, err
	}
	return newFromCheckpoint(c, w, known)
}

// newFromCheckpoint is New for a checkpoint's weights (known: their
// cached revision, or ""): non-finite ones make it a malformed
// checkpoint.
func newFromCheckpoint(c Config, w *Weights, known string) (*Model, error) {
	m, err := newModel(c, w, known)
	if errors.Is(err, ErrNonFinite) {
		return nil, fmt.Errorf("%w: %w", ErrBadCheckpoint, err)
	}
	return m, err
}

// ReadLlama2C decodes a checkpoint of exactly size bytes from r into
// memory of its own.
func ReadLlama2C(r io.Reader, size int64) (*Model, error) {
	var hdr [llama2CHeaderInts]int32
	if err := binary.Read(r, binary.LittleEndian, &hdr); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrBadCheckpoint, err)
	}
	c, shared, err := llama2CShape(hdr, size)
	if err != nil {
		return nil, err
	}
	w, err := llama2CWeights(c, shared, func(n int) ([]float32, error) {
		v := make([]float32, n)
		if err := binary.Read(r, binary.LittleEndian, v); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadCheckpoint, err)
		}
		return v, nil
	}, func(n int) error {
		if _, err := io.CopyN(io.Discard, r, 4*int64(n)); err != nil {
			return fmt.Errorf("%w: rope tables: %v", ErrBadCheckpoint, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return newFromCheckpoint(c, w, "")
}

// llama2CShape is the config a header describes, and whether the
// classifier is the embedding; the file must have exactly the size the
// header implies.
func llama2CShape(hdr [llama2CHeaderInts]int32, size int64) (Config, bool, error) {
	shared := hdr[5] > 0
	vocab := int(hdr[5])
	if vocab < 0 {
		vocab = -vocab
	}
	c := Config{
		Name: "llama2c", Dim: int(hdr[0]), HiddenDim: int(hdr[1]), Layers: int(hdr[2]),
		Heads: int(hdr[3]), KVHeads: int(hdr[4]), VocabSize: vocab, ContextLen: int(hdr[6]),
		RopeTheta: 10000, NormEps: 1e-5,
	}
	if err := c.Validate(); err != nil {
		return Config{}, false, fmt.Errorf("%w: %v", ErrBadCheckpoint, err)
	}
	// All sizes are bounded by Validate, so this cannot overflow int64.
	floats := int64(c.Params()) - int64(c.VocabSize*c.Dim) + int64(c.ContextLen*c.HeadSize())
	if !shared {
		floats += int64(c.VocabSize * c.Dim)
	}
	if want := 4*llama2CHeaderInts + 4*floats; size != want {
		return Config{}, false, fmt.Errorf("%w: file has %d bytes, header implies %d", ErrBadCheckpoint, size, want)
	}
	return c, shared, nil
}

// llama2CWeights takes the tensors in the file's order: take returns the
// next n values, skip passes over n (the RoPE tables).
func llama2CWeights(c Config, shared bool, take func(n int) ([]float32, error), skip func(n int) error) (*Weights, error) {
	w := &Weights{Layers: make([]Layer, c.Layers)}
	var err error
	if w.Embedding, err = take(c.VocabSize * c.Dim); err != nil {
		return nil, err
	}
	// Tensors are stored tensor-major across layers.
	perLayer := []struct {
		n   int
		get func(*Layer) *[]float32
	}{
		{c.Dim, func(l *Layer) *[]float32 { return &l.AttnNorm }},
		{c.Dim * c.Dim, func(l *Layer) *[]float32 { return &l.Wq }},
		{c.KVDim() * c.Dim, func(l *Layer) *[]float32 { return &l.Wk }},
		{c.KVDim() * c.Dim, func(l *Layer) *[]float32 { return &l.Wv }},
		{c.Dim * c.Dim, func(l *Layer) *[]float32 { return &l.Wo }},
		{c.Dim, func(l *Layer) *[]float32 { return &l.FFNNorm }},
		{c.HiddenDim * c.Dim, func(l *Layer) *[]float32 { return &l.W1 }},
		{c.Dim * c.HiddenDim, func(l *Layer) *[]float32 { return &l.W2 }},
		{c.HiddenDim * c.Dim, func(l *Layer) *[]float32 { return &l.W3 }},
	}
	for _, t := range perLayer {
		for i := range w.Layers {
			if *t.get(&w.Layers[i]), err = take(t.n); err != nil {
				return nil, err
			}
		}
	}
	if w.FinalNorm, err = take(c.Dim); err != nil {
		return nil, err
	}
	if err := skip(c.ContextLen * c.HeadSize()); err != nil {
		return nil, err
	}
	if shared {
		w.Classifier = w.Embedding
	} else if w.Classifier, err = take(c.VocabSize * c.Dim); err != nil {
		return nil, err
	}
	return w, nil
}

// WriteLlama2C writes m as a llama2.c model.bin. An output bias has no
// place in that format and is refused.
func WriteLlama2C(out io.Writer, m *Model) error {
	if m.W.OutputBias != nil {
		return fmt.Errorf("model: llama2.c format cannot hold an output bias")
	}
	if m.W.Typed() {
		return fmt.Errorf("model: llama2.c format holds F32 weights only")
	}
	c := m.Config
	shared := &m.W.Classifier[0] == &m.W.Embedding[0]
	vocab := int32(c.VocabSize)
	if !shared {
		vocab = -vocab
	}
	bw := bufio.NewWriterSize(out, 1<<20)
	hdr := [llama2CHeaderInts]int32{int32(c.Dim), int32(c.HiddenDim), int32(c.Layers), int32(c.Heads), int32(c.KVHeads), vocab, int32(c.ContextLen)}
	binary.Write(bw, binary.LittleEndian, hdr)
	binary.Write(bw, binary.LittleEndian, m.W.Embedding)
	for _, get := range []func(*Layer) []float32{
		func(l *Layer) []float32 { return l.AttnNorm },
		func(l *Layer) []float32 { return l.Wq },
		func(l *Layer) []float32 { return l.Wk },
		func(l *Layer) []float32 { return l.Wv },
		func(l *Layer) []float32 { return l.Wo },
		func(l *Layer) []float32 { return l.FFNNorm },
		func(l *Layer) []float32 { return l.W1 },
		func(l *Layer) []float32 { return l.W2 },
		func(l *Layer) []float32 { return l.W3 },
	} {
		for i := range m.W.Layers {
			binary.Write(bw, binary.LittleEndian, get(&m.W.Layers[i]))
		}
	}
	binary.Write(bw, binary.LittleEndian, m.W.FinalNorm)
	binary.Write(bw, binary.LittleEndian, make([]float32, c.ContextLen*c.HeadSize()))
	if !shared {
		binary.Write(bw, binary.LittleEndian, m.W.Classifier)
	}
	return bw.Flush()
}

// finite reports whether no value of v has an exponent of all ones (an
// infinity or a NaN), two values at a time: in each 32-bit lane, the
// exponent bits xor all ones plus all ones carries into bit 31 unless
// they were all ones, and never out of the lane.
func finite(v []float32) bool {
	const exp = 0x7f800000
	if len(v) > 0 && uintptr(unsafe.Pointer(&v[0]))%8 != 0 {
		if math.Float32bits(v[0])&exp == exp {
			return false
		}
		v = v[1:]
	}
	pairs := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(v))), len(v)/2)
	const exp2, top2 = exp<<32 | exp, 1<<63 | 1<<31
	acc := uint64(top2)
	for _, x := range pairs {
		acc &= (x&exp2 ^ exp2) + exp2
	}
	if len(v)%2 == 1 && math.Float32bits(v[len(v)-1])&exp == exp {
		return false
	}
	return acc&top2 == top2
}

// Llama2CVocabSize reads the vocabulary size from the header of the
// llama2.c checkpoint at path (checked as LoadLlama2C checks it, against
// the file's size), without loading it: a tokenizer can then be read while
// the weights load.
func Llama2CVocabSize(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("model: %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("model: %s: %w", path, err)
	}
	var hdr [llama2CHeaderInts]int32
	if err := binary.Read(f, binary.LittleEndian, &hdr); err != nil {
		return 0, fmt.Errorf("%w: %s: header: %v", ErrBadCheckpoint, path, err)
	}
	c, _, err := llama2CShape(hdr, st.Size())
	if err != nil {
		return 0, fmt.Errorf("model: %s: %w", path, err)
	}
	return c.VocabSize, nil
}
