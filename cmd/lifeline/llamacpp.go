//go:build llamacpp

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/gguf"
	"github.com/lifeline-llm/lifeline/decode/llamacpp"
)

func init() { runLlamaCpp = generateLlamaCpp }

// generateLlamaCpp loads the (checked) GGUF file at path and streams one
// generation as `lifeline engine generate` prints the reference engine's.
func generateLlamaCpp(ctx context.Context, path string, opts decode.GenerateOptions, threads int, out io.Writer) error {
	h, err := gguf.Open(path)
	if err != nil {
		return err
	}
	m, err := llamacpp.LoadModel(path, llamacpp.ModelParams{})
	if err != nil {
		return err
	}
	defer m.Close()
	n := h.ContextLength()
	if n <= 0 || n > 4096 {
		n = 4096
	}
	c, err := m.NewContext(llamacpp.ContextParams{Context: n, Sequences: 1, Batch: 512, Threads: threads})
	if err != nil {
		return err
	}
	defer c.Close()
	w := bufio.NewWriter(out)
	defer w.Flush()
	enc := json.NewEncoder(w)
	finish, err := llamacpp.Generate(ctx, m, c, llamacpp.GenerateRequest{Prompt: opts.Prompt, MaxTokens: opts.MaxTokens, Sampling: opts.Sampling, IgnoreEOS: opts.IgnoreEOS},
		func(tk llamacpp.Token) {
			if opts.JSON {
				enc.Encode(decode.TokenLine{SequenceNo: tk.Seq, TokenID: int(tk.ID), Text: tk.Text})
			} else {
				io.WriteString(w, tk.Text)
			}
			w.Flush()
		})
	if err != nil {
		return err
	}
	if opts.JSON {
		return enc.Encode(decode.TokenLine{FinishReason: finish})
	}
	_, err = fmt.Fprintln(w)
	return err
}
