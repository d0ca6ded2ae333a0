//go:build llamacpp

package decode

import (
	"errors"
	"testing"

	"github.com/lifeline-llm/lifeline/decode/llamacpp"
	"github.com/lifeline-llm/lifeline/decode/llamacpp/llamacpptest"
)

// TestChatFormatsRenderAsLlamaCpp: for templates of every format the
// reference engine renders (recognised by the strings real templates
// hold, or named), conversations render to the same prompt as llama.cpp
// renders them; a format llama.cpp renders and this engine does not, and
// a template neither knows, are refused as ErrChatTemplate.
func TestChatFormatsRenderAsLlamaCpp(t *testing.T) {
	templates := map[string]string{
		chatML:            llamacpptest.ChatML,
		chatLlama3:        "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}",
		chatLlama2:        "{{ bos_token }}{% for m in messages %}{{ '[INST] ' + m['content'] + ' [/INST]' }}{% endfor %}",
		chatLlama2Sys:     "[INST] <<SYS>>\n{{ system }}\n<</SYS>>",
		chatLlama2SysBOS:  "{{ bos_token + '[INST] ' }}<<SYS>>",
		chatLlama2Strip:   "[INST] {{ content.strip() }}",
		chatMistralV1:     "{{ ' [INST] ' + system_message }}",
		chatMistralV3:     "[AVAILABLE_TOOLS]{{ '[INST]' }}",
		chatMistralV3Tekn: `[AVAILABLE_TOOLS]{{ "[INST]" }}`,
		chatMistralV7:     "[SYSTEM_PROMPT]{{ system }}[/SYSTEM_PROMPT][INST]",
		chatMistralV7Tekn: chatMistralV7Tekn,
		chatPhi3:          "{{ '<|' + role + '|>' }}<|assistant|>{{ content }}<|end|>",
		chatZephyr:        "<|user|>\n{{ content }}<|endoftext|>",
		chatGemma:         "<start_of_turn>{{ role }}\n{{ content }}<end_of_turn>",
	}
	convs := [][]ChatMessage{
		{{"user", "Hello!"}},
		{{"system", "  Be brief.\n"}, {"user", " What is 2+2? "}},
		{{"system", "sys"}, {"user", "hi"}, {"assistant", " hello there \n"}, {"user", "again"}},
		{{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d"}, {"user", "中文 🙂"}},
	}
	for format, tmpl := range templates {
		if got := detectChatFormat(tmpl); got != format {
			t.Errorf("%q detected as %q, want %q", tmpl, got, format)
		}
		render := goChatTemplate(tmpl)
		for _, conv := range convs {
			got, err := render(conv)
			if err != nil {
				t.Fatalf("%s: %v", format, err)
			}
			in := make([]llamacpp.ChatMessage, len(conv))
			for i, m := range conv {
				in[i] = llamacpp.ChatMessage{Role: m.Role, Content: m.Content}
			}
			want, err := llamacpp.ApplyTemplate(tmpl, in, true)
			if err != nil {
				t.Fatalf("%s: llama.cpp: %v", format, err)
			}
			if got != want {
				t.Errorf("%s, %v:\n got %q\nwant %q", format, conv, got, want)
			}
		}
	}
	for _, tmpl := range []string{"<|im_start|>{{ role }}<|im_sep|>", "{{ messages }}"} {
		if _, err := goChatTemplate(tmpl)(convs[0]); !errors.Is(err, ErrChatTemplate) {
			t.Errorf("%q: %v, want ErrChatTemplate", tmpl, err)
		}
	}
}
