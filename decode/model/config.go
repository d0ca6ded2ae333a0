// Package model is the reference engine's llama-style decoder-only
// transformer in pure Go float32: token embedding, RMSNorm, RoPE,
// grouped-query attention over a block-addressed KV cache, SwiGLU MLP and an
// output head.
//
// Forward computes every position with the same sequence of float
// operations whether it is part of a prefill or a decode step and whatever
// else is in the batch, so logits and K/V are bit-identical across batch
// compositions and across prefill/decode.
package model

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// ErrUnknownPreset is returned for a preset name that does not exist.
var ErrUnknownPreset = errors.New("model: unknown preset")

// ErrBadConfig is wrapped by every configuration validation error.
var ErrBadConfig = errors.New("model: bad config")

// EngineVersion changes whenever Forward or the sampler (decode/sample)
// changes its arithmetic: either changes the tokens of a seed. v3: the
// draw's weights from sample's own exponential instead of math.Exp.
const EngineVersion = "lifeline-ref/v3"

// Config is the shape of a model.
type Config struct {
	Name       string
	Dim        int
	HiddenDim  int
	Layers     int
	Heads      int
	KVHeads    int
	VocabSize  int
	ContextLen int
	RopeTheta  float64
	NormEps    float32
	// RopeNeox rotates each head's (i, i+HeadSize/2) pairs (GPT-NeoX's
	// layout: Qwen2, Hugging Face checkpoints) instead of its (2i, 2i+1)
	// pairs (llama2.c's and llama.cpp's llama GGUFs).
	RopeNeox bool
	// RopeFreqFactors, when set (HeadSize/2 values), divide each pair's
	// rotation frequency: Llama 3's RoPE frequency scaling, as a GGUF's
	// rope_freqs tensor or config.json's rope_scaling states it.
	RopeFreqFactors []float32
}

// HeadSize is the width of one attention head.
func (c Config) HeadSize() int { return c.Dim / c.Heads }

// KVDim is the width of the keys (and values) of one position in one layer.
func (c Config) KVDim() int { return c.KVHeads * c.HeadSize() }

// Params counts the weights, classifier included.
func (c Config) Params() int {
	perLayer := 2*c.Dim + 2*c.Dim*c.Dim + 2*c.Dim*c.KVDim() + 3*c.Dim*c.HiddenDim
	return 2*c.VocabSize*c.Dim + c.Layers*perLayer + c.Dim
}

// Validate reports the first inconsistent field by name.
func (c Config) Validate() error {
	const maxDim = 1 << 16
	switch {
	case c.Dim <= 0 || c.Dim > maxDim:
		return fmt.Errorf("%w: dim %d", ErrBadConfig, c.Dim)
	case c.HiddenDim <= 0 || c.HiddenDim > 4*maxDim:
		return fmt.Errorf("%w: hidden_dim %d", ErrBadConfig, c.HiddenDim)
	case c.Layers <= 0 || c.Layers > 1024:
		return fmt.Errorf("%w: layers %d", ErrBadConfig, c.Layers)
	case c.Heads <= 0 || c.Dim%c.Heads != 0:
		return fmt.Errorf("%w: heads %d does not divide dim %d", ErrBadConfig, c.Heads, c.Dim)
	case c.HeadSize()%2 != 0:
		return fmt.Errorf("%w: head size %d is odd (RoPE rotates pairs)", ErrBadConfig, c.HeadSize())
	case c.KVHeads <= 0 || c.Heads%c.KVHeads != 0:
		return fmt.Errorf("%w: kv_heads %d does not divide heads %d", ErrBadConfig, c.KVHeads, c.Heads)
	case c.RopeFreqFactors != nil && len(c.RopeFreqFactors) != c.HeadSize()/2:
		return fmt.Errorf("%w: %d RoPE frequency factors for heads of %d", ErrBadConfig, len(c.RopeFreqFactors), c.HeadSize())
	case slices.ContainsFunc(c.RopeFreqFactors, func(f float32) bool { return !(f > 0) || math.IsInf(float64(f), 0) }):
		return fmt.Errorf("%w: a RoPE frequency factor is not a positive finite number", ErrBadConfig)
	case c.VocabSize <= 0 || c.VocabSize > 1<<22:
		return fmt.Errorf("%w: vocab_size %d", ErrBadConfig, c.VocabSize)
	case c.ContextLen <= 0 || c.ContextLen > 1<<20:
		return fmt.Errorf("%w: context_len %d", ErrBadConfig, c.ContextLen)
	case !(c.RopeTheta > 1):
		return fmt.Errorf("%w: rope_theta %v", ErrBadConfig, c.RopeTheta)
	case !(c.NormEps > 0):
		return fmt.Errorf("%w: norm_eps %v", ErrBadConfig, c.NormEps)
	}
	return nil
}

// Presets are the synthetic models: tiny for tests, small (about 15M
// parameters) for demos and benchmarks. Both use the built-in tokenizer.
var Presets = map[string]Config{
	"tiny": {
		Name: "tiny", Dim: 64, HiddenDim: 176, Layers: 2, Heads: 4, KVHeads: 2,
		ContextLen: 4096, RopeTheta: 10000, NormEps: 1e-5,
	},
	"small": {
		Name: "small", Dim: 384, HiddenDim: 1024, Layers: 8, Heads: 6, KVHeads: 2,
		ContextLen: 4096, RopeTheta: 10000, NormEps: 1e-5,
	},
}

// PresetConfig returns the config of a preset with the built-in vocabulary.
func PresetConfig(name string) (Config, error) {
	c, ok := Presets[name]
	if !ok {
		return Config{}, fmt.Errorf("%w %q (have tiny, small)", ErrUnknownPreset, name)
	}
	c.VocabSize = tokenizer.NewBuiltin().VocabSize()
	return c, nil
}

// NumericsID names everything that decides the bits of a result: engine
// arithmetic, tensor parallelism, dtype and the kernel set. Bit-exact
// continuation is promised only between instances with equal ids.
//
// The architecture and, on amd64, the FMA flag are in it for the logprobs
// a request may ask for: they use math.Exp and math.Log, which are
// assembly on amd64 and arm64 and Go elsewhere, and on amd64 take an FMA
// path only when the CPU has FMA. The tokens do not depend on them:
// Forward's exponentials (softmax, SwiGLU) are matmul's own and the draw's
// weights sample's own, the same bits on every CPU.
func NumericsID() string { return NumericsIDFor(1) }
