package decode

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/lifeline-llm/lifeline/decode/gguf"

	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// Checkpoint formats ModelFormat names.
const (
	FormatLlama2C = "llama2c"
	FormatGGUF    = "gguf"
	FormatHF      = "hf"
)

// ModelFormat names the format of the checkpoint at path: a Hugging Face
// directory (config.json), a GGUF file (its magic), or else a llama2.c
// model.bin.
func ModelFormat(path string) string {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return FormatHF
	}
	f, err := os.Open(path)
	if err != nil {
		return FormatLlama2C
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err == nil && string(magic[:]) == "GGUF" {
		return FormatGGUF
	}
	return FormatLlama2C
}

// CheckModel says whether the reference engine serves the GGUF file or
// Hugging Face directory at path, from its headers: the architecture,
// shapes, weight types and vocabulary. The error names what it does not
// compute; the llama.cpp engine may serve it.
func CheckModel(path string) error {
	var c model.Config
	var v *tokenizer.Vocab
	var err error
	switch ModelFormat(path) {
	case FormatGGUF:
		var f *gguf.File
		if f, err = gguf.Open(path); err != nil {
			return err
		}
		if c, err = model.CheckGGUF(f); err != nil {
			return err
		}
		v, err = tokenizer.FromGGUF(f)
	case FormatHF:
		if c, err = model.CheckHF(path); err != nil {
			return err
		}
		v, err = tokenizer.FromHF(path)
	default:
		return badField("model", "%s is neither a GGUF file nor a Hugging Face directory (a llama2.c model.bin needs --tokenizer)", path)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if v.VocabSize() != c.VocabSize {
		return fmt.Errorf("%s: %w: the vocabulary has %d tokens, the model's embedding %d", path, tokenizer.ErrUnsupportedVocab, v.VocabSize(), c.VocabSize)
	}
	return nil
}

// checkpoint is a loaded model with its vocabulary and chat template.
type checkpoint struct {
	m    *model.Model
	tok  tokenizer.Tokenizer
	chat string
	name string
}

// loadCheckpoint loads a GGUF file or a Hugging Face directory with the
// vocabulary and chat template it holds; rc keeps its revision.
func loadCheckpoint(path string, rc model.RevisionCache) (checkpoint, error) {
	var c checkpoint
	var err error
	switch ModelFormat(path) {
	case FormatGGUF:
		var f *gguf.File
		if f, err = gguf.Open(path); err != nil {
			return c, err
		}
		var v *tokenizer.Vocab
		if v, err = tokenizer.FromGGUF(f); err != nil {
			return c, fmt.Errorf("%s: %w", path, err)
		}
		c.tok, c.name = v, GGUFName(path)
		c.chat, _ = f.String("tokenizer.chat_template")
		c.m, err = model.LoadGGUFCached(path, rc)
	case FormatHF:
		var v *tokenizer.Vocab
		if v, err = tokenizer.FromHF(path); err != nil {
			return c, fmt.Errorf("%s: %w", path, err)
		}
		c.tok, c.name, c.chat = v, filepath.Base(filepath.Clean(path)), tokenizer.ChatTemplateHF(path)
		c.m, err = model.LoadHFCached(path, rc)
	}
	return c, err
}

// loadModel loads opts' model and tokenizer.
func loadModel(opts Options) (*model.Model, tokenizer.Tokenizer, error) {
	if opts.ModelPath == "" {
		m, err := model.Synthetic(opts.Preset, opts.WeightSeed)
		return m, tokenizer.NewBuiltin(), err
	}
	// The tokenizer is read while the weights load (on a worker's
	// restart, both are what it waits for before it can prefill).
	var tok tokenizer.Tokenizer
	var tokErr error
	loaded := make(chan struct{})
	vocab, vocabErr := model.Llama2CVocabSize(opts.ModelPath)
	go func() {
		defer close(loaded)
		if vocabErr == nil {
			tok, tokErr = loadTokenizer(opts.TokenizerPath, vocab)
		}
	}()
	m, err := model.LoadLlama2CCached(opts.ModelPath, model.RevisionCache{Dir: opts.RevisionCache})
	<-loaded
	switch {
	case err != nil:
		return nil, nil, err
	case vocabErr != nil:
		return nil, nil, vocabErr
	case tokErr != nil:
		return nil, nil, tokErr
	}
	return m, tok, nil
}

func loadTokenizer(path string, vocab int) (tokenizer.Tokenizer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("decode: tokenizer: %w", err)
	}
	defer f.Close()
	tok, err := tokenizer.ReadLlama2C(f, vocab)
	if err != nil {
		return nil, fmt.Errorf("decode: tokenizer %s: %w", path, err)
	}
	return tok, nil
}

// verifyLater runs m's skipped hash pass in the background; the channel
// gets its error if it fails and nothing otherwise.
func verifyLater(m *model.Model) <-chan error {
	failed := make(chan error, 1)
	go func() {
		if err := m.Verify(); err != nil {
			failed <- err
		}
	}()
	return failed
}
