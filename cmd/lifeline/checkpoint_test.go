package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/internal/proctest"
)

// TestServeLlama2CCheckpoint writes a model.bin and tokenizer.bin the way
// llama2.c lays them out and serves them with the real binary.
func TestServeLlama2CCheckpoint(t *testing.T) {
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

	out, errOut, err := proctest.Run(t, "engine", "generate", "--model", mf.Name(), "--tokenizer", tf.Name(),
		"--prompt", "The water", "--seed", "3", "--max-tokens", "12", "--ignore-eos", "--json")
	if err != nil {
		t.Fatalf("%v: %s", err, errOut)
	}
	if lines := parseLines(t, out); len(lines) != 12 {
		t.Fatalf("%d tokens from the checkpoint, want 12", len(lines))
	}
	// A truncated checkpoint is refused with a clear error.
	data, _ := os.ReadFile(mf.Name())
	os.WriteFile(mf.Name(), data[:len(data)/2], 0o600)
	_, errOut, err = proctest.Run(t, "engine", "generate", "--model", mf.Name(), "--tokenizer", tf.Name(), "--prompt", "x")
	if err == nil || !strings.Contains(errOut, "malformed llama2.c checkpoint") {
		t.Fatalf("truncated checkpoint: err %v, stderr %q", err, errOut)
	}
}
