package model

import (
	"github.com/lifeline-llm/lifeline/decode/matmul"
)

// tensorTaker hands out a checkpoint's tensors by name: rows×cols values
// in place, a matrix of any type it reads, or a vector (rows 1); an
// error names what is missing, of another type or shape.
type tensorTaker interface {
	take(name string, rows, cols int, matrix bool) (matmul.Matrix, error)
}

// tensorNames are a format's names for the tensors of the engine's
// llama: the embedding, final norm and classifier ("": tied to the
// embedding), and a layer's, after layer(i).
type tensorNames struct {
	embedding, finalNorm, classifier string
	layer                            func(i int) string
	attnNorm, q, k, v, o             string
	ffnNorm, gate, down, up          string
	// bq, bk, bv are the attention biases (qwen2); "": none.
	bq, bk, bv string
}

// assembleWeights takes every tensor of c's model from t under names n:
// matrices in place (all float32, or each layer's in Layer.Typed when
// any is of another type), vectors float32 (decoded when stored
// otherwise).
func assembleWeights(c Config, t tensorTaker, n tensorNames) (*Weights, error) {
	var err error
	mat := func(dst *matmul.Matrix, name string, rows, cols int) {
		if err == nil {
			*dst, err = t.take(name, rows, cols, true)
		}
	}
	vec := func(dst *[]float32, name string, size int) {
		if err != nil {
			return
		}
		var m matmul.Matrix
		if m, err = t.take(name, 1, size, false); err == nil {
			*dst = m.F32
			if m.Raw != nil {
				*dst = make([]float32, size)
				m.DecodeRows(*dst, size, 0, 1)
			}
		}
	}
	w := &Weights{Layers: make([]Layer, c.Layers)}
	var emb, cls matmul.Matrix
	mat(&emb, n.embedding, c.VocabSize, c.Dim)
	vec(&w.FinalNorm, n.finalNorm, c.Dim)
	cls = emb
	if n.classifier != "" {
		mat(&cls, n.classifier, c.VocabSize, c.Dim)
	}
	mats := make([]TypedLayer, c.Layers)
	for i := range w.Layers {
		l, tl, p := &w.Layers[i], &mats[i], n.layer(i)
		vec(&l.AttnNorm, p+n.attnNorm, c.Dim)
		mat(&tl.Wq, p+n.q, c.Dim, c.Dim)
		mat(&tl.Wk, p+n.k, c.KVDim(), c.Dim)
		mat(&tl.Wv, p+n.v, c.KVDim(), c.Dim)
		mat(&tl.Wo, p+n.o, c.Dim, c.Dim)
		vec(&l.FFNNorm, p+n.ffnNorm, c.Dim)
		mat(&tl.W1, p+n.gate, c.HiddenDim, c.Dim)
		mat(&tl.W2, p+n.down, c.Dim, c.HiddenDim)
		mat(&tl.W3, p+n.up, c.HiddenDim, c.Dim)
		if n.bq != "" {
			vec(&l.Bq, p+n.bq, c.Dim)
			vec(&l.Bk, p+n.bk, c.KVDim())
			vec(&l.Bv, p+n.bv, c.KVDim())
		}
	}
	if err != nil {
		return nil, err
	}
	w.placeMatrices(emb, cls, mats)
	return w, nil
}

// placeMatrices puts matrices read from a file where the engine reads
// them: all float32 in the float32 fields, or, when any is of another
// type, each layer's in Layer.Typed and the embedding and classifier in
// the typed fields unless float32.
func (w *Weights) placeMatrices(emb, cls matmul.Matrix, mats []TypedLayer) {
	typed := false
	for _, tl := range mats {
		for _, m := range []matmul.Matrix{tl.Wq, tl.Wk, tl.Wv, tl.Wo, tl.W1, tl.W2, tl.W3} {
			typed = typed || m.Type != matmul.F32
		}
	}
	w.Embedding, w.Classifier = emb.F32, cls.F32
	if emb.Type != matmul.F32 {
		w.TypedEmbedding = emb
	}
	if cls.Type != matmul.F32 {
		w.TypedClassifier = cls
	}
	for i := range w.Layers {
		l, tl := &w.Layers[i], mats[i]
		if typed {
			l.Typed = &tl
			continue
		}
		l.Wq, l.Wk, l.Wv, l.Wo, l.W1, l.W2, l.W3 = tl.Wq.F32, tl.Wk.F32, tl.Wv.F32, tl.Wo.F32, tl.W1.F32, tl.W2.F32, tl.W3.F32
	}
}

// unplaced is the first (in sorted order, the same error every time)
// of names that no tensor of the engine's llama took, or "".
func unplaced(names []string, used map[string]bool) string {
	for _, name := range names {
		if !used[name] {
			return name
		}
	}
	return ""
}
