//go:build llamacpp

package llamacpp

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
)

// TestTypeTraitsMatchGGML: the gguf package's table of tensor types (what
// a file is checked against before llama.cpp sees it) is ggml's own.
func TestTypeTraitsMatchGGML(t *testing.T) {
	for typ := range 40 {
		tt := gguf.TensorType(typ)
		if tt.Block() == 0 {
			continue // removed from ggml
		}
		block, size := TypeTraits(typ)
		if block != tt.Block() || size != tt.BlockBytes() {
			t.Errorf("%s: ggml says %d per block of %d bytes, gguf %d of %d", tt, block, size, tt.Block(), tt.BlockBytes())
		}
	}
}

func load(t *testing.T) *Model { t.Helper(); return loadShape(t, llamacpptest.Tiny) }

func loadShape(t *testing.T, s llamacpptest.Shape) *Model {
	t.Helper()
	path := llamacpptest.WriteModel(t, t.TempDir(), s, 1)
	if f, err := gguf.Open(path); err != nil || f.Check() != nil {
		t.Fatalf("the test model: %v %v", err, f.Check())
	}
	m, err := LoadModel(path, ModelParams{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TestTokenizeRoundTrip: text tokenized by the file's own vocabulary and
// detokenized piece by piece comes back byte for byte (Unicode through
// byte tokens, whitespace, code, CJK).
func TestTokenizeRoundTrip(t *testing.T) {
	m := load(t)
	if m.BOS() != 1 || m.EOS() != 2 || !m.IsEOG(2) || m.IsEOG(5) {
		t.Fatalf("bos %d eos %d", m.BOS(), m.EOS())
	}
	for _, text := range []string{"Once upon a time", "  two  spaces\tand a tab\n", "func main() { fmt.Println(\"hi\") }", "世界你好, ünïcödé 🙂", "x"} {
		toks, err := m.Tokenize(text, true, false)
		if err != nil {
			t.Fatal(err)
		}
		if toks[0] != m.BOS() {
			t.Fatalf("%q: no BOS first: %v", text, toks)
		}
		var b []byte
		for _, tok := range toks[1:] {
			b = append(b, m.Piece(tok, false)...)
		}
		// SentencePiece adds a space before the text; detokenizing the
		// first piece gives it back.
		if got := strings.TrimPrefix(string(b), " "); got != text {
			t.Errorf("%q: round trip %q (tokens %v)", text, got, toks)
		}
	}
}

// greedy decodes n tokens of seq from prompt (fed in chunks of chunk),
// alone in c, and returns every logits vector after the prompt's last
// token and each generated one.
func greedy(t *testing.T, c *Context, seq int32, prompt []int32, chunk, n int) [][]float32 {
	t.Helper()
	var out [][]float32
	pos := int32(0)
	for i := 0; i < len(prompt); i += chunk {
		var in []Input
		for j := i; j < min(i+chunk, len(prompt)); j++ {
			in = append(in, Input{Seq: seq, Pos: pos, Token: prompt[j], Logits: j == len(prompt)-1})
			pos++
		}
		if err := c.Decode(in); err != nil {
			t.Fatal(err)
		}
	}
	l, err := c.Logits(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, l)
	for range n {
		tok := int32(Argmax(l))
		if err := c.Decode([]Input{{Seq: seq, Pos: pos, Token: tok, Logits: true}}); err != nil {
			t.Fatal(err)
		}
		pos++
		if l, err = c.Logits(0, nil); err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

func sameBits(a, b [][]float32) (int, bool) {
	if len(a) != len(b) {
		return -1, false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return i, false
		}
		for j := range a[i] {
			if math.Float32bits(a[i][j]) != math.Float32bits(b[i][j]) {
				return i, false
			}
		}
	}
	return 0, true
}

// TestDeterminism: with a KV stream per sequence, a sequence's logits
// are the same bits whether its prompt comes whole, token by token or in
// chunks, and whether other sequences share its batches.
func TestDeterminism(t *testing.T) {
	m := load(t)
	prompt, err := m.Tokenize("Once upon a time, in a small town by the river, the children watched the boats", true, false)
	if err != nil {
		t.Fatal(err)
	}
	newCtx := func() *Context {
		c, err := m.NewContext(ContextParams{Context: 256, Sequences: 4, Batch: 256, Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	ref := greedy(t, newCtx(), 0, prompt, len(prompt), 12)
	for _, chunk := range []int{1, 5} {
		if i, ok := sameBits(greedy(t, newCtx(), 0, prompt, chunk, 12), ref); !ok {
			t.Errorf("prompt in chunks of %d: logits %d differ", chunk, i)
		}
	}
	// The same sequence as seq 2 among two others decoded in the same
	// batches.
	c := newCtx()
	other, _ := m.Tokenize("A completely different prompt about ships and the sea", true, false)
	var in []Input
	for i, tok := range prompt {
		in = append(in, Input{Seq: 2, Pos: int32(i), Token: tok, Logits: i == len(prompt)-1})
	}
	for s := int32(0); s < 2; s++ {
		for i, tok := range other[:len(other)-int(s)] {
			in = append(in, Input{Seq: s, Pos: int32(i), Token: tok})
		}
	}
	if err := c.Decode(in); err != nil {
		t.Fatal(err)
	}
	l, _ := c.Logits(0, nil)
	got := [][]float32{l}
	pos := [3]int32{int32(len(other)), int32(len(other) - 1), int32(len(prompt))}
	for range 12 {
		tok := int32(Argmax(l))
		batch := []Input{{Seq: 0, Pos: pos[0], Token: 7, Logits: true}, {Seq: 2, Pos: pos[2], Token: tok, Logits: true}, {Seq: 1, Pos: pos[1], Token: 9, Logits: true}}
		if err := c.Decode(batch); err != nil {
			t.Fatal(err)
		}
		for i := range pos {
			pos[i]++
		}
		if l, err = c.Logits(1, nil); err != nil {
			t.Fatal(err)
		}
		got = append(got, l)
	}
	if i, ok := sameBits(got, ref); !ok {
		t.Errorf("in a batch of 3: logits %d differ", i)
	}
}

// TestExportImport: a sequence's state exported from one context and
// imported into another (another sequence id, other sequences present)
// continues with the same logits as the sequence that never moved.
func TestExportImport(t *testing.T) {
	m := load(t)
	prompt, _ := m.Tokenize("The old mill by the river turned all day", true, false)
	a, err := m.NewContext(ContextParams{Context: 256, Sequences: 2, Batch: 64, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ref := greedy(t, a, 0, prompt, len(prompt), 20)
	// Again, exported after the prompt and 5 tokens.
	a.Forget(0, 0)
	head := greedy(t, a, 0, prompt, len(prompt), 5)
	state, err := a.Export(0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.NewContext(ContextParams{Context: 256, Sequences: 3, Batch: 64, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	greedy(t, b, 0, []int32{1, 50, 60, 70}, 4, 2) // a neighbour
	if err := b.Import(2, state); err != nil {
		t.Fatal(err)
	}
	l := head[len(head)-1]
	got := slices.Clone(head)
	pos := int32(len(prompt) + 5)
	for range 15 {
		if err := b.Decode([]Input{{Seq: 2, Pos: pos, Token: int32(Argmax(l)), Logits: true}}); err != nil {
			t.Fatal(err)
		}
		pos++
		if l, err = b.Logits(0, nil); err != nil {
			t.Fatal(err)
		}
		got = append(got, l)
	}
	if i, ok := sameBits(got, ref); !ok {
		t.Fatalf("continued after import: logits %d differ (state %d bytes)", i, len(state))
	}
	t.Logf("state of %d positions: %d bytes", len(prompt)+5, len(state))
	if err := b.Import(1, state[:len(state)/2]); err == nil {
		t.Fatal("half a state was imported")
	}
}

// TestGreedyIsLlamaCppsGreedy: Lifeline's sampler at temperature 0 over
// llama.cpp's logits chooses what llama.cpp's own greedy sampler does, at
// every one of 40 positions, and the streamed text is the pieces joined.
func TestGreedyIsLlamaCppsGreedy(t *testing.T) {
	m := load(t)
	c, err := m.NewContext(ContextParams{Context: 256, Sequences: 1, Batch: 64, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var ours []int32
	var text strings.Builder
	finish, err := Generate(t.Context(), m, c, GenerateRequest{Prompt: "Once upon a time", MaxTokens: 40, IgnoreEOS: true}, func(tk Token) {
		ours = append(ours, tk.ID)
		text.WriteString(tk.Text)
	})
	if err != nil || finish != "length" || len(ours) != 40 {
		t.Fatalf("%v %s %d tokens", err, finish, len(ours))
	}
	// llama.cpp's own loop, its greedy sampler choosing.
	prompt, _ := m.Tokenize("Once upon a time", true, false)
	c.Forget(0, 0)
	var in []Input
	for i, tok := range prompt {
		in = append(in, Input{Seq: 0, Pos: int32(i), Token: tok, Logits: i == len(prompt)-1})
	}
	var theirs []int32
	for n := 0; n < 40; n++ {
		if err := c.Decode(in); err != nil {
			t.Fatal(err)
		}
		tok, err := c.LlamaGreedy(0)
		if err != nil {
			t.Fatal(err)
		}
		theirs = append(theirs, tok)
		in = []Input{{Seq: 0, Pos: int32(len(prompt) + n), Token: tok, Logits: true}}
	}
	if !slices.Equal(ours, theirs) {
		t.Fatalf("ours %v\nllama.cpp's %v", ours, theirs)
	}
	var joined []byte
	for _, id := range ours {
		joined = append(joined, m.Piece(id, false)...)
	}
	if text.String() != string(joined) {
		t.Fatalf("streamed %q, pieces %q", text.String(), joined)
	}
}

// TestStreamedTextNeverSplitsACharacter: byte tokens of a 4-byte
// character come out as one piece of text, once whole.
func TestStreamedTextNeverSplitsACharacter(t *testing.T) {
	var pending []byte
	var got []string
	for _, b := range []byte("a🙂b") {
		pending = append(pending, b)
		got = append(got, completeUTF8(&pending))
	}
	if want := []string{"a", "", "", "", "🙂", "b"}; !slices.Equal(got, want) {
		t.Fatalf("%q, want %q", got, want)
	}
}

// TestChatTemplates: the chat templates of Qwen (ChatML, read from the
// model file), Llama 3 and Mistral render as those models expect; one
// llama.cpp does not know is refused, typed.
func TestChatTemplates(t *testing.T) {
	msgs := []ChatMessage{{"system", "Be brief."}, {"user", "Hi 世界"}}
	for _, c := range []struct{ name, tmpl, want string }{
		{"chatml (the test model's own)", load(t).ChatTemplate(),
			"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 世界<|im_end|>\n<|im_start|>assistant\n"},
		{"llama3", "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
			"<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi 世界<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
	} {
		got, err := ApplyTemplate(c.tmpl, msgs, true)
		if err != nil || got != c.want {
			t.Errorf("%s: %q %v\nwant %q", c.name, got, err, c.want)
		}
	}
	mistral := "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% endif %}{% endfor %}"
	got, err := ApplyTemplate(mistral, []ChatMessage{{"user", "Hi 世界"}}, true)
	if err != nil || got != "[INST] Hi 世界 [/INST]" { // BOS comes from the tokenizer
		t.Errorf("mistral: %q %v", got, err)
	}
	if _, err := ApplyTemplate("{{ messages | my_own_format }}", msgs, true); !errors.Is(err, ErrUnknownTemplate) {
		t.Errorf("an unknown template: %v", err)
	}
}

// TestQwen2ByteLevelBPE: a qwen2 model with a byte-level BPE vocabulary
// (GPT-2's byte alphabet, merges, Qwen's pre-tokenizer and special
// tokens) loads; text round-trips exactly (no BOS, no space added);
// special tokens parse when asked; greedy decoding runs and stays
// bit-identical across chunked and whole prompts.
func TestQwen2ByteLevelBPE(t *testing.T) {
	m := loadShape(t, llamacpptest.TinyQwen2)
	for _, text := range []string{"Once upon a time", "  two  spaces\tand a tab\n", "func main() { fmt.Println(\"hi\") }", "世界你好, ünïcödé 🙂"} {
		toks, err := m.Tokenize(text, true, false)
		if err != nil {
			t.Fatal(err)
		}
		var b []byte
		for _, tok := range toks {
			b = append(b, m.Piece(tok, false)...)
		}
		if string(b) != text {
			t.Errorf("%q: round trip %q (tokens %v)", text, b, toks)
		}
	}
	// The merges apply: whole words, not a token per byte.
	if toks, _ := m.Tokenize(" once upon a time", false, false); len(toks) > 5 {
		t.Errorf("%q is %d tokens: the merges did not apply", " once upon a time", len(toks))
	}
	im, err := m.Tokenize("<|im_start|>user", false, true)
	if err != nil || len(im) < 2 || string(m.Piece(im[0], true)) != "<|im_start|>" || m.IsEOG(im[0]) {
		t.Fatalf("special tokens: %v %v", im, err)
	}
	if end, _ := m.Tokenize("<|im_end|>", false, true); len(end) != 1 || !m.IsEOG(end[0]) {
		t.Fatalf("<|im_end|> is %v, not the end of generation", end)
	}
	c, err := m.NewContext(ContextParams{Context: 256, Sequences: 2, Batch: 64, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prompt, _ := m.Tokenize("The children watched the boats go by", true, false)
	ref := greedy(t, c, 0, prompt, len(prompt), 10)
	if i, ok := sameBits(greedy(t, c, 1, prompt, 3, 10), ref); !ok {
		t.Errorf("chunked prompt: logits %d differ", i)
	}
}

// TestExportCost measures what publishing a sequence's KV would cost on
// the small shape at 2k positions: one export (whole-sequence) against a
// decode step of that sequence. A publish every n tokens costs
// export/(n × step) of decode time; the figure decides n. Importing the
// state must take a tenth of recomputing the prompt at most.
func TestExportCost(t *testing.T) {
	if testing.Short() {
		t.Skip("a measurement: not in the -short tier")
	}
	m := loadShape(t, llamacpptest.Small)
	c, err := m.NewContext(ContextParams{Context: 2304, Sequences: 1, Batch: 512, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n = 2048
	start := time.Now()
	for i := 0; i < n; i += 512 {
		var in []Input
		for j := i; j < i+512; j++ {
			in = append(in, Input{Seq: 0, Pos: int32(j), Token: int32(3 + j%200), Logits: j == n-1})
		}
		if err := c.Decode(in); err != nil {
			t.Fatal(err)
		}
	}
	prefill := time.Since(start)
	const steps = 32
	start = time.Now()
	for k := range steps {
		if err := c.Decode([]Input{{Seq: 0, Pos: int32(n + k), Token: 7, Logits: true}}); err != nil {
			t.Fatal(err)
		}
	}
	step := time.Since(start) / steps
	start = time.Now()
	var state, buf []byte
	const exports = 5
	for range exports {
		if state, err = c.ExportInto(0, &buf); err != nil {
			t.Fatal(err)
		}
	}
	export := time.Since(start) / exports
	start = time.Now()
	c.Forget(0, 0)
	if err := c.Import(0, state); err != nil {
		t.Fatal(err)
	}
	imp := time.Since(start)
	for _, every := range []int{16, 64, 256} {
		t.Logf("publish every %d tokens: %.1f%% of decode time", every, 100*float64(export)/float64(time.Duration(every)*step))
	}
	t.Logf("%d positions: state %.1f MiB, export %v, import %v (recomputing the 2048 prompt positions took %v), a decode step %v",
		n+steps, float64(len(state))/(1<<20), export, imp, prefill, step)
	// What a migration saves: importing must beat recomputing by far.
	if imp*10 > prefill {
		t.Errorf("import %v is not a tenth of recomputing %v", imp, prefill)
	}
}

// TestGPULayersWithoutAGPU: layers asked for a GPU where no GPU backend
// is loaded are refused (ErrNoGPU) instead of silently computed on the
// CPU; a backend directory that does not exist is an error naming it,
// one without a backend loads nothing. With a CUDA backend (make
// llamacpp-cuda) on a machine with a GPU, LIFELINE_GGML_BACKENDS names
// it and the model loads.
func TestGPULayersWithoutAGPU(t *testing.T) {
	path := llamacpptest.WriteModel(t, t.TempDir(), llamacpptest.Tiny, 1)
	dir := os.Getenv("LIFELINE_GGML_BACKENDS")
	if dir == "" {
		if _, err := LoadBackends(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
			t.Fatalf("a missing backend directory: %v", err)
		}
		dir = t.TempDir()
	}
	gpus, err := LoadBackends(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := LoadModel(path, ModelParams{GPULayers: 2})
	if len(gpus) > 0 {
		if err != nil {
			t.Fatalf("GPUs %v: %v", gpus, err)
		}
		m.Close()
		t.Logf("loaded on %v", gpus)
		return
	}
	if !errors.Is(err, ErrNoGPU) {
		t.Fatalf("2 GPU layers and no GPU backend: %v, want ErrNoGPU", err)
	}
}
