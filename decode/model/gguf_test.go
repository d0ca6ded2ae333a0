package model_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/decode/model"
)

// TestLoadGGUF: an F32 llama or qwen2 GGUF maps with the shape its metadata says;
// what the reference engine does not compute — another architecture,
// another weight type, a tensor missing — is ErrUnsupportedGGUF naming
// it. (TestReferenceEngineReadsGGUFAsLlamaCppDoes, tag llamacpp, checks
// the tokens against llama.cpp.)
func TestLoadGGUF(t *testing.T) {
	m, err := model.LoadGGUF(llamacpptest.WriteModel(t, t.TempDir(), llamacpptest.Tiny, 1))
	if err != nil {
		t.Fatal(err)
	}
	if c := m.Config; c.Dim != 64 || c.Layers != 2 || c.Heads != 4 || c.KVHeads != 2 || c.HiddenDim != 128 || c.ContextLen != 512 || c.NormEps != 1e-5 || c.RopeTheta != 10000 {
		t.Fatalf("config %+v", c)
	}
	m, err = model.LoadGGUF(llamacpptest.WriteModel(t, t.TempDir(), llamacpptest.TinyQwen2, 1))
	if err != nil {
		t.Fatal(err)
	}
	if l := m.W.Layers[1]; !m.Config.RopeNeox || len(l.Bq) != 64 || len(l.Bk) != 32 || len(l.Bv) != 32 {
		t.Fatalf("qwen2: neox %v, biases %d %d %d", m.Config.RopeNeox, len(l.Bq), len(l.Bk), len(l.Bv))
	}
	q8 := llamacpptest.Tiny
	q8.Weights = gguf.Q8_0
	gemma := llamacpptest.Tiny
	gemma.Arch = "gemma"
	missing := llamacpptest.Tiny
	missing.Without = "blk.1.ffn_up.weight"
	for name, c := range map[string]struct {
		shape llamacpptest.Shape
		want  string
	}{
		"gemma": {gemma, `architecture "gemma"`},
		"q8_0":  {q8, "is Q8_0"},
		"hole":  {missing, "blk.1.ffn_up.weight missing"},
	} {
		_, err := model.LoadGGUF(llamacpptest.WriteModel(t, t.TempDir(), c.shape, 1))
		if !errors.Is(err, model.ErrUnsupportedGGUF) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrUnsupportedGGUF naming %s", name, err, c.want)
		}
	}
}
