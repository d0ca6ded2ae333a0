package model_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
	"github.com/lifeline-llm/lifeline/decode/model"
)

// TestLoadGGUF: an F32 llama or qwen2 GGUF maps with the shape its
// metadata says, F16, BF16 and Q8_0 matrices mapped as they are;
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
	for _, typ := range []gguf.TensorType{gguf.F16, gguf.BF16, gguf.Q8_0} {
		shape := llamacpptest.TinyQwen2
		shape.Weights = typ
		m, err := model.LoadGGUF(llamacpptest.WriteModel(t, t.TempDir(), shape, 1))
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if l := m.W.Layers[1]; l.Typed == nil || l.Typed.W2.Type.String() != typ.String() || l.Wq != nil || m.W.TypedEmbedding.Type.String() != typ.String() {
			t.Fatalf("%s: layer matrices %+v, embedding %s", typ, l.Typed, m.W.TypedEmbedding.Type)
		}
	}
	rope := llamacpptest.Tiny
	rope.Llama3Rope = true
	rm, err := model.LoadGGUF(llamacpptest.WriteModel(t, t.TempDir(), rope, 1))
	if err != nil {
		t.Fatal(err)
	}
	want := llamacpptest.Llama3Scaling.Factors(16)
	if f := rm.Config.RopeFreqFactors; len(f) != 8 || f[0] != 1 || f[7] != 8 || fmt.Sprint(f) != fmt.Sprint(want) {
		t.Fatalf("rope_freqs: %v, want %v (1 for the shortest wavelengths, 8 for the longest)", f, want)
	}
	hfDir := t.TempDir()
	if err := llamacpptest.WriteHF(hfDir, rm, "llama", true); err != nil {
		t.Fatal(err)
	}
	if hm, err := model.LoadHF(hfDir); err != nil || fmt.Sprint(hm.Config.RopeFreqFactors) != fmt.Sprint(want) {
		t.Fatalf("rope_scaling from config.json: %v, %v; want %v", hm, err, want)
	}
	// Mistral is llama with a sliding window: within it, plain attention.
	raw, _ := os.ReadFile(filepath.Join(hfDir, "config.json"))
	var cfg map[string]any
	json.Unmarshal(raw, &cfg)
	cfg["model_type"], cfg["sliding_window"] = "mistral", 100
	raw, _ = json.Marshal(cfg)
	os.WriteFile(filepath.Join(hfDir, "config.json"), raw, 0o644)
	mm, err := model.LoadHF(hfDir)
	if err != nil {
		t.Fatal(err)
	}
	if mm.Config.ContextLen != 100 {
		t.Fatalf("mistral with a window of 100: context %d", mm.Config.ContextLen)
	}
	q4 := llamacpptest.Tiny
	q4.Weights = gguf.Q4_0
	gemma := llamacpptest.Tiny
	gemma.Arch = "gemma"
	missing := llamacpptest.Tiny
	missing.Without = "blk.1.ffn_up.weight"
	for name, c := range map[string]struct {
		shape llamacpptest.Shape
		want  string
	}{
		"gemma": {gemma, `architecture "gemma"`},
		"q4_0":  {q4, "is Q4_0"},
		"hole":  {missing, "blk.1.ffn_up.weight missing"},
	} {
		_, err := model.LoadGGUF(llamacpptest.WriteModel(t, t.TempDir(), c.shape, 1))
		if !errors.Is(err, model.ErrUnsupportedGGUF) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrUnsupportedGGUF naming %s", name, err, c.want)
		}
	}
}

// TestLoadHF: a Hugging Face directory written from a GGUF's weights
// loads with NeoX RoPE and the GGUF's revision; what the reference engine does not compute is
// ErrUnsupportedHF naming it. (TestReferenceEngineReadsHFAsLlamaCppReadsItsGGUF,
// tag llamacpp, checks the tokens against llama.cpp on the GGUF.)
func TestLoadHF(t *testing.T) {
	g, err := model.LoadGGUF(llamacpptest.WriteModel(t, t.TempDir(), llamacpptest.TinyQwen2, 1))
	if err != nil {
		t.Fatal(err)
	}
	write := func(edit func(cfg map[string]any)) string {
		dir := t.TempDir()
		if err := llamacpptest.WriteHF(dir, g, "qwen2", false); err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			raw, _ := os.ReadFile(filepath.Join(dir, "config.json"))
			var cfg map[string]any
			json.Unmarshal(raw, &cfg)
			edit(cfg)
			raw, _ = json.Marshal(cfg)
			os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644)
		}
		return dir
	}
	m, err := model.LoadHF(write(nil))
	if err != nil {
		t.Fatal(err)
	}
	// The same function from either format: the same revision.
	if !m.Config.RopeNeox || m.Config.Dim != 64 || m.W.Layers[0].Bq == nil || m.Revision != g.Revision {
		t.Fatalf("config %+v, biases %v, revision %s (the GGUF's %s)", m.Config, m.W.Layers[0].Bq != nil, m.Revision, g.Revision)
	}
	bf := t.TempDir()
	if err := llamacpptest.WriteHFAs(bf, g, "qwen2", false, "BF16"); err != nil {
		t.Fatal(err)
	}
	if m, err := model.LoadHF(bf); err != nil {
		t.Fatal(err)
	} else if l := m.W.Layers[0]; l.Typed == nil || l.Typed.Wq.Type.String() != "BF16" || len(l.AttnNorm) != 64 || len(l.Bq) != 64 || m.Revision == g.Revision {
		t.Fatalf("a BF16 directory: matrices %+v, norm %d, bias %d values, revision %s (the F32 one's %s)", l.Typed, len(l.AttnNorm), len(l.Bq), m.Revision, g.Revision)
	}
	for name, c := range map[string]struct {
		edit func(map[string]any)
		want string
	}{
		"gemma":    {func(c map[string]any) { c["model_type"] = "gemma" }, `model_type "gemma"`},
		"scaling":  {func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": "yarn", "factor": 8} }, `rope_scaling of type "yarn"`},
		"llama3":   {func(c map[string]any) { c["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": -8} }, "rope_scaling"},
		"as llama": {func(c map[string]any) { c["model_type"] = "llama" }, "model.layers.0.self_attn.k_proj.bias has no place"},
		"shape":    {func(c map[string]any) { c["intermediate_size"] = 256 }, "mlp.gate_proj.weight is [128 64], want [256 64]"},
	} {
		if _, err := model.LoadHF(write(c.edit)); !errors.Is(err, model.ErrUnsupportedHF) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrUnsupportedHF naming %s", name, err, c.want)
		}
	}
	if _, err := model.LoadHF(t.TempDir()); !errors.Is(err, model.ErrUnsupportedHF) {
		t.Errorf("an empty directory: %v", err)
	}
	// A cut or corrupted file: tensors past its end, a header length past
	// the file, a header that is not JSON.
	for name, corrupt := range map[string]func([]byte) []byte{
		"cut":    func(b []byte) []byte { return b[:len(b)/2] },
		"length": func(b []byte) []byte { b[7] = 0x7f; return b },
		"header": func(b []byte) []byte { b[8] = '['; return b },
	} {
		dir := write(nil)
		path := filepath.Join(dir, "model.safetensors")
		b, _ := os.ReadFile(path)
		os.WriteFile(path, corrupt(b), 0o644)
		if _, err := model.LoadHF(dir); !errors.Is(err, model.ErrUnsupportedHF) {
			t.Errorf("%s safetensors: %v, want ErrUnsupportedHF", name, err)
		}
	}
}

// TestGGUFAndHFRevisionsCached: a GGUF file or a Hugging Face directory
// loaded a second time with the same revision cache is ready without the
// hash pass (Unverified, the same revision), and Verify then finds its
// weights the ones the revision names; an entry corrupted on disk is
// caught by Verify and forgotten.
func TestGGUFAndHFRevisionsCached(t *testing.T) {
	path := llamacpptest.WriteModel(t, t.TempDir(), llamacpptest.TinyQwen2, 1)
	g, err := model.LoadGGUF(path)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := llamacpptest.WriteHFAs(dir, g, "qwen2", false, "BF16"); err != nil {
		t.Fatal(err)
	}
	for name, load := range map[string]func(model.RevisionCache) (*model.Model, error){
		"gguf": func(rc model.RevisionCache) (*model.Model, error) { return model.LoadGGUFCached(path, rc) },
		"hf":   func(rc model.RevisionCache) (*model.Model, error) { return model.LoadHFCached(dir, rc) },
	} {
		rc := model.RevisionCache{Dir: t.TempDir()}
		first, err := load(rc)
		if err != nil {
			t.Fatal(err)
		}
		again, err := load(rc)
		if err != nil {
			t.Fatal(err)
		}
		if first.Unverified() || !again.Unverified() || again.Revision != first.Revision || again.Verify() != nil {
			t.Errorf("%s: first unverified %t, again %t, revisions %s / %s", name, first.Unverified(), again.Unverified(), first.Revision, again.Revision)
		}
		// A cache entry that lies (written over on disk): the model loads
		// on its word, Verify finds the weights are not the ones it names
		// and forgets it, and the next load hashes again.
		entries, _ := filepath.Glob(filepath.Join(rc.Dir, "*.rev"))
		if len(entries) != 1 {
			t.Fatalf("%s: cache entries %v", name, entries)
		}
		if err := os.WriteFile(entries[0], []byte(strings.Repeat("0", 32)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		lied, err := load(rc)
		if err != nil {
			t.Fatal(err)
		}
		if err := lied.Verify(); !lied.Unverified() || !errors.Is(err, model.ErrRevisionChanged) {
			t.Errorf("%s: a cached revision that lies: unverified %t, Verify %v", name, lied.Unverified(), err)
		}
		if after, err := load(rc); err != nil || after.Unverified() || after.Revision != first.Revision {
			t.Errorf("%s: after the lie was found: %v, unverified %t", name, err, after != nil && after.Unverified())
		}
	}
}
