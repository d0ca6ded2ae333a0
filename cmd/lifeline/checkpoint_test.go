package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/tests/clustertest"
	"github.com/lifeline-llm/lifeline/tests/proctest"
)

// TestServeLlama2CCheckpoint writes a model.bin and tokenizer.bin the way
// llama2.c lays them out and serves them with the real binary.
// writeLlama2CFiles writes tiny's weights as a model.bin and the builtin
// vocabulary as a tokenizer.bin, laid out as llama2.c does, and returns
// their paths.
func writeLlama2CFiles(t *testing.T) (modelPath, tokenizerPath string) {
	t.Helper()
	src, err := model.Synthetic("tiny", 9)
	if err != nil {
		t.Fatal(err)
	}
	w := src.W
	w.OutputBias = nil
	m, err := model.New(src.Config, &w)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mf, err := os.Create(filepath.Join(dir, "model.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := model.WriteLlama2C(mf, m); err != nil {
		t.Fatal(err)
	}
	mf.Close()
	b := tokenizer.NewBuiltin()
	pieces := make([]string, b.VocabSize())
	scores := make([]float32, b.VocabSize())
	for i := range pieces {
		pieces[i] = b.PieceString(i)
		scores[i] = float32(len(pieces[i]))
	}
	tf, err := os.Create(filepath.Join(dir, "tokenizer.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tokenizer.WriteLlama2C(tf, pieces, scores); err != nil {
		t.Fatal(err)
	}
	tf.Close()
	return mf.Name(), tf.Name()
}

func TestServeLlama2CCheckpoint(t *testing.T) {
	t.Parallel()
	mf, tf := writeLlama2CFiles(t)
	out, errOut, err := proctest.Run(t, "engine", "generate", "--model", mf, "--tokenizer", tf,
		"--prompt", "The water", "--seed", "3", "--max-tokens", "12", "--ignore-eos", "--json")
	if err != nil {
		t.Fatalf("%v: %s", err, errOut)
	}
	if lines := parseLines(t, out); len(lines) != 12 {
		t.Fatalf("%d tokens from the checkpoint, want 12", len(lines))
	}
	// A truncated checkpoint is refused with a clear error.
	data, _ := os.ReadFile(mf)
	os.WriteFile(mf, data[:len(data)/2], 0o600)
	_, errOut, err = proctest.Run(t, "engine", "generate", "--model", mf, "--tokenizer", tf, "--prompt", "x")
	if err == nil || !strings.Contains(errOut, "malformed llama2.c checkpoint") {
		t.Fatalf("truncated checkpoint: err %v, stderr %q", err, errOut)
	}
}

// TestWorkerRestartTakesTheCachedRevision: a worker restarted on the same
// checkpoint with --revision-cache announces the revision its first start
// computed; one whose cached revision is wrong (weights changed under the
// file's identity) announces it, then its background hash pass catches it
// and the worker exits with an error, and the next start hashes again.
func TestWorkerRestartTakesTheCachedRevision(t *testing.T) {
	t.Parallel()
	proctest.Processes(t)
	mf, tf := writeLlama2CFiles(t)
	cache := filepath.Join(t.TempDir(), "revisions")
	ca := clustertest.CADir(t)
	args := []string{"--model", mf, "--tokenizer", tf, "--revision-cache", cache}
	stop := func(cmd *exec.Cmd) {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}
	cmd, first := startWorker(t, ca, "decode-rev", 1, args...)
	stop(cmd)
	entries, _ := filepath.Glob(filepath.Join(cache, "*.rev"))
	if len(entries) != 1 || first.ModelRevision == "" {
		t.Fatalf("revision %q, cache entries %v", first.ModelRevision, entries)
	}
	cmd, again := startWorker(t, ca, "decode-rev", 2, args...)
	stop(cmd)
	if again.ModelRevision != first.ModelRevision {
		t.Fatalf("restart announced revision %s, the first start %s", again.ModelRevision, first.ModelRevision)
	}
	wrong := "0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(entries[0], []byte(wrong+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, bad := startWorker(t, ca, "decode-rev", 3, args...)
	if bad.ModelRevision != wrong {
		t.Fatalf("with a wrong cached revision the worker announced %s", bad.ModelRevision)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err == nil {
			t.Fatal("the worker with the wrong cached revision exited 0")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker with the wrong cached revision kept serving")
	}
	cmd, fixed := startWorker(t, ca, "decode-rev", 4, args...)
	stop(cmd)
	if fixed.ModelRevision != first.ModelRevision {
		t.Fatalf("after the mismatch the worker announced %s, want %s", fixed.ModelRevision, first.ModelRevision)
	}
}

// TestEngineGenerateGGUF: `lifeline engine generate --engine llamacpp`
// checks the file first — a llama2.c checkpoint is refused as not GGUF,
// a GGUF of an unknown architecture by name — and a binary built without
// llama.cpp says how to build one that has it, naming the model.
func TestEngineGenerateGGUF(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, arch string) string {
		var b bytes.Buffer
		if err := gguf.Write(&b, []gguf.KV{{Key: "general.architecture", Value: arch}, {Key: "tokenizer.ggml.model", Value: "llama"}},
			[]gguf.TensorData{{Tensor: gguf.Tensor{Name: "token_embd.weight", Dims: []uint64{32}, Type: gguf.Q8_0}, Data: make([]byte, 34)}}); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	llama2c := filepath.Join(dir, "model.bin")
	os.WriteFile(llama2c, make([]byte, 64), 0o600)
	// A binary with llama.cpp gets past the checks and has llama.cpp
	// refuse a file with one tensor of a model's many.
	good := "(llama, GGUF v3, 1 tensors (1 Q8_0), context 0): this lifeline was built without llama.cpp: build it with `go build -tags llamacpp ./cmd/lifeline`"
	if runLlamaCpp != nil {
		good = "llamacpp: llama.cpp could not load"
	}
	for _, c := range []struct{ model, says string }{
		{write("good.gguf", "llama"), good},
		{write("odd.gguf", "gpt9"), `architecture "gpt9", which llama.cpp ec98e2002 does not know`},
		{llama2c, "not a GGUF file: it starts with"},
		{"", "--model: the GGUF file to serve"},
	} {
		_, errOut, err := proctest.Run(t, "engine", "generate", "--engine", "llamacpp", "--model", c.model, "--prompt", "hi")
		if err == nil || !strings.Contains(errOut, c.says) {
			t.Errorf("--model %q: %v %s (want %q)", c.model, err, errOut, c.says)
		}
	}
	if _, errOut, err := proctest.Run(t, "engine", "generate", "--engine", "vllm", "--prompt", "hi"); err == nil || !strings.Contains(errOut, `--engine: "vllm" (want lifeline or llamacpp)`) {
		t.Errorf("--engine vllm: %v %s", err, errOut)
	}
}
