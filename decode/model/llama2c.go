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
)

// ErrBadCheckpoint is wrapped by every error about a malformed model.bin.
var ErrBadCheckpoint = errors.New("model: malformed llama2.c checkpoint")

// llama2.c's legacy model.bin: seven int32 (dim, hidden_dim, n_layers,
// n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means the
// classifier is stored separately), then float32 tensors in a fixed order,
// with the RoPE tables (unused here) before the optional classifier.
const llama2CHeaderInts = 7

// LoadLlama2C reads a llama2.c model.bin.
func LoadLlama2C(path string) (*Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("model: load %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("model: load %s: %w", path, err)
	}
	m, err := ReadLlama2C(bufio.NewReaderSize(f, 1<<20), st.Size())
	if err != nil {
		return nil, fmt.Errorf("model: load %s: %w", path, err)
	}
	m.Config.Name = "llama2c:" + filepath.Base(path)
	return m, nil
}

// ReadLlama2C decodes a checkpoint of exactly size bytes from r.
func ReadLlama2C(r io.Reader, size int64) (*Model, error) {
	var hdr [llama2CHeaderInts]int32
	if err := binary.Read(r, binary.LittleEndian, &hdr); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrBadCheckpoint, err)
	}
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
		return nil, fmt.Errorf("%w: %v", ErrBadCheckpoint, err)
	}
	// All sizes are bounded by Validate, so this cannot overflow int64.
	floats := int64(c.Params()) - int64(c.VocabSize*c.Dim) + int64(c.ContextLen*c.HeadSize())
	if !shared {
		floats += int64(c.VocabSize * c.Dim)
	}
	if want := 4*llama2CHeaderInts + 4*floats; size != want {
		return nil, fmt.Errorf("%w: file has %d bytes, header implies %d", ErrBadCheckpoint, size, want)
	}
	read := func(n int) ([]float32, error) {
		v := make([]float32, n)
		if err := binary.Read(r, binary.LittleEndian, v); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadCheckpoint, err)
		}
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return nil, fmt.Errorf("%w: non-finite weight", ErrBadCheckpoint)
			}
		}
		return v, nil
	}
	w := &Weights{Layers: make([]Layer, c.Layers)}
	var err error
	if w.Embedding, err = read(c.VocabSize * c.Dim); err != nil {
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
			if *t.get(&w.Layers[i]), err = read(t.n); err != nil {
				return nil, err
			}
		}
	}
	if w.FinalNorm, err = read(c.Dim); err != nil {
		return nil, err
	}
	if _, err := io.CopyN(io.Discard, r, 4*int64(c.ContextLen*c.HeadSize())); err != nil {
		return nil, fmt.Errorf("%w: rope tables: %v", ErrBadCheckpoint, err)
	}
	if shared {
		w.Classifier = w.Embedding
	} else if w.Classifier, err = read(c.VocabSize * c.Dim); err != nil {
		return nil, err
	}
	return New(c, w)
}

// WriteLlama2C writes m as a llama2.c model.bin. An output bias has no
// place in that format and is refused.
func WriteLlama2C(out io.Writer, m *Model) error {
	if m.W.OutputBias != nil {
		return fmt.Errorf("model: llama2.c format cannot hold an output bias")
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
