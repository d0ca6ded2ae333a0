//go:build llamacpp

package llamacpp

import (
	"context"
	"fmt"
	"unicode/utf8"

	"github.com/lifeline-llm/lifeline/decode/sample"
)

// Token is one generated token: its output position (1 for the first),
// id, and the text it completes (empty while it holds only part of a
// UTF-8 character, which the next tokens complete).
type Token struct {
	Seq  int
	ID   int32
	Text string
}

// GenerateRequest is one plain generation.
type GenerateRequest struct {
	Prompt    string
	MaxTokens int
	Sampling  sample.Params
	IgnoreEOS bool
}

// Generate runs one sequence (0) of c from r.Prompt to r.MaxTokens tokens
// or the end of generation, choosing each token with Lifeline's sampler
// over llama.cpp's logits, one Decode per token: the plain loop over the
// binding (what `lifeline engine generate --engine llamacpp` runs, and
// the baseline the worker's figures are measured against). c's sequence
// 0 is emptied first.
func Generate(ctx context.Context, m *Model, c *Context, r GenerateRequest, each func(Token)) (finish string, err error) {
	if err := r.Sampling.Validate(); err != nil {
		return "", err
	}
	prompt, err := m.Tokenize(r.Prompt, true, false)
	if err != nil {
		return "", err
	}
	if len(prompt) == 0 {
		return "", fmt.Errorf("llamacpp: an empty prompt")
	}
	c.Forget(0, 0)
	for i := 0; i < len(prompt); i += c.max {
		var in []Input
		for j := i; j < min(i+c.max, len(prompt)); j++ {
			in = append(in, Input{Seq: 0, Pos: int32(j), Token: prompt[j], Logits: j == len(prompt)-1})
		}
		if err := c.Decode(in); err != nil {
			return "", err
		}
	}
	var (
		sm      sample.Sampler
		logits  []float32
		history []int
		pending []byte
	)
	for n := 1; n <= r.MaxTokens; n++ {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		if logits, err = c.Logits(0, logits); err != nil {
			return "", err
		}
		id := int32(sm.Sample(logits, r.Sampling, history, uint64(len(history)+1)))
		history = append(history, int(id))
		if m.IsEOG(id) && !r.IgnoreEOS {
			// Bytes of a character the end left incomplete are no text.
			return "stop", nil
		}
		pending = append(pending, m.Piece(id, false)...)
		text := completeUTF8(&pending)
		if n == r.MaxTokens {
			// The last token carries what is left, whole or not.
			each(Token{Seq: n, ID: id, Text: text + string(pending)})
			break
		}
		each(Token{Seq: n, ID: id, Text: text})
		if err := c.Decode([]Input{{Seq: 0, Pos: int32(len(prompt) + n - 1), Token: id, Logits: true}}); err != nil {
			return "", err
		}
	}
	return "length", nil
}

// completeUTF8 takes from *b the longest prefix that ends on a whole
// UTF-8 character (all of it when the rest cannot become one).
func completeUTF8(b *[]byte) string {
	s := *b
	end := len(s)
	// Back up over an incomplete character at the end (at most 3 bytes).
	for back := 1; back <= 3 && back <= len(s); back++ {
		if r := s[len(s)-back]; utf8.RuneStart(r) {
			if !utf8.FullRune(s[len(s)-back:]) {
				end = len(s) - back
			}
			break
		}
	}
	out := string(s[:end])
	*b = append(s[:0], s[end:]...)
	return out
}
