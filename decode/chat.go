package decode

import (
	"errors"
	"fmt"
	"strings"
)

// ErrChatTemplate is wrapped by a chat template the reference engine
// does not render.
var ErrChatTemplate = errors.New("chat template not rendered by Lifeline's engine")

// The chat formats renderChatFormat writes, by llama.cpp's names for them.
// A model's template is recognised as llama.cpp recognises it (its
// llm_chat_detect_template, in the same order of checks), so that a file
// gets the same prompt on either engine; the llamacpp-tagged tests
// compare the two renderings.
const (
	chatML            = "chatml"
	chatLlama2        = "llama2"
	chatLlama2Sys     = "llama2-sys"
	chatLlama2SysBOS  = "llama2-sys-bos"
	chatLlama2Strip   = "llama2-sys-strip"
	chatMistralV1     = "mistral-v1"
	chatMistralV3     = "mistral-v3"
	chatMistralV3Tekn = "mistral-v3-tekken"
	chatMistralV7     = "mistral-v7"
	chatMistralV7Tekn = "mistral-v7-tekken"
	chatPhi3          = "phi3"
	chatZephyr        = "zephyr"
	chatGemma         = "gemma"
	chatLlama3        = "llama3"
)

var renderedFormats = []string{chatML, chatLlama2, chatLlama2Sys, chatLlama2SysBOS, chatLlama2Strip, chatMistralV1, chatMistralV3,
	chatMistralV3Tekn, chatMistralV7, chatMistralV7Tekn, chatPhi3, chatZephyr, chatGemma, chatLlama3}

// detectChatFormat names tmpl's format as llama.cpp would: the template
// itself may be a format's name; otherwise strings it contains decide.
// Formats llama.cpp knows and this file does not render come back by
// their names too; "" is a template neither knows.
func detectChatFormat(tmpl string) string {
	for _, f := range renderedFormats {
		if tmpl == f {
			return f
		}
	}
	has := func(s string) bool { return strings.Contains(tmpl, s) }
	switch {
	case has("<|im_start|>"):
		switch {
		case has("<|im_sep|>"):
			return "phi4"
		case has("<end_of_utterance>"):
			return "smolvlm"
		}
		return chatML
	case strings.HasPrefix(tmpl, "mistral") || has("[INST]"):
		return mistralFormat(has)
	case has("<|assistant|>") && has("<|end|>"):
		return chatPhi3
	case has("[gMASK]<sop>"):
		return "chatglm4"
	case has("<|assistant|>") && has("<|user|>"):
		if has("</s>") {
			return "falcon3"
		}
		return "glmedge"
	case has("<|{{ item['role'] }}|>") && has("<|begin_of_image|>"):
		return "glmedge"
	case has("<|user|>") && has("<|endoftext|>"):
		return chatZephyr
	case has("bos_token + message['role']"):
		return "monarch"
	case has("<start_of_turn>"):
		return chatGemma
	case has(`'\n\nAssistant: ' + eos_token`):
		return "orion"
	case has("GPT4 Correct "):
		return "openchat"
	case has("USER: ") && has("ASSISTANT: "):
		return "vicuna"
	case has("### Instruction:") && has("<|EOT|>"):
		return "deepseek"
	case has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>"):
		return "command-r"
	case has("<|start_header_id|>") && has("<|end_header_id|>"):
		return chatLlama3
	}
	return "" // llama.cpp checks more (chatglm3, minicpm, ...): none rendered here
}

func mistralFormat(has func(string) bool) string {
	switch {
	case has("[SYSTEM_PROMPT]"):
		return chatMistralV7
	case has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]"):
		switch {
		case has(" [INST]"):
			return chatMistralV1
		case has(`"[INST]"`):
			return chatMistralV3Tekn
		}
		return chatMistralV3
	case has("content.strip()"):
		return chatLlama2Strip
	case has("bos_token + '[INST]"):
		return chatLlama2SysBOS
	case has("<<SYS>>"):
		return chatLlama2Sys
	}
	return chatLlama2
}

// goChatTemplate renders conversations with tmpl's format (nil: no
// template); a format not rendered here is refused per request by name.
func goChatTemplate(tmpl string) func([]ChatMessage) (string, error) {
	if tmpl == "" {
		return nil
	}
	format := detectChatFormat(tmpl)
	return func(msgs []ChatMessage) (string, error) {
		p, ok := renderChatFormat(format, msgs)
		if !ok {
			name := format
			if name == "" {
				name = "an unrecognised template"
			}
			return "", fmt.Errorf("%w: %s (rendered: %s); send the rendered prompt to /v1/completions instead", ErrChatTemplate, name, strings.Join(renderedFormats, ", "))
		}
		return p, nil
	}
}

// trimSpace trims ASCII whitespace as llama.cpp's trim (isspace) does.
func trimSpace(s string) string { return strings.Trim(s, " \t\n\v\f\r") }

// renderChatFormat writes msgs in format, ending with the assistant's
// turn opened, as llama.cpp's llm_chat_apply_template does.
func renderChatFormat(format string, msgs []ChatMessage) (string, bool) {
	var b strings.Builder
	switch format {
	case chatML:
		for _, m := range msgs {
			b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
		}
		b.WriteString("<|im_start|>assistant\n")
	case chatMistralV7, chatMistralV7Tekn:
		sp := " "
		if format == chatMistralV7Tekn {
			sp = ""
		}
		for _, m := range msgs {
			switch m.Role {
			case "system":
				b.WriteString("[SYSTEM_PROMPT]" + sp + m.Content + "[/SYSTEM_PROMPT]")
			case "user":
				b.WriteString("[INST]" + sp + m.Content + "[/INST]")
			default:
				b.WriteString(sp + m.Content + "</s>")
			}
		}
	case chatMistralV1, chatMistralV3, chatMistralV3Tekn:
		renderMistral(&b, format, msgs)
	case chatLlama2, chatLlama2Sys, chatLlama2SysBOS, chatLlama2Strip:
		renderLlama2(&b, format, msgs)
	case chatPhi3:
		for _, m := range msgs {
			b.WriteString("<|" + m.Role + "|>\n" + m.Content + "<|end|>\n")
		}
		b.WriteString("<|assistant|>\n")
	case chatZephyr:
		for _, m := range msgs {
			b.WriteString("<|" + m.Role + "|>\n" + m.Content + "<|endoftext|>\n")
		}
		b.WriteString("<|assistant|>\n")
	case chatGemma:
		renderGemma(&b, msgs)
	case chatLlama3:
		for _, m := range msgs {
			b.WriteString("<|start_header_id|>" + m.Role + "<|end_header_id|>\n\n" + trimSpace(m.Content) + "<|eot_id|>")
		}
		b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	default:
		return "", false
	}
	return b.String(), true
}

func renderMistral(b *strings.Builder, format string, msgs []ChatMessage) {
	lead, trail := "", " "
	if format == chatMistralV1 {
		lead = " "
	}
	if format == chatMistralV3Tekn {
		trail = ""
	}
	inTurn := false
	for _, m := range msgs {
		if !inTurn {
			b.WriteString(lead + "[INST]" + trail)
			inTurn = true
		}
		switch m.Role {
		case "system":
			b.WriteString(m.Content + "\n\n")
		case "user":
			b.WriteString(m.Content + lead + "[/INST]")
		default:
			c := m.Content
			if format == chatMistralV3 {
				c = trimSpace(c)
			}
			b.WriteString(trail + c + "</s>")
			inTurn = false
		}
	}
}

func renderLlama2(b *strings.Builder, format string, msgs []ChatMessage) {
	sys := format != chatLlama2
	b.WriteString("[INST] ")
	inTurn := true
	for _, m := range msgs {
		c := m.Content
		if format == chatLlama2Strip {
			c = trimSpace(c)
		}
		if !inTurn {
			inTurn = true
			if format == chatLlama2SysBOS {
				b.WriteString("<s>[INST] ")
			} else {
				b.WriteString("[INST] ")
			}
		}
		switch {
		case m.Role == "system" && sys:
			b.WriteString("<<SYS>>\n" + c + "\n<</SYS>>\n\n")
		case m.Role == "system":
			b.WriteString(c + "\n")
		case m.Role == "user":
			b.WriteString(c + " [/INST]")
		default:
			b.WriteString(c + "</s>")
			inTurn = false
		}
	}
}

func renderGemma(b *strings.Builder, msgs []ChatMessage) {
	system := ""
	for _, m := range msgs {
		if m.Role == "system" {
			system += trimSpace(m.Content)
			continue
		}
		role := m.Role
		if role == "assistant" {
			role = "model"
		}
		b.WriteString("<start_of_turn>" + role + "\n")
		if system != "" && role != "model" {
			b.WriteString(system + "\n\n")
			system = ""
		}
		b.WriteString(trimSpace(m.Content) + "<end_of_turn>\n")
	}
	b.WriteString("<start_of_turn>model\n")
}
