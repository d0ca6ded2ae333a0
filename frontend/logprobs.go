package frontend

import (
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
	"github.com/lifeline-llm/lifeline/decode/wire"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/frontend/sse"
)

// This file reads logprobs / top_logprobs and renders a token's
// log-probabilities in the chat shape (choices[].logprobs.content) and the
// legacy completions shape (tokens, token_logprobs, top_logprobs,
// text_offset). The worker computes them (the log-softmax of the raw
// logits, a pure function of the token prefix), so a migrated request's
// are identical; the frontend names the tokens with the built-in
// vocabulary, as it does to count usage.

// Bounds of the alternatives per position, as OpenAI's.
const (
	maxTopLogprobsChat        = 20
	maxTopLogprobsCompletions = 5
)

// parseLogprobs reads chat's logprobs (bool) and top_logprobs (0..20,
// needs logprobs), or the completions' logprobs (0..5 alternatives; any
// number turns them on).
func parseLogprobs(b *openAIRequest, out *CompletionRequest, chat bool) error {
	if !chat {
		if !numIs(b.TopLogprobs, "0") {
			return unsupported("top_logprobs", "top_logprobs is a chat parameter; a completion takes logprobs: N (0 to 5)")
		}
		if rawIs(b.Logprobs) {
			return nil
		}
		n, err := parseInt("logprobs", number(strings.TrimSpace(string(b.Logprobs))), 0, maxTopLogprobsCompletions)
		if err != nil {
			return err
		}
		out.Logprobs, out.TopLogprobs = true, int(n)
		return nil
	}
	if !rawIs(b.Logprobs) {
		var on bool
		if json.Unmarshal(b.Logprobs, &on) != nil {
			return invalid("logprobs", "want true or false (the number of alternatives is top_logprobs)")
		}
		out.Logprobs = on
	}
	if b.TopLogprobs != nil {
		n, err := parseInt("top_logprobs", *b.TopLogprobs, 0, maxTopLogprobsChat)
		if err != nil {
			return err
		}
		if !out.Logprobs && n > 0 {
			return invalid("top_logprobs", "top_logprobs needs logprobs: true")
		}
		out.TopLogprobs = int(n)
	}
	return nil
}

// frameLogprobs are the log-probabilities a worker frame carries, when
// the request asked for them.
func (x *run) frameLogprobs(f *wire.Frame) *reqfsm.TokenLogprobs {
	if !x.body.Logprobs {
		return nil
	}
	lp := &reqfsm.TokenLogprobs{Logprob: f.Logprob, Piece: f.Piece}
	for _, t := range f.TopLogprobs {
		lp.Top = append(lp.Top, reqfsm.TopLogprob{ID: int(t.TokenId), Logprob: t.Logprob, Piece: t.Piece})
	}
	return lp
}

// tokenPiece is a token's bytes — piece, as its worker gave them in the
// serving model's vocabulary, or else the built-in vocabulary's — and its
// text (invalid UTF-8, as a byte of a multi-byte character, as U+FFFD).
func tokenPiece(id int, piece []byte) (string, []int) {
	p := piece
	if p == nil {
		p = tokenizer.NewBuiltin().Piece(0, id)
	}
	b := make([]int, len(p))
	for i, c := range p {
		b[i] = int(c)
	}
	return strings.ToValidUTF8(string(p), "\uFFFD"), b
}

// chatLogprobs renders toks in the chat shape; nil when the request did
// not ask for logprobs.
func chatLogprobs(toks []reqfsm.Token) *sse.Logprobs {
	out := &sse.Logprobs{Content: []sse.TokenLogprob{}}
	for _, t := range toks {
		if t.Logprobs == nil {
			return nil
		}
		text, b := tokenPiece(t.ID, t.Logprobs.Piece)
		tl := sse.TokenLogprob{Token: text, Logprob: t.Logprobs.Logprob, Bytes: b, TopLogprobs: []sse.TopLogprob{}}
		for _, a := range t.Logprobs.Top {
			at, ab := tokenPiece(a.ID, a.Piece)
			tl.TopLogprobs = append(tl.TopLogprobs, sse.TopLogprob{Token: at, Logprob: a.Logprob, Bytes: ab})
		}
		out.Content = append(out.Content, tl)
	}
	return out
}

// legacyLogprobs renders toks in the completions' shape; offset is the
// text offset (in characters of the choice's text) of the first one.
func legacyLogprobs(toks []reqfsm.Token, offset int) *sse.Logprobs {
	out := &sse.Logprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	for _, t := range toks {
		if t.Logprobs == nil {
			return nil
		}
		text, _ := tokenPiece(t.ID, t.Logprobs.Piece)
		top := make(map[string]float64, len(t.Logprobs.Top))
		for _, a := range t.Logprobs.Top {
			at, _ := tokenPiece(a.ID, a.Piece)
			if _, dup := top[at]; !dup { // the likelier of two that print alike
				top[at] = a.Logprob
			}
		}
		out.Tokens = append(out.Tokens, text)
		out.TokenLogprobs = append(out.TokenLogprobs, t.Logprobs.Logprob)
		out.TopLogprobs = append(out.TopLogprobs, top)
		out.TextOffset = append(out.TextOffset, offset)
		offset += utf8.RuneCountInString(t.Text)
	}
	return out
}

// renderLogprobs is toks' logprobs in the request's shape (nil: none
// asked); offset as for legacyLogprobs.
func (st *stream) renderLogprobs(toks []reqfsm.Token, offset int) *sse.Logprobs {
	if !st.body.Logprobs {
		return nil
	}
	if st.chat {
		return chatLogprobs(toks)
	}
	return legacyLogprobs(toks, offset)
}

// textOffset is the offset, in characters of the choice's text, of the
// token after sequence number after (echo counts the prompt).
func (st *stream) textOffset(after int) int {
	toks, _, _, _ := st.snapshot()
	n := 0
	if st.body.Echo {
		n = utf8.RuneCountInString(st.echoText())
	}
	return n + utf8.RuneCount(toks.TextOf(after))
}

// echoText is the prompt as echo prepends it: the text, or the token ids
// decoded with the built-in vocabulary.
func (st *stream) echoText() string {
	if len(st.body.PromptTokens) > 0 {
		return tokenizer.Decode(tokenizer.NewBuiltin(), st.body.PromptTokens)
	}
	return st.body.Prompt
}

// logprobsRecord is lp as a request record keeps it (nil: none).
func logprobsRecord(lp *reqfsm.TokenLogprobs) json.RawMessage {
	if lp == nil {
		return nil
	}
	b, _ := json.Marshal(lp) // floats from the worker: finite
	return b
}

// recordLogprobs reads what logprobsRecord wrote (nil: none, or unreadable).
func recordLogprobs(raw json.RawMessage) *reqfsm.TokenLogprobs {
	if len(raw) == 0 {
		return nil
	}
	var lp reqfsm.TokenLogprobs
	if json.Unmarshal(raw, &lp) != nil {
		return nil
	}
	return &lp
}
