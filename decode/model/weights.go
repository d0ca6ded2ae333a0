package model

import (
	"fmt"
	"math"

	"github.com/lifeline-llm/lifeline/decode/matmul"

	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// Layer holds one transformer block. Matrices are row-major with one row per
// output: Wq is Dim×Dim, Wk and Wv KVDim×Dim, Wo Dim×Dim, W1 and W3
// HiddenDim×Dim, W2 Dim×HiddenDim.
type Layer struct {
	AttnNorm, Wq, Wk, Wv, Wo []float32
	FFNNorm, W1, W2, W3      []float32
	// Bq, Bk and Bv are the query, key and value biases (Qwen2); nil:
	// none.
	Bq, Bk, Bv []float32
	// Typed, when set, holds the layer's matrices in a weight type other
	// than F32 (F16, BF16, Q8_0, from a file); the float32 matrices above
	// are then nil. Norms and biases stay float32.
	Typed *TypedLayer
}

// TypedLayer is a layer's matrices in a weight type other than F32.
type TypedLayer struct{ Wq, Wk, Wv, Wo, W1, W2, W3 matmul.Matrix }

// matrices are l's matrices, typed or not.
func (l *Layer) matrices() TypedLayer {
	if l.Typed != nil {
		return *l.Typed
	}
	return TypedLayer{matmul.Of(l.Wq), matmul.Of(l.Wk), matmul.Of(l.Wv), matmul.Of(l.Wo), matmul.Of(l.W1), matmul.Of(l.W2), matmul.Of(l.W3)}
}

// Weights are all tensors of a model.
type Weights struct {
	Embedding  []float32 // VocabSize×Dim
	Layers     []Layer
	FinalNorm  []float32 // Dim
	Classifier []float32 // VocabSize×Dim; may alias Embedding
	// OutputBias, when set, is added to the logits (VocabSize).
	OutputBias []float32
	// TypedEmbedding and TypedClassifier, when their data is set, are the
	// embedding and classifier in another weight type (Embedding and
	// Classifier are then nil).
	TypedEmbedding, TypedClassifier matmul.Matrix
}

// Typed says whether any of w's matrices is in a type other than F32.
func (w *Weights) Typed() bool {
	return w.TypedEmbedding.Raw != nil || w.TypedClassifier.Raw != nil || (len(w.Layers) > 0 && w.Layers[0].Typed != nil)
}

// embedding is token's row of the embedding, written to dst.
func (w *Weights) embedding(dst []float32, token, dim int) {
	if w.Embedding != nil {
		copy(dst, w.Embedding[token*dim:(token+1)*dim])
		return
	}
	w.TypedEmbedding.DecodeRows(dst, dim, token, token+1)
}

// classifier is the output matrix, typed or not.
func (w *Weights) classifier() matmul.Matrix {
	if w.Classifier != nil {
		return matmul.Of(w.Classifier)
	}
	return w.TypedClassifier
}

// tensors lists every tensor with its name and expected shape, in a
// fixed order used by the revision hash and the checkpoint writer.
func (w *Weights) tensors(c Config) []namedTensor {
	mat := func(name string, f []float32, typed *matmul.Matrix, rows, cols int) namedTensor {
		t := namedTensor{name: name, data: f, rows: rows, cols: cols}
		switch {
		case f != nil || typed == nil:
		case typed.Type == matmul.F32:
			t.data = typed.F32
		default:
			t.typed = *typed
		}
		return t
	}
	vec := func(name string, f []float32, n int) namedTensor {
		return namedTensor{name: name, data: f, rows: 1, cols: n}
	}
	t := []namedTensor{mat("embedding", w.Embedding, &w.TypedEmbedding, c.VocabSize, c.Dim)}
	for i := range w.Layers {
		l := &w.Layers[i]
		p := fmt.Sprintf("layers.%d.", i)
		tl := l.Typed
		if tl == nil {
			tl = &TypedLayer{}
		}
		t = append(t,
			vec(p+"attn_norm", l.AttnNorm, c.Dim),
			mat(p+"wq", l.Wq, &tl.Wq, c.Dim, c.Dim),
			mat(p+"wk", l.Wk, &tl.Wk, c.KVDim(), c.Dim),
			mat(p+"wv", l.Wv, &tl.Wv, c.KVDim(), c.Dim),
			mat(p+"wo", l.Wo, &tl.Wo, c.Dim, c.Dim),
			vec(p+"ffn_norm", l.FFNNorm, c.Dim),
			mat(p+"w1", l.W1, &tl.W1, c.HiddenDim, c.Dim),
			mat(p+"w2", l.W2, &tl.W2, c.Dim, c.HiddenDim),
			mat(p+"w3", l.W3, &tl.W3, c.HiddenDim, c.Dim),
		)
		if l.Bq != nil || l.Bk != nil || l.Bv != nil {
			t = append(t, vec(p+"bq", l.Bq, c.Dim), vec(p+"bk", l.Bk, c.KVDim()), vec(p+"bv", l.Bv, c.KVDim()))
		}
	}
	t = append(t, vec("final_norm", w.FinalNorm, c.Dim), mat("classifier", w.Classifier, &w.TypedClassifier, c.VocabSize, c.Dim))
	if w.OutputBias != nil {
		t = append(t, vec("output_bias", w.OutputBias, c.VocabSize))
	}
	return t
}

// namedTensor is a float32 tensor (data) or a typed matrix (typed.Raw
// set) of rows×cols values.
type namedTensor struct {
	name       string
	data       []float32
	typed      matmul.Matrix
	rows, cols int
}

func (w *Weights) check(c Config) error {
	if len(w.Layers) != c.Layers {
		return fmt.Errorf("%w: %d layers of weights for %d layers", ErrBadConfig, len(w.Layers), c.Layers)
	}
	for _, t := range w.tensors(c) {
		if t.typed.Raw != nil {
			if err := t.typed.Check(t.rows, t.cols); err != nil {
				return fmt.Errorf("%w: tensor %s: %v", ErrBadConfig, t.name, err)
			}
			continue
		}
		if len(t.data) != t.rows*t.cols {
			return fmt.Errorf("%w: tensor %s has %d values, want %d", ErrBadConfig, t.name, len(t.data), t.rows*t.cols)
		}
	}
	return nil
}

// Synthetic builds a preset with weights that are a pure function of
// (preset, seed). Its output bias favours whole words over single
// characters and rules out byte-fallback and special tokens, so that
// generations from random weights read as words.
func Synthetic(preset string, seed uint64) (*Model, error) {
	c, err := PresetConfig(preset)
	if err != nil {
		return nil, err
	}
	w, err := randomWeights(c, seed)
	if err != nil {
		return nil, err
	}
	w.OutputBias = readableBias(tokenizer.NewBuiltin())
	return New(c, w)
}

// Random builds a model of any shape with weights that are a pure function
// of (config, seed) and no output bias.
func Random(c Config, seed uint64) (*Model, error) {
	w, err := randomWeights(c, seed)
	if err != nil {
		return nil, err
	}
	return New(c, w)
}

func randomWeights(c Config, seed uint64) (*Weights, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	tensorNo := uint64(0)
	gen := func(n int, scale float64) []float32 {
		tensorNo++
		key := seed*0x9e3779b97f4a7c15 + tensorNo
		v := make([]float32, n)
		for i := range v {
			v[i] = float32((2*sample.Uniform(key, uint64(i)) - 1) * scale)
		}
		return v
	}
	ones := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = 1
		}
		return v
	}
	// Uniform(-a, a) has variance a²/3: a = sqrt(3/fan_in) keeps unit scale.
	unit := func(fanIn int) float64 { return math.Sqrt(3 / float64(fanIn)) }
	resid := 0.5 / math.Sqrt(float64(c.Layers))
	w := &Weights{Embedding: gen(c.VocabSize*c.Dim, 1)}
	for i := 0; i < c.Layers; i++ {
		w.Layers = append(w.Layers, Layer{
			AttnNorm: ones(c.Dim),
			Wq:       gen(c.Dim*c.Dim, unit(c.Dim)),
			Wk:       gen(c.KVDim()*c.Dim, unit(c.Dim)),
			Wv:       gen(c.KVDim()*c.Dim, unit(c.Dim)),
			Wo:       gen(c.Dim*c.Dim, unit(c.Dim)*resid),
			FFNNorm:  ones(c.Dim),
			W1:       gen(c.HiddenDim*c.Dim, unit(c.Dim)),
			W2:       gen(c.Dim*c.HiddenDim, unit(c.HiddenDim)*resid),
			W3:       gen(c.HiddenDim*c.Dim, unit(c.Dim)),
		})
	}
	w.FinalNorm = ones(c.Dim)
	w.Classifier = gen(c.VocabSize*c.Dim, unit(c.Dim)*2)
	return w, nil
}

func readableBias(tok *tokenizer.Builtin) []float32 {
	bias := make([]float32, tok.VocabSize())
	rank := 0
	for id := range bias {
		p := tok.PieceString(id)
		switch {
		case tok.IsSpecial(id) || tok.IsByteFallback(id):
			bias[id] = -30
		case p == ". " || p == ", " || p == ".\n":
			bias[id] = 1.5
		case len(p) > 2 && p[0] == ' ' && p[1] >= 'A' && p[1] <= 'Z':
			bias[id] = 0.5
		case len(p) > 2 && p[0] == ' ':
			bias[id] = float32(2.5 - 0.001*float64(rank))
			rank++
		default:
			bias[id] = -2
		}
	}
	return bias
}
