package decode

import (
	"fmt"
	"os"

	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

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
