package decode

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// DefaultLlamaCppContext caps a llama.cpp engine's context when
// Options.ContextLen does not: every slot holds this many positions of
// KV, so a model's trained context (32,768 for Qwen2.5) times the slots
// would not fit a small host.
const DefaultLlamaCppContext = 4096

// DefaultLlamaCppLimits are a llama.cpp engine's limits when Options
// does not set them: fewer slots than the reference engine's, each with
// a whole context of KV reserved in llama.cpp.
var DefaultLlamaCppLimits = sched.Limits{MaxRunning: 16, MaxQueued: 64, MaxStepTokens: 512}

// ErrNoLlamaCpp is the error of a llama.cpp engine in a binary built
// without llama.cpp.
var ErrNoLlamaCpp = errors.New("this binary was built without llama.cpp: build it with `go build -tags llamacpp ./cmd/lifeline` or `make build-llamacpp` (needs gcc and g++; about 5 minutes the first time)")

// newLlamaCppEngine starts a llama.cpp engine (llamacpp.go); nil in a
// binary built without llama.cpp.
var newLlamaCppEngine = func(opts Options) (*Engine, error) {
	return nil, fmt.Errorf("%s: %w", opts.ModelPath, ErrNoLlamaCpp)
}

// validateLlamaCpp checks the options of a llama.cpp engine, and its
// GGUF file: a file llama.cpp cannot serve is refused by name here, not
// by a crash of the worker.
func (o *Options) validateLlamaCpp() error {
	switch {
	case o.ModelPath == "":
		return badField("model", "the llamacpp engine serves a GGUF file: set its path")
	case o.TokenizerPath != "":
		return badField("tokenizer", "a GGUF file holds its own vocabulary: no tokenizer file")
	case o.TP > 1:
		return badField("tp", "tensor parallelism is the reference engine's; llama.cpp splits a model over GPUs itself")
	case o.speculates():
		return badField("draft", "speculative decoding is the reference engine's")
	case o.ContextLen < 0 || o.Threads < 0 || o.GPULayers < 0:
		return badField("context", "context %d, threads %d, gpu layers %d: none may be negative", o.ContextLen, o.Threads, o.GPULayers)
	}
	_, err := CheckGGUF(o.ModelPath)
	return err
}

// CheckGGUF reads the header of the GGUF file at path and checks that
// the llama.cpp this project links serves it; the error names what is
// wrong (a missing file, not GGUF, truncated, an architecture or tensor
// type it does not know). It returns the file's one-line summary.
func CheckGGUF(path string) (string, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return "", err
	}
	if err := f.Check(); err != nil {
		return "", err
	}
	return f.Summary(), nil
}

// GGUFName is the model id a GGUF file or a Hugging Face directory is
// served under by default: its base name without .gguf.
func GGUFName(path string) string {
	return strings.TrimSuffix(filepath.Base(filepath.Clean(path)), ".gguf")
}

// addsBOS says whether prompts under tok start with BOS (a vocabulary
// may say not: qwen2's).
func addsBOS(tok tokenizer.Tokenizer) bool {
	if b, ok := tok.(interface{ AddBOS() bool }); ok {
		return b.AddBOS()
	}
	return true
}

// endTokens are the tokens that end generation under tok: its EOS, or
// every end-of-generation token a vocabulary names (EOS, EOT, a chat
// template's end of turn).
func endTokens(tok tokenizer.Tokenizer) []int {
	if g, ok := tok.(interface{ EndOfGeneration() []int }); ok {
		return g.EndOfGeneration()
	}
	return []int{tok.EOS()}
}

// ChatMessage is one message of a conversation: role and text.
type ChatMessage struct{ Role, Content string }

// ChatTemplated says whether the engine renders conversations with its
// model's own chat template (Request.Messages).
func (e *Engine) ChatTemplated() bool { return e.chat != nil }

// renderChat makes r's prompt from its messages when the model has a
// chat template of its own; a conversation the template cannot render
// is refused by name.
func (e *Engine) renderChat(r *Request) error {
	if len(r.Messages) == 0 || e.chat == nil {
		return nil
	}
	p, err := e.chat(r.Messages)
	if err != nil {
		return badField("messages", "%v", err)
	}
	r.Prompt = p
	return nil
}
