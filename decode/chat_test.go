package decode

import (
	"errors"
	"testing"
)

// TestChatFormats: a template is recognised by what it holds and
// rendered with the assistant's turn opened; one not rendered here is
// refused per request by name (llamacpp-tagged tests compare every
// format with llama.cpp's rendering).
func TestChatFormats(t *testing.T) {
	conv := []ChatMessage{{"system", " Be brief. "}, {"user", "Hi"}}
	for tmpl, want := range map[string]string{
		"{{ '<|im_start|>' + role }}":            "<|im_start|>system\n Be brief. <|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
		"<|start_header_id|><|end_header_id|>":   "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
		"[INST] <<SYS>>":                         "[INST] <<SYS>>\n Be brief. \n<</SYS>>\n\nHi [/INST]",
		"<start_of_turn>{{ role }}<end_of_turn>": "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n",
	} {
		got, err := goChatTemplate(tmpl)(conv)
		if err != nil || got != want {
			t.Errorf("%q: %q, %v\nwant %q", tmpl, got, err, want)
		}
	}
	if goChatTemplate("") != nil {
		t.Error("no template renders")
	}
	for _, tmpl := range []string{"{{ messages }}", "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>"} {
		if _, err := goChatTemplate(tmpl)(conv); !errors.Is(err, ErrChatTemplate) {
			t.Errorf("%q: %v, want ErrChatTemplate", tmpl, err)
		}
	}
}
