package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/gguf"
)

// Engines `lifeline engine generate --engine` names.
const (
	engineLifeline = "lifeline"
	engineLlamaCpp = "llamacpp"
)

// runLlamaCpp streams one generation of a GGUF model through llama.cpp;
// nil in a binary built without it (llamacpp.go, build tag llamacpp).
var runLlamaCpp func(ctx context.Context, path string, opts decode.GenerateOptions, threads int, out io.Writer) error

// errNoLlamaCpp: this binary cannot run llama.cpp.
var errNoLlamaCpp = errors.New("this lifeline was built without llama.cpp: build it with `go build -tags llamacpp ./cmd/lifeline` (needs gcc and g++; about 4 minutes the first time)")

// generateGGUF checks the GGUF file at path (a bad one refused by name,
// before llama.cpp sees it) and streams one generation of it.
func generateGGUF(ctx context.Context, path string, opts decode.GenerateOptions, threads int, out io.Writer) error {
	if path == "" {
		return fmt.Errorf("--engine %s: --model: the GGUF file to serve", engineLlamaCpp)
	}
	f, err := gguf.Open(path)
	if err != nil {
		return err
	}
	if err := f.Check(); err != nil {
		return err
	}
	if runLlamaCpp == nil {
		return fmt.Errorf("%s (%s): %w", path, f.Summary(), errNoLlamaCpp)
	}
	return runLlamaCpp(ctx, path, opts, threads, out)
}
