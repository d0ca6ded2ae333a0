package llamacpptest

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/model"
)

// WriteHF writes m as a Hugging Face model directory (config.json and
// one model.safetensors, F32) of model type typ ("llama" or "qwen2").
// Hugging Face keeps query and key rows in the rotate-half layout; a
// model read from a llama GGUF has them in llama.cpp's interleaved
// layout (its converter permutes them), so with fromLlamaGGUF the rows
// are put back as Hugging Face has them.
func WriteHF(dir string, m *model.Model, typ string, fromLlamaGGUF bool) error {
	return WriteHFAs(dir, m, typ, fromLlamaGGUF, "F32")
}

// WriteHFAs is WriteHF with every tensor stored as dtype: "F32", "F16"
// or "BF16" (rounded to nearest even), as real checkpoints are.
func WriteHFAs(dir string, m *model.Model, typ string, fromLlamaGGUF bool, dtype string) error {
	c := m.Config
	cfg := map[string]any{"architectures": []string{"X"}, "model_type": typ, "hidden_size": c.Dim, "intermediate_size": c.HiddenDim,
		"num_hidden_layers": c.Layers, "num_attention_heads": c.Heads, "num_key_value_heads": c.KVHeads, "vocab_size": c.VocabSize,
		"max_position_embeddings": c.ContextLen, "rope_theta": c.RopeTheta, "rms_norm_eps": c.NormEps, "tie_word_embeddings": false,
		"torch_dtype": map[string]string{"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype]}
	if c.RopeFreqFactors != nil {
		cfg["rope_scaling"] = Llama3Scaling.JSON() // the scaling the test models are written with
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		return err
	}
	if err := WriteHFTokenizer(dir, HFTokenizerOf(typ)); err != nil {
		return err
	}
	type entry struct {
		name  string
		shape []int
		data  []float32
	}
	unperm := func(w []float32, heads int) []float32 {
		if !fromLlamaGGUF {
			return w
		}
		hd, out := c.HeadSize(), make([]float32, len(w))
		for h := range heads {
			for i := range hd / 2 {
				for j := range 2 { // GGUF row h·hd+2i+j is HF row h·hd+j·hd/2+i
					copy(out[(h*hd+j*hd/2+i)*c.Dim:][:c.Dim], w[(h*hd+2*i+j)*c.Dim:][:c.Dim])
				}
			}
		}
		return out
	}
	es := []entry{{"model.embed_tokens.weight", []int{c.VocabSize, c.Dim}, m.W.Embedding}, {"model.norm.weight", []int{c.Dim}, m.W.FinalNorm},
		{"lm_head.weight", []int{c.VocabSize, c.Dim}, m.W.Classifier}}
	for i, l := range m.W.Layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		es = append(es, entry{p + "input_layernorm.weight", []int{c.Dim}, l.AttnNorm}, entry{p + "self_attn.q_proj.weight", []int{c.Dim, c.Dim}, unperm(l.Wq, c.Heads)},
			entry{p + "self_attn.k_proj.weight", []int{c.KVDim(), c.Dim}, unperm(l.Wk, c.KVHeads)}, entry{p + "self_attn.v_proj.weight", []int{c.KVDim(), c.Dim}, l.Wv},
			entry{p + "self_attn.o_proj.weight", []int{c.Dim, c.Dim}, l.Wo}, entry{p + "post_attention_layernorm.weight", []int{c.Dim}, l.FFNNorm},
			entry{p + "mlp.gate_proj.weight", []int{c.HiddenDim, c.Dim}, l.W1}, entry{p + "mlp.down_proj.weight", []int{c.Dim, c.HiddenDim}, l.W2},
			entry{p + "mlp.up_proj.weight", []int{c.HiddenDim, c.Dim}, l.W3})
		if l.Bq != nil {
			es = append(es, entry{p + "self_attn.q_proj.bias", []int{c.Dim}, l.Bq}, entry{p + "self_attn.k_proj.bias", []int{c.KVDim()}, l.Bk},
				entry{p + "self_attn.v_proj.bias", []int{c.KVDim()}, l.Bv})
		}
	}
	sort.Slice(es, func(i, j int) bool { return es[i].name < es[j].name })
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var body []byte
	for _, e := range es {
		start := len(body)
		switch dtype {
		case "F16":
			body = append(body, encode(gguf.F16, e.data)...)
		case "BF16":
			body = append(body, encode(gguf.BF16, e.data)...)
		default:
			for _, v := range e.data {
				body = binary.LittleEndian.AppendUint32(body, math.Float32bits(v))
			}
		}
		hdr[e.name] = map[string]any{"dtype": dtype, "shape": e.shape, "data_offsets": []int{start, len(body)}}
	}
	h, err := json.Marshal(hdr)
	if err != nil {
		return err
	}
	for len(h)%8 != 0 { // the data starts 8-byte aligned, as writers pad it
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(append(out, h...), body...)
	return os.WriteFile(filepath.Join(dir, "model.safetensors"), out, 0o644)
}
