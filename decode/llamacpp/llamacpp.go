//go:build llamacpp

// Package llamacpp is Lifeline's binding of llama.cpp: a model loaded from
// a GGUF file, its vocabulary, and a context that computes the logits of a
// batch of (sequence, position, token) inputs and holds, exports and
// imports each sequence's KV. Sampling, scheduling, grammars and stops
// stay Lifeline's: this package only computes.
//
// llama.cpp's C and C++ sources come from the ollama module in go.mod
// (its cgo packages compile them with gcc/g++, no cmake); include/ holds
// the headers of that same copy (go generate). Built with the tag
// llamacpp only: the default build stays pure Go.
package llamacpp

/*
#cgo CPPFLAGS: -I${SRCDIR}/include
#include <stdlib.h>
#include "llama.h"

static void lifeline_quiet(enum ggml_log_level level, const char *text, void *user) {
	(void)level; (void)text; (void)user;
}
static void lifeline_init(void) {
	llama_log_set(lifeline_quiet, NULL);
	llama_backend_init();
}
static const char *lifeline_gpu(size_t i) {
	ggml_backend_dev_t d = ggml_backend_dev_get(i);
	enum ggml_backend_dev_type t = ggml_backend_dev_type(d);
	if (t != GGML_BACKEND_DEVICE_TYPE_GPU && t != GGML_BACKEND_DEVICE_TYPE_IGPU) {
		return NULL;
	}
	return ggml_backend_dev_description(d);
}
static int32_t lifeline_token_at(const struct llama_batch *b, int i, llama_token tok, llama_pos pos, llama_seq_id seq, int8_t logits) {
	b->token[i] = tok;
	b->pos[i] = pos;
	b->n_seq_id[i] = 1;
	b->seq_id[i][0] = seq;
	b->logits[i] = logits;
	return 0;
}
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"

	_ "github.com/ollama/ollama/llama/llama.cpp/src"
)

var initOnce sync.Once

func initBackend() { initOnce.Do(func() { C.lifeline_init() }) }

// SystemInfo is llama.cpp's description of the CPU features it uses.
func SystemInfo() string {
	initBackend()
	return C.GoString(C.llama_print_system_info())
}

// ErrNoGPU: layers were asked for the GPU and no GPU backend is loaded
// (a CPU build would silently compute them on the CPU).
var ErrNoGPU = errors.New("llamacpp: gpu layers asked for, but no GPU backend is loaded: build one with make llamacpp-cuda and point LIFELINE_GGML_BACKENDS (or --ggml-backends) at its lib/lifeline")

var (
	backendsMu sync.Mutex
	backends   = map[string]bool{}
)

// LoadBackends loads the ggml backend libraries in dir (libggml-cuda.so
// and the libggml-base.so it links: make llamacpp-cuda's lib/lifeline)
// once per process, and returns the GPUs then known.
func LoadBackends(dir string) ([]string, error) {
	initBackend()
	backendsMu.Lock()
	defer backendsMu.Unlock()
	if dir != "" && !backends[dir] {
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("llamacpp: ggml backends: %w", err)
		}
		cdir := C.CString(dir)
		C.ggml_backend_load_all_from_path(cdir)
		C.free(unsafe.Pointer(cdir))
		backends[dir] = true
	}
	return gpus(), nil
}

// Devices describes every device of the loaded backends ("CPU: …",
// "GPU: …"), the CPU's first.
func Devices() []string {
	initBackend()
	var out []string
	for i := range C.ggml_backend_dev_count() {
		d := C.ggml_backend_dev_get(i)
		kind := "CPU"
		if C.lifeline_gpu(i) != nil {
			kind = "GPU"
		}
		out = append(out, kind+": "+C.GoString(C.ggml_backend_dev_description(d)))
	}
	return out
}

// gpus describes the GPU devices of the loaded backends.
func gpus() []string {
	var out []string
	for i := range C.ggml_backend_dev_count() {
		if d := C.lifeline_gpu(i); d != nil {
			out = append(out, C.GoString(d))
		}
	}
	return out
}

// Model is a GGUF model loaded by llama.cpp, and its vocabulary.
type Model struct {
	m     *C.struct_llama_model
	vocab *C.struct_llama_vocab
}

// ModelParams configure LoadModel.
type ModelParams struct {
	// GPULayers is how many layers go to the GPU backend (0: none); with
	// no GPU backend loaded (LoadBackends), asking for any is ErrNoGPU.
	GPULayers int
	// VocabOnly loads the vocabulary and no weights (a file may have
	// none): for tokenizing.
	VocabOnly bool
}

// LoadModel loads the GGUF file at path (check it first with
// gguf.Open: llama.cpp's own refusals say little).
func LoadModel(path string, p ModelParams) (*Model, error) {
	initBackend()
	if p.GPULayers > 0 && len(gpus()) == 0 {
		return nil, ErrNoGPU
	}
	mp := C.llama_model_default_params()
	mp.n_gpu_layers = C.int32_t(p.GPULayers)
	mp.vocab_only = C.bool(p.VocabOnly)
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	m := C.llama_model_load_from_file(cpath, mp)
	if m == nil {
		return nil, fmt.Errorf("llamacpp: llama.cpp could not load %s", path)
	}
	return &Model{m: m, vocab: C.llama_model_get_vocab(m)}, nil
}

// Close frees the model (after every context of it was closed).
func (m *Model) Close() {
	if m.m != nil {
		C.llama_model_free(m.m)
		m.m = nil
	}
}

// VocabSize is the number of tokens of the vocabulary (the logits' length).
func (m *Model) VocabSize() int { return int(C.llama_vocab_n_tokens(m.vocab)) }

// TrainContext is the context length the model was trained with.
func (m *Model) TrainContext() int { return int(C.llama_model_n_ctx_train(m.m)) }

// EOS is the end-of-sentence token, EOT the end-of-turn one (-1: none).
func (m *Model) EOS() int32 { return int32(C.llama_vocab_eos(m.vocab)) }
func (m *Model) EOT() int32 { return int32(C.llama_vocab_eot(m.vocab)) }

// BOS is the beginning-of-sentence token (-1: none).
func (m *Model) BOS() int32 { return int32(C.llama_vocab_bos(m.vocab)) }

// IsEOG says whether tok ends generation (EOS, EOT and the like).
func (m *Model) IsEOG(tok int32) bool { return bool(C.llama_vocab_is_eog(m.vocab, C.llama_token(tok))) }

// Tokenize turns text into tokens: with addSpecial the model's BOS (and
// the like) as its vocabulary says, with parseSpecial special tokens
// written in text ("<|im_start|>") as themselves.
func (m *Model) Tokenize(text string, addSpecial, parseSpecial bool) ([]int32, error) {
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	buf := make([]C.llama_token, len(text)+8)
	n := C.llama_tokenize(m.vocab, ctext, C.int32_t(len(text)), &buf[0], C.int32_t(len(buf)), C.bool(addSpecial), C.bool(parseSpecial))
	if n < 0 {
		buf = make([]C.llama_token, -n)
		n = C.llama_tokenize(m.vocab, ctext, C.int32_t(len(text)), &buf[0], C.int32_t(len(buf)), C.bool(addSpecial), C.bool(parseSpecial))
	}
	if n < 0 {
		return nil, fmt.Errorf("llamacpp: tokenize %d bytes: %d", len(text), n)
	}
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(buf[i])
	}
	return out, nil
}

// Piece is the bytes token tok stands for (a piece of a UTF-8 character
// for a byte token); special tokens as their text when special.
func (m *Model) Piece(tok int32, special bool) []byte {
	buf := make([]byte, 64)
	for {
		n := C.llama_token_to_piece(m.vocab, C.llama_token(tok), (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)), 0, C.bool(special))
		if n >= 0 {
			return buf[:n]
		}
		buf = make([]byte, -n)
	}
}

// ChatTemplate is the model's chat template (tokenizer.chat_template;
// "" when it has none).
func (m *Model) ChatTemplate() string {
	t := C.llama_model_chat_template(m.m, nil)
	if t == nil {
		return ""
	}
	return C.GoString(t)
}

// ChatMessage is one message of a chat: its role (system, user,
// assistant) and content.
type ChatMessage struct{ Role, Content string }

// ErrUnknownTemplate: llama.cpp does not render this chat template.
var ErrUnknownTemplate = errors.New("llamacpp: a chat template llama.cpp does not render")

// ApplyTemplate renders msgs with the chat template tmpl (a model's
// tokenizer.chat_template; ChatTemplate) as llama.cpp does: it recognizes
// the template's family (ChatML, Llama 3, Mistral, Gemma, Phi, … about
// forty) by its markers and renders that family's format, without a
// Jinja engine. With addAssistant the prompt ends where the assistant's
// reply begins. A template of no family it knows is ErrUnknownTemplate.
func ApplyTemplate(tmpl string, msgs []ChatMessage, addAssistant bool) (string, error) {
	if tmpl == "" {
		return "", fmt.Errorf("%w: the model has none", ErrUnknownTemplate)
	}
	ctmpl := C.CString(tmpl)
	defer C.free(unsafe.Pointer(ctmpl))
	for _, m := range msgs {
		if strings.ContainsRune(m.Role, 0) || strings.ContainsRune(m.Content, 0) {
			return "", fmt.Errorf("llamacpp: a %s message holds a NUL byte", m.Role)
		}
	}
	mem := C.malloc(C.size_t(max(len(msgs), 1)) * C.size_t(unsafe.Sizeof(C.struct_llama_chat_message{})))
	defer C.free(mem)
	chat := unsafe.Slice((*C.struct_llama_chat_message)(mem), len(msgs))
	size := 64
	for i, m := range msgs {
		chat[i].role, chat[i].content = C.CString(m.Role), C.CString(m.Content)
		defer C.free(unsafe.Pointer(chat[i].role))
		defer C.free(unsafe.Pointer(chat[i].content))
		size += 2 * (len(m.Role) + len(m.Content) + 32)
	}
	for {
		buf := make([]byte, size)
		n := C.llama_chat_apply_template(ctmpl, unsafe.SliceData(chat), C.size_t(len(msgs)), C.bool(addAssistant), (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)))
		switch {
		case n < 0:
			first, _, _ := strings.Cut(tmpl, "\n")
			return "", fmt.Errorf("%w (it begins %q)", ErrUnknownTemplate, first[:min(len(first), 80)])
		case int(n) <= len(buf):
			return string(buf[:n]), nil
		}
		size = int(n)
	}
}

// ContextParams configure a context.
type ContextParams struct {
	// Context is the positions each sequence may hold; Sequences how many
	// sequences the context serves at once (one KV stream each: not
	// unified, so a sequence's logits do not depend on its neighbours).
	Context, Sequences int
	// Batch is the most inputs one Decode takes.
	Batch int
	// Threads computes; 0: every CPU.
	Threads int
	// FlashAttention turns flash attention on (else off: fixed either
	// way, never llama.cpp's automatic choice).
	FlashAttention bool
}

// Context computes logits and holds KV for a model's sequences. It is
// not safe for concurrent use.
type Context struct {
	c      *C.struct_llama_context
	m      *Model
	batch  C.struct_llama_batch
	max    int
	vocab  int
	logits []int // the batch index of each input that wants logits
	// streams is the KV streams: one per sequence (not unified).
	streams int
	// importBuf is kept from one Import to the next (first touches of
	// fresh memory cost more than the import).
	importBuf []byte
}

// Errors of Decode.
var (
	ErrNoSlot   = errors.New("llamacpp: no KV slot for the batch (the context is full)")
	ErrTooLarge = errors.New("llamacpp: more inputs than the context's batch")
)

// NewContext makes a context of m.
func (m *Model) NewContext(p ContextParams) (*Context, error) {
	if p.Context < 1 || p.Sequences < 1 || p.Batch < 1 {
		return nil, fmt.Errorf("llamacpp: context %d, sequences %d, batch %d: all must be positive", p.Context, p.Sequences, p.Batch)
	}
	cp := C.llama_context_default_params()
	cp.n_ctx = C.uint32_t(p.Context * p.Sequences)
	cp.n_batch, cp.n_ubatch = C.uint32_t(p.Batch), C.uint32_t(p.Batch)
	cp.n_seq_max = C.uint32_t(p.Sequences)
	threads := p.Threads
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	cp.n_threads, cp.n_threads_batch = C.int32_t(threads), C.int32_t(threads)
	cp.kv_unified = false
	cp.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_DISABLED
	if p.FlashAttention {
		cp.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_ENABLED
	}
	c := C.llama_init_from_model(m.m, cp)
	if c == nil {
		return nil, fmt.Errorf("llamacpp: llama.cpp could not make a context of %d positions × %d sequences", p.Context, p.Sequences)
	}
	return &Context{c: c, m: m, batch: C.llama_batch_init(C.int32_t(p.Batch), 0, 1), max: p.Batch, vocab: m.VocabSize(), streams: p.Sequences}, nil
}

// Close frees the context.
func (c *Context) Close() {
	if c.c != nil {
		C.llama_batch_free(c.batch)
		C.llama_free(c.c)
		c.c = nil
	}
}

// Input is one token of one sequence at a position; Logits asks for the
// logits after it.
type Input struct {
	Seq, Pos, Token int32
	Logits          bool
}

// Decode computes one batch: every input's K and V go into its sequence's
// cache, and the logits of those that asked are kept until the next
// Decode (Logits).
func (c *Context) Decode(in []Input) error {
	if len(in) > c.max {
		return fmt.Errorf("%w: %d inputs, batch %d", ErrTooLarge, len(in), c.max)
	}
	for _, x := range in {
		if err := c.checkSeq(x.Seq); err != nil {
			return err
		}
	}
	c.logits = c.logits[:0]
	for i, x := range in {
		l := C.int8_t(0)
		if x.Logits {
			l = 1
			c.logits = append(c.logits, i)
		}
		C.lifeline_token_at(&c.batch, C.int(i), C.llama_token(x.Token), C.llama_pos(x.Pos), C.llama_seq_id(x.Seq), l)
	}
	c.batch.n_tokens = C.int32_t(len(in))
	switch rc := C.llama_decode(c.c, c.batch); {
	case rc == 1:
		return ErrNoSlot
	case rc != 0:
		return fmt.Errorf("llamacpp: llama_decode: %d", rc)
	}
	return nil
}

// Logits copies into dst (grown to the vocabulary) the logits after the
// i-th input of the last Decode that asked for them.
func (c *Context) Logits(i int, dst []float32) ([]float32, error) {
	if i < 0 || i >= len(c.logits) {
		return dst, fmt.Errorf("llamacpp: logits %d of %d", i, len(c.logits))
	}
	p := C.llama_get_logits_ith(c.c, C.int32_t(c.logits[i]))
	if p == nil {
		return dst, fmt.Errorf("llamacpp: no logits for input %d", c.logits[i])
	}
	return append(dst[:0], unsafe.Slice((*float32)(unsafe.Pointer(p)), c.vocab)...), nil
}

// Forget drops sequence seq's KV from position from on (0: all of it).
func (c *Context) Forget(seq, from int32) {
	if c.checkSeq(seq) != nil {
		return
	}
	C.llama_memory_seq_rm(C.llama_get_memory(c.c), C.llama_seq_id(seq), C.llama_pos(from), -1)
}

// Export is sequence seq's whole state (its KV cells: positions, K and
// V per layer) in a form any context of the same model and settings
// imports, whatever its number of sequences: llama.cpp writes one section
// per KV stream, all empty but the sequence's own, behind their count,
// and refuses a count other than its own; Export keeps the one section.
func (c *Context) Export(seq int32) ([]byte, error) {
	var buf []byte
	state, err := c.ExportInto(seq, &buf)
	if err != nil {
		return nil, err
	}
	return slices.Clone(state), nil
}

// KeptBuffer is the largest state buffer kept from one export or import
// to the next: larger states (long contexts of large models) pay the
// first touches of fresh memory again rather than hold that much host
// memory for good.
const KeptBuffer = 64 << 20

// ExportInto is Export into *buf, grown when it is too small and kept
// for the next: the state is a part of *buf, valid until its next use.
// (A fresh buffer per export costs more than the export where first
// touches of memory are dear: 35 ms against 1 ms for 8 MiB on these VMs.)
func (c *Context) ExportInto(seq int32, buf *[]byte) ([]byte, error) {
	if err := c.checkSeq(seq); err != nil {
		return nil, err
	}
	n := C.llama_state_seq_get_size(c.c, C.llama_seq_id(seq))
	if n == 0 {
		return nil, fmt.Errorf("llamacpp: sequence %d holds nothing", seq)
	}
	if cap(*buf) < int(n) {
		*buf = make([]byte, n+n/4)
	}
	b := (*buf)[:n]
	if got := C.llama_state_seq_get_data(c.c, (*C.uint8_t)(unsafe.Pointer(&b[0])), n, C.llama_seq_id(seq)); got != n {
		return nil, fmt.Errorf("llamacpp: export of sequence %d: %d of %d bytes", seq, got, n)
	}
	return section(b)
}

// section is the one non-empty stream section of a sequence's state.
func section(b []byte) ([]byte, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("llamacpp: a state of %d bytes", len(b))
	}
	streams := int(binary.LittleEndian.Uint32(b))
	for k := 0; k < streams && 4+4*k+4 <= len(b); k++ {
		if binary.LittleEndian.Uint32(b[4+4*k:]) == 0 {
			continue
		}
		end := len(b) - 4*(streams-k-1)
		if end < 4+4*k || slices.ContainsFunc(b[end:], func(x byte) bool { return x != 0 }) {
			return nil, fmt.Errorf("llamacpp: a state of %d streams with more than one holding the sequence", streams)
		}
		return b[4+4*k : end], nil
	}
	return nil, fmt.Errorf("llamacpp: a state of %d streams, all empty", streams)
}

// Import replaces sequence seq's state with one Export made (of a
// context of the same model and settings).
func (c *Context) Import(seq int32, state []byte) error {
	if err := c.checkSeq(seq); err != nil {
		return err
	}
	if len(state) < 4 {
		return fmt.Errorf("llamacpp: import into sequence %d: a state of %d bytes", seq, len(state))
	}
	if need := 4 + len(state) + 4*c.streams; cap(c.importBuf) < need {
		c.importBuf = make([]byte, 0, need)
	}
	b := binary.LittleEndian.AppendUint32(c.importBuf[:0], uint32(c.streams))
	b = append(b, state...)
	for range c.streams - 1 {
		b = binary.LittleEndian.AppendUint32(b, 0)
	}
	n := C.llama_state_seq_set_data(c.c, (*C.uint8_t)(unsafe.Pointer(&b[0])), C.size_t(len(b)), C.llama_seq_id(seq))
	if cap(c.importBuf) > KeptBuffer {
		c.importBuf = nil // not held for good: a long context of a large model
	}
	if n == 0 {
		c.Forget(seq, 0) // what llama.cpp restored before it failed
		return fmt.Errorf("llamacpp: llama.cpp refused a state of %d bytes for sequence %d", len(state), seq)
	}
	return nil
}

// checkSeq refuses a sequence id the context does not have (llama.cpp
// would abort the process).
func (c *Context) checkSeq(seq int32) error {
	if seq < 0 || int(seq) >= c.streams {
		return fmt.Errorf("llamacpp: sequence %d of a context of %d", seq, c.streams)
	}
	return nil
}

// LlamaGreedy is llama.cpp's own greedy choice (its greedy sampler) over
// the logits of the i-th input of the last Decode that asked for them:
// the reference Lifeline's token choice is compared with.
func (c *Context) LlamaGreedy(i int) (int32, error) {
	if i < 0 || i >= len(c.logits) {
		return 0, fmt.Errorf("llamacpp: logits %d of %d", i, len(c.logits))
	}
	smpl := C.llama_sampler_init_greedy()
	defer C.llama_sampler_free(smpl)
	return int32(C.llama_sampler_sample(smpl, c.c, C.int32_t(c.logits[i]))), nil
}

// TypeTraits is ggml's elements per block and bytes per block of tensor
// type t (ggml_blck_size, ggml_type_size).
func TypeTraits(t int) (block, size int) {
	return int(C.ggml_blck_size(C.enum_ggml_type(t))), int(C.ggml_type_size(C.enum_ggml_type(t)))
}
