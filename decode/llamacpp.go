//go:build llamacpp

package decode

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/kvcache"
	"github.com/lifeline-llm/lifeline/decode/llamacpp"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sched"
)

func init() { newLlamaCppEngine = openLlamaCpp }

// openLlamaCpp starts an engine whose scheduler computes through
// llama.cpp: one context, a KV stream per slot. Its KV stays in the
// context (not the node's arena); its store only counts blocks.
func openLlamaCpp(opts Options) (*Engine, error) {
	rev, err := model.FileRevision(opts.ModelPath, model.RevisionCache{Dir: opts.RevisionCache})
	if err != nil {
		return nil, err
	}
	m, err := llamacpp.LoadModel(opts.ModelPath, llamacpp.ModelParams{GPULayers: opts.GPULayers})
	if err != nil {
		return nil, err
	}
	ctxLen := min(m.TrainContext(), cmpOr(opts.ContextLen, DefaultLlamaCppContext))
	limits := opts.Limits
	if limits == (sched.Limits{}) {
		limits = DefaultLlamaCppLimits
	}
	eng, err := m.NewEngine(ctxLen, limits.Slots(), limits.MaxStepTokens, opts.Threads)
	if err != nil {
		m.Close()
		return nil, err
	}
	closeAll := func() error { eng.Close(); m.Close(); return nil }
	bs := cmpOr(opts.BlockSize, kvcache.DefaultBlockSize)
	store, err := kvcache.NewMemStore(kvcache.NewLayout(1, 1, bs), limits.Slots()*((ctxLen+bs-1)/bs))
	if err != nil {
		closeAll()
		return nil, err
	}
	s, err := sched.NewOn(eng, store, limits)
	if err != nil {
		closeAll()
		return nil, err
	}
	info := modelInfo{name: opts.ServedName, revision: rev, numerics: llamaCppNumerics(m, opts),
		contextLen: ctxLen, vocabSize: m.VocabSize()}
	if info.name == "" {
		info.name = GGUFName(opts.ModelPath)
	}
	e := startEngine(s, m.Tokenizer(), info)
	e.Store = store
	e.chat = chatTemplate(m.ChatTemplate())
	e.closers = append(e.closers, closeAll)
	return e, nil
}

// llamaCppNumerics names what a llama.cpp engine's arithmetic depends
// on: the llama.cpp commit, the CPU kernels the build chose (a hash of
// llama.cpp's system info), the GPU layers, the weight type, the KV type,
// flash attention and the KV streams.
func llamaCppNumerics(m *llamacpp.Model, opts Options) string {
	sys := sha256.Sum256([]byte(llamacpp.SystemInfo()))
	desc := strings.Fields(m.Desc())
	weights := "unknown"
	if len(desc) > 0 {
		weights = desc[len(desc)-1]
	}
	return fmt.Sprintf("llamacpp=%s;cpu=%s;gpu_layers=%d;weights=%s;kv=f16;flash_attn=off;kv_unified=off",
		gguf.LlamaCppCommit, hex.EncodeToString(sys[:6]), opts.GPULayers, weights)
}

// chatTemplate renders conversations with template tmpl through
// llama.cpp's llama_chat_apply_template (nil: no template). llama.cpp's
// renderer is the reference a GGUF model's users know from llama-server;
// a template it does not recognise is refused per request, naming the
// way out (completions with a prompt rendered by the client).
func chatTemplate(tmpl string) func([]ChatMessage) (string, error) {
	if tmpl == "" {
		return nil
	}
	return func(msgs []ChatMessage) (string, error) {
		in := make([]llamacpp.ChatMessage, len(msgs))
		for i, m := range msgs {
			in[i] = llamacpp.ChatMessage{Role: m.Role, Content: m.Content}
		}
		p, err := llamacpp.ApplyTemplate(tmpl, in, true)
		if err != nil {
			return "", fmt.Errorf("%w: send the rendered prompt to /v1/completions instead", err)
		}
		return p, nil
	}
}
