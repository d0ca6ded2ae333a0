package decode

import (
	"strings"

	"github.com/lifeline-llm/lifeline/decode/tokenizer"
)

// textStream turns tokens into text chunks: UTF-8 reassembly, then stop
// strings, holding back any tail that could still become a stop string.
type textStream struct {
	detok   *tokenizer.Detokenizer
	stops   []string
	pending string
}

// newTextStream starts after the prompt's last token, which decides how
// the first output token is spelled (llama2.c drops a leading space only
// right after BOS).
func newTextStream(t tokenizer.Tokenizer, lastPrompt int, stops []string) *textStream {
	return &textStream{detok: tokenizer.NewDetokenizerAfter(t, lastPrompt), stops: stops}
}

// push adds a token and returns the text now safe to emit, and whether a
// stop string was reached (the text then ends before it). last flushes
// everything held.
func (s *textStream) push(id int, last bool) (string, bool) {
	s.pending += s.detok.Push(id)
	if last {
		s.pending += s.detok.Flush()
	}
	cut := -1
	for _, st := range s.stops {
		if i := strings.Index(s.pending, st); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut >= 0 {
		out := s.pending[:cut]
		s.pending = ""
		return out, true
	}
	if last {
		out := s.pending
		s.pending = ""
		return out, false
	}
	hold := 0
	for _, st := range s.stops {
		for n := min(len(st)-1, len(s.pending)); n > hold; n-- {
			if strings.HasSuffix(s.pending, st[:n]) {
				hold = n
				break
			}
		}
	}
	out := s.pending[:len(s.pending)-hold]
	s.pending = s.pending[len(s.pending)-hold:]
	return out, false
}
