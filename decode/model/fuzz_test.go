package model

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
)

// microModel is small enough to fuzz its checkpoint encoding.
func microModel(t testing.TB, shared bool) *Model {
	c := Config{Name: "micro", Dim: 8, HiddenDim: 12, Layers: 1, Heads: 2, KVHeads: 1, VocabSize: 10, ContextLen: 4, RopeTheta: 10000, NormEps: 1e-5}
	f := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%7) / 7
		}
		return v
	}
	w := &Weights{Embedding: f(80), FinalNorm: f(8), Layers: []Layer{{
		AttnNorm: f(8), Wq: f(64), Wk: f(32), Wv: f(32), Wo: f(64), FFNNorm: f(8), W1: f(96), W2: f(96), W3: f(96),
	}}}
	w.Classifier = f(80)
	if shared {
		w.Classifier = w.Embedding
	}
	m, err := New(c, w)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func FuzzReadLlama2C(f *testing.F) {
	for _, shared := range []bool{true, false} {
		var buf bytes.Buffer
		if err := WriteLlama2C(&buf, microModel(f, shared)); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ReadLlama2C(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			if !errors.Is(err, ErrBadCheckpoint) {
				t.Fatalf("error %v does not wrap ErrBadCheckpoint", err)
			}
			return
		}
		// Whatever decodes must re-encode to the same bytes.
		var out bytes.Buffer
		if err := WriteLlama2C(&out, m); err != nil {
			t.Fatal(err)
		}
		if out.Len() != len(data) {
			t.Fatalf("re-encoded %d bytes from %d", out.Len(), len(data))
		}
	})
}

// TestAGGUFFileIsNamed: a GGUF file given as a llama2.c checkpoint is
// refused as what it is (its architecture and tensors), not misread (its
// magic used to become "bad config: dim 1179993927").
func TestAGGUFFileIsNamed(t *testing.T) {
	var b bytes.Buffer
	if err := gguf.Write(&b, []gguf.KV{{Key: "general.architecture", Value: "qwen2"}, {Key: "qwen2.context_length", Value: uint32(32768)}},
		[]gguf.TensorData{{Tensor: gguf.Tensor{Name: "token_embd.weight", Dims: []uint64{32}, Type: gguf.Q8_0}, Data: make([]byte, 34)}}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "qwen.gguf")
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadLlama2C(path)
	if !errors.Is(err, ErrBadCheckpoint) || !strings.Contains(err.Error(), "it is a GGUF file (qwen2, GGUF v3, 1 tensors (1 Q8_0), context 32768), not a llama2.c checkpoint") {
		t.Fatalf("%v", err)
	}
	// Cut short: still named a GGUF file, with what is wrong with it.
	os.WriteFile(path, b.Bytes()[:40], 0o600)
	if _, err := LoadLlama2C(path); !errors.Is(err, ErrBadCheckpoint) || !strings.Contains(err.Error(), "a GGUF file, and a bad one: gguf: "+path+": truncated") {
		t.Fatalf("%v", err)
	}
}
