package model

import (
	"fmt"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// A draft model proposes tokens for speculative decoding; the target model
// verifies them, so a draft decides speed, never output. It must share the
// target's vocabulary and reach at least the target's context.

// SyntheticDraft is preset's synthetic model (weights a pure function of
// (preset, seed), with Synthetic's readable output bias) stretched to the
// target's context length, so that it can propose at every position the
// target computes. The context length changes no weight.
func SyntheticDraft(preset string, seed uint64, target Config) (*Model, error) {
	c, err := PresetConfig(preset)
	if err != nil {
		return nil, err
	}
	if c.VocabSize != target.VocabSize {
		return nil, fmt.Errorf("%w: draft preset %q has %d tokens, the target %d", ErrBadConfig, preset, c.VocabSize, target.VocabSize)
	}
	c.Name += "-draft"
	c.ContextLen = target.ContextLen
	w, err := randomWeights(c, seed)
	if err != nil {
		return nil, err
	}
	w.OutputBias = readableBias(tokenizer.NewBuiltin())
	return New(c, w)
}

// FirstLayers is m cut after its first n layers, with m's own embedding,
// final norm and output head: the self-speculative (LayerSkip-style) draft.
// It shares m's weights (no copy).
func (m *Model) FirstLayers(n int) (*Model, error) {
	if n <= 0 || n >= m.Config.Layers {
		return nil, fmt.Errorf("%w: draft of %d layers from a model of %d (want 1..%d)", ErrBadConfig, n, m.Config.Layers, m.Config.Layers-1)
	}
	c := m.Config
	c.Name = fmt.Sprintf("%s-first%d", c.Name, n)
	c.Layers = n
	w := m.W
	w.Layers = m.W.Layers[:n:n]
	return New(c, &w)
}
