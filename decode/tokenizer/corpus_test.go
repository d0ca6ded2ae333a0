package tokenizer_test

import (
	"math/rand/v2"
	"strings"
)

// corpus is what the tokenizers are checked on: Unicode of several
// scripts, whitespace runs, code, CJK, emoji (with joiners and
// modifiers), contractions, numbers, special tokens in and around text,
// and strings drawn at random from all of these.
func corpus() []string {
	c := []string{
		"", " ", "  ", "\n", "\t", " \n\n  \t", "Hello world", " Hello world", "Hello  world   ", "hello\n\nworld\n",
		"I'm sure you're right, they'll say it's what we'd've done. I'M SURE YOU'RE", "don't DON'T Don'T",
		"1 12 123 1234 12345 1234567890 3.14159 -42 1e-5 0x1F ½ ² ١٢٣ ४२",
		"func main() {\n\tfmt.Println(\"héllo, 世界\")\n\tx := []int{1, 2, 3} // comment\n}\n",
		"def f(x):\n    return x**2  # square\n\n\nclass A:\n        pass",
		`{"key": "value", "n": [1, 2.5, null], "nested": {"a": true}}`,
		"https://example.com/path?q=1&r=two#frag <a href=\"x\">link</a>",
		"中文测试：你好，世界！这是一个句子。日本語のテキストです。한국어 문장입니다.",
		"Привет, мир! Ελληνικά κείμενα. עברית. العربية نص. हिन्दी पाठ। ภาษาไทย",
		"emoji 🙂🚀👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 1️⃣",
		"combining: e\u0301 a\u0308 n\u0303; zero-width: a\u200bb\u200dc; nbsp:\u00a0x; ideographic space:\u3000y",
		"ALL CAPS WORDS and MiXeD CaSe and snake_case and camelCaseWords and kebab-case",
		"tabs\tand\t\ttabs\r\nwindows\r\nlines   \n   \n",
		"punctuation!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&& ((())) [[]] {{}} <<>> ~~ || \\\\ //",
		"<s>", "</s>", "<unk>", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|im_start|><|im_end|>",
		"text<|endoftext|>more", " <|im_end|> spaced ", "<|im_", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
		"<0x41> <0xFF>", "▁already▁escaped", "a\x00b", "\u2028line\u2029para",
	}
	pool := []rune(strings.Join(c, "") + "    \n\n\t")
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var sb strings.Builder
		for range 1 + r.IntN(60) {
			sb.WriteRune(pool[r.IntN(len(pool))])
		}
		c = append(c, sb.String())
	}
	return c
}
