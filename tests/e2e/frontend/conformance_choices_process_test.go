package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/lifeline-llm/lifeline/tests/clustertest"
)

// TestOpenAISDKChoices: the official OpenAI Go SDK asks for n = 2, whole
// and streamed (chat and completions), and a decode worker is SIGKILLed
// mid-stream under one choice: no SDK error, each choice's text identical
// to a fault-free run, indexes right, one role per chat choice, usage
// summed.
func TestOpenAISDKChoices(t *testing.T) {
	t.Parallel()
	n := clustertest.NewNode(t, clustertest.PacedDecode(2))
	n.WaitRegistration(t, "n1-decode-tiny-0", 0)
	n.WaitRegistration(t, "n1-decode-tiny-1", 0)
	url := clustertest.StartFrontend(t, n)
	c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()
	eos := option.WithJSONSet("ignore_eos", true)
	const tokens = 80

	p := openai.ChatCompletionNewParams{Model: "tiny", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me about the sea")},
		N: openai.Int(2), Seed: openai.Int(21), Temperature: openai.Float(0.9), MaxCompletionTokens: openai.Int(tokens)}
	whole, err := c.Chat.Completions.New(ctx, p, eos)
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.Choices) != 2 || whole.Choices[0].Index != 0 || whole.Choices[1].Index != 1 || whole.Choices[0].Message.Content == whole.Choices[1].Message.Content ||
		whole.Usage.CompletionTokens != 2*tokens || !strings.HasPrefix(whole.ID, "chatcmpl-") {
		t.Fatalf("whole: %s", whole.RawJSON())
	}
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := func(kill func(choice, seq int, instance string)) ([2]string, [2]string, int64) {
		st := c.Chat.Completions.NewStreaming(ctx, p, eos)
		var texts, roles [2]strings.Builder
		usage := int64(0)
		for st.Next() {
			ch := st.Current()
			if len(ch.Choices) == 0 {
				usage = ch.Usage.CompletionTokens
				continue
			}
			i := ch.Choices[0].Index
			if i < 0 || i > 1 {
				t.Fatalf("chunk %s", ch.RawJSON())
			}
			texts[i].WriteString(ch.Choices[0].Delta.Content)
			roles[i].WriteString(ch.Choices[0].Delta.Role)
			var ll struct {
				SequenceNo int    `json:"sequence_no"`
				InstanceID string `json:"instance_id"`
			}
			json.Unmarshal([]byte(ch.JSON.ExtraFields["lifeline"].Raw()), &ll)
			if kill != nil && ll.InstanceID != "" {
				kill(int(i), ll.SequenceNo, ll.InstanceID)
			}
		}
		if err := st.Err(); err != nil {
			t.Fatalf("SDK error: %v", err)
		}
		return [2]string{texts[0].String(), texts[1].String()}, [2]string{roles[0].String(), roles[1].String()}, usage
	}
	want, roles, usage := stream(nil)
	for i := range 2 {
		if want[i] != whole.Choices[i].Message.Content || roles[i] != "assistant" {
			t.Fatalf("streamed choice %d: %q role %q, whole %q", i, want[i], roles[i], whole.Choices[i].Message.Content)
		}
	}
	if usage != 2*tokens {
		t.Fatalf("usage chunk: %d completion tokens", usage)
	}
	killed := ""
	got, _, _ := stream(func(choice, seq int, instance string) {
		if choice == 1 && seq == 25 && killed == "" {
			killed = instance
			killWorker(t, n, instance)
		}
	})
	if killed == "" || got != want {
		t.Fatalf("after killing %q under choice 1: %q, want %q", killed, got, want)
	}

	// Completions, streamed: n = 2 with the SDK's own chunk type.
	cp := openai.CompletionNewParams{Model: "tiny", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("x")}, N: openai.Int(2),
		MaxTokens: openai.Int(5), Seed: openai.Int(3)}
	cw, err := c.Completions.New(ctx, cp, eos)
	if err != nil || len(cw.Choices) != 2 {
		t.Fatalf("completions n=2: %v", err)
	}
	st := c.Completions.NewStreaming(ctx, cp, eos)
	var ct [2]strings.Builder
	for st.Next() {
		if ch := st.Current(); len(ch.Choices) > 0 {
			ct[ch.Choices[0].Index].WriteString(ch.Choices[0].Text)
		}
	}
	if err := st.Err(); err != nil || ct[0].String() != cw.Choices[0].Text || ct[1].String() != cw.Choices[1].Text {
		t.Fatalf("streamed completions %q %q, whole %q %q: %v", ct[0].String(), ct[1].String(), cw.Choices[0].Text, cw.Choices[1].Text, err)
	}
}
