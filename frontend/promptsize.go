package frontend

import (
	"fmt"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// A prompt that cannot fit its model's context is refused at admission,
// before it is run: first by its size in bytes (no tokenizing: a text of
// n bytes is at least n / (longest piece) tokens), then in tokens, against
// the context the model's instances registered. Nothing of it reaches a
// worker, a request record or the router. A model whose context is not
// known yet (no registration) is left to its worker's own check.

// unknownPieceLen bounds the bytes of a token of a tokenizer this
// frontend does not hold (the llama2.c format's own bound).
const unknownPieceLen = 1 << 10

// tokenizedPrompt is the built-in tokenizer's encoding of text (without
// BOS), kept by the admission check for the run, which would encode it
// again otherwise.
type tokenizedPrompt struct {
	text string
	ids  []int
}

// checkPromptSize refuses b if one of its prompts cannot fit the model's
// context with its max_tokens: a *ParamError, context_length_exceeded.
func (s *Server) checkPromptSize(b *CompletionRequest, chat bool) error {
	ctxLen, hash := s.router.Context(b.Model)
	if ctxLen <= 0 {
		return nil
	}
	param := "prompt"
	if chat {
		param = "messages"
	}
	prompts := b.Batch
	if len(prompts) == 0 {
		prompts = []BatchPrompt{{Prompt: b.Prompt, PromptTokens: b.PromptTokens}}
	}
	builtin := tokenizer.NewBuiltin()
	for i, p := range prompts {
		name := param
		if len(b.Batch) > 0 {
			name = fmt.Sprintf("prompt[%d]", i)
		}
		n := len(p.PromptTokens) + 1 // BOS
		if len(p.PromptTokens) == 0 {
			pieceLen := unknownPieceLen
			if hash == builtin.Hash() {
				pieceLen = builtin.MaxPieceLen()
			}
			if len(p.Prompt)/pieceLen+1 >= ctxLen {
				return &ParamError{Param: name, Code: CodeContextLengthExceeded,
					Message: fmt.Sprintf("%d bytes cannot fit the context of %d tokens", len(p.Prompt), ctxLen)}
			}
			if hash != builtin.Hash() {
				continue // the worker counts
			}
			ids, err := builtin.Encode(p.Prompt)
			if err != nil {
				continue // the worker names the error
			}
			if len(prompts) == 1 {
				b.tokenized = &tokenizedPrompt{text: p.Prompt, ids: ids}
			}
			n = len(ids) + 1
		}
		if err := fits(name, n, b.maxTokens(), ctxLen); err != nil {
			return err
		}
	}
	return nil
}

// fits says whether a prompt of n tokens (BOS included) leaves room for
// maxTokens in a context of ctxLen, in the worker's words.
func fits(param string, n, maxTokens, ctxLen int) *ParamError {
	switch {
	case n >= ctxLen:
		return &ParamError{Param: param, Code: CodeContextLengthExceeded,
			Message: fmt.Sprintf("%d tokens do not fit the context of %d", n, ctxLen)}
	case maxTokens > ctxLen-n:
		return &ParamError{Param: "max_tokens", Code: CodeContextLengthExceeded,
			Message: fmt.Sprintf("prompt of %d tokens plus max_tokens %d exceeds the context of %d", n, maxTokens, ctxLen)}
	}
	return nil
}
