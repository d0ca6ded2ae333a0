package tokenizer

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

var samples = []string{
	"",
	"The quick brown fox jumps over the lazy dog.",
	"Once upon a time, there was a little girl who liked to play in the garden.\n\nShe said: “hello”!",
	"流式请求的故障恢复 — résumé, naïve, Straße 🙂🚀",
	"tabs\tand  double  spaces\r\n",
	"\x00\x01 control bytes \x7f",
	"日本語のテキスト、한국어 텍스트",
}

// llama2CFromBuiltin exports the built-in vocabulary as a tokenizer.bin, with
// scores that favour longer pieces, as a stand-in for a real llama2.c file.
func llama2CFromBuiltin(t testing.TB) *Llama2C {
	b := NewBuiltin()
	pieces := make([]string, b.VocabSize())
	scores := make([]float32, b.VocabSize())
	for i := range pieces {
		pieces[i] = b.PieceString(i)
		if !b.IsSpecial(i) && !b.IsByteFallback(i) {
			scores[i] = float32(len(pieces[i])) - float32(i)/1e5
		}
	}
	var buf bytes.Buffer
	if err := WriteLlama2C(&buf, pieces, scores); err != nil {
		t.Fatal(err)
	}
	tok, err := ReadLlama2C(&buf, len(pieces))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func tokenizers(t testing.TB) map[string]Tokenizer {
	return map[string]Tokenizer{"builtin": NewBuiltin(), "llama2c": llama2CFromBuiltin(t)}
}

// checkRoundTrip encodes s, decodes it token by token and checks that every
// chunk is valid UTF-8, no chunk splits a character, and the chunks add up to s.
func checkRoundTrip(t testing.TB, name string, tok Tokenizer, s string) {
	ids, err := tok.Encode(s)
	if err != nil {
		t.Fatalf("%s: encode %q: %v", name, s, err)
	}
	if err := CheckIDs(tok, ids); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	d := NewDetokenizer(tok)
	var sb strings.Builder
	for _, id := range ids {
		chunk := d.Push(id)
		if !utf8.ValidString(chunk) {
			t.Fatalf("%s: chunk %q of %q is not valid UTF-8", name, chunk, s)
		}
		sb.WriteString(chunk)
	}
	if rest := d.Flush(); rest != "" {
		t.Fatalf("%s: %q left %q pending", name, s, rest)
	}
	if sb.String() != s {
		t.Fatalf("%s: round trip %q -> %v -> %q", name, s, ids, sb.String())
	}
}

func TestRoundTrip(t *testing.T) {
	for name, tok := range tokenizers(t) {
		for _, s := range samples {
			checkRoundTrip(t, name, tok, s)
		}
	}
}

func TestWordsStayWhole(t *testing.T) {
	b := NewBuiltin()
	ids, err := b.Encode("The water was cold")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, id := range ids {
		got = append(got, b.PieceString(id))
	}
	if want := []string{"The", " water", " was", " cold"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("pieces %q, want %q", got, want)
	}
}

func TestEveryNonByteTokenIsValidUTF8(t *testing.T) {
	b := NewBuiltin()
	for id := 0; id < b.VocabSize(); id++ {
		if b.IsByteFallback(id) {
			continue
		}
		if p := b.Piece(UnkID, id); !utf8.Valid(p) {
			t.Fatalf("token %d piece %q is not valid UTF-8", id, p)
		}
	}
}

func TestDetokenizerHoldsSplitCharacter(t *testing.T) {
	b := NewBuiltin()
	d := NewDetokenizer(b)
	euro := "€" // three bytes, pushed as byte-fallback tokens
	for i := 0; i < 2; i++ {
		if chunk := d.Push(ByteBase + int(euro[i])); chunk != "" {
			t.Fatalf("byte %d emitted %q before the character was complete", i, chunk)
		}
	}
	if chunk := d.Push(ByteBase + int(euro[2])); chunk != euro {
		t.Fatalf("completed character = %q, want %q", chunk, euro)
	}
	// A stray continuation byte can never complete: replaced at once.
	if chunk := d.Push(ByteBase + 0x80); chunk != "\uFFFD" {
		t.Fatalf("stray continuation byte = %q", chunk)
	}
	d.Push(ByteBase + 0xE2)
	if rest := d.Flush(); rest != "\uFFFD" {
		t.Fatalf("flush of an incomplete character = %q", rest)
	}
}

func TestInvalidUTF8Rejected(t *testing.T) {
	for name, tok := range tokenizers(t) {
		if _, err := tok.Encode("ok \xff\xfe"); !errors.Is(err, ErrInvalidUTF8) {
			t.Fatalf("%s: invalid UTF-8 gave %v", name, err)
		}
	}
}

func TestHashStable(t *testing.T) {
	// The hash is part of every KV block identity: changing the vocabulary
	// must change it, and nothing else may. Update the constant only
	// together with a deliberate vocabulary change.
	const want = "9e0e1a23c853869b287530249d754a5a88e24c4fdd0e5e47f48e9888b3ff2b4a"
	if got := NewBuiltin().Hash(); got != want {
		t.Fatalf("builtin tokenizer hash %s, want %s", got, want)
	}
	if newBuiltin().Hash() != NewBuiltin().Hash() {
		t.Fatal("hash differs between two constructions")
	}
	if llama2CFromBuiltin(t).Hash() == NewBuiltin().Hash() {
		t.Fatal("different algorithms share a hash")
	}
}

func TestReadLlama2CRejectsCorruptFiles(t *testing.T) {
	good := func() []byte {
		var buf bytes.Buffer
		pieces := make([]string, 300)
		scores := make([]float32, 300)
		for i := range pieces {
			pieces[i] = string(rune('a' + i%26))
		}
		WriteLlama2C(&buf, pieces, scores)
		return buf.Bytes()
	}
	if _, err := ReadLlama2C(bytes.NewReader(good()), 300); err != nil {
		t.Fatalf("good file: %v", err)
	}
	for name, c := range map[string]struct {
		data  []byte
		vocab int
	}{
		"truncated":        {good()[:100], 300},
		"empty":            {nil, 300},
		"vocab too small":  {good(), 10},
		"negative max len": {append([]byte{0xff, 0xff, 0xff, 0xff}, good()[4:]...), 300},
	} {
		if _, err := ReadLlama2C(bytes.NewReader(c.data), c.vocab); !errors.Is(err, ErrBadTokenizerFile) {
			t.Errorf("%s: got %v, want ErrBadTokenizerFile", name, err)
		}
	}
}

func FuzzTokenizer(f *testing.F) {
	for _, s := range samples {
		f.Add(s)
	}
	toks := tokenizers(f)
	f.Fuzz(func(t *testing.T, s string) {
		for name, tok := range toks {
			if !utf8.ValidString(s) {
				if _, err := tok.Encode(s); !errors.Is(err, ErrInvalidUTF8) {
					t.Fatalf("%s: invalid input gave %v", name, err)
				}
				continue
			}
			checkRoundTrip(t, name, tok, s)
		}
	})
}

func FuzzReadLlama2C(f *testing.F) {
	var buf bytes.Buffer
	pieces := make([]string, 260)
	for i := range pieces {
		pieces[i] = string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	pieces[3] = "<0x00>"
	WriteLlama2C(&buf, pieces, make([]float32, 260))
	f.Add(buf.Bytes(), 260)
	f.Fuzz(func(t *testing.T, data []byte, vocab int) {
		tok, err := ReadLlama2C(bytes.NewReader(data), vocab)
		if err != nil {
			if !errors.Is(err, ErrBadTokenizerFile) {
				t.Fatalf("error %v does not wrap ErrBadTokenizerFile", err)
			}
			return
		}
		// A decoded vocabulary may lack characters (they become <unk>), but
		// encoding stays in range and decoding yields valid UTF-8.
		ids, err := tok.Encode("hello wörld")
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckIDs(tok, ids); err != nil {
			t.Fatal(err)
		}
		if s := Decode(tok, ids); !utf8.ValidString(s) {
			t.Fatalf("decoded %q", s)
		}
	})
}
