// Command resume-go streams a chat completion from Lifeline with the
// official OpenAI Go SDK and, when the frontend serving it dies, resumes
// the stream at another frontend after the last token it printed: no
// token lost, none twice.
//
// The recipe, for any Chat Completions client:
//
//  1. ask for a resumable stream (stream_options.resumable) and keep the
//     Lifeline-Request-Id and Lifeline-Resume-Token response headers;
//  2. remember the sequence number of the last token printed (each
//     chunk's lifeline.sequence_no, also the SSE event id);
//  3. when the stream breaks before its end, GET /v1/streams/{id} at any
//     frontend with Last-Event-ID: <that number> and the token as the
//     bearer credential, and read on: the same chunks, from the next
//     token.
//
// Usage: go run ./examples/resume-go -urls http://127.0.0.1:8080,http://127.0.0.1:8081
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
)

func main() {
	urls := flag.String("urls", "http://127.0.0.1:8080", "frontends' base URLs, comma-separated: the first serves, the others resume")
	model := flag.String("model", "small", "the model")
	prompt := flag.String("prompt", "Tell me a story.", "the user's message")
	maxTokens := flag.Int64("max-tokens", 64, "the output's bound")
	seed := flag.Int64("seed", 1, "the sampling seed")
	ignoreEOS := flag.Bool("ignore-eos", false, "generate max-tokens tokens (a Lifeline extension, for demos and tests)")
	flag.Parse()
	if err := run(strings.Split(*urls, ","), *model, *prompt, *maxTokens, *seed, *ignoreEOS); err != nil {
		fmt.Fprintln(os.Stderr, "resume-go:", err)
		os.Exit(1)
	}
}

func run(urls []string, model, prompt string, maxTokens, seed int64, ignoreEOS bool) error {
	key := os.Getenv("OPENAI_API_KEY")
	if key == "" {
		key = "unused"
	}
	client := openai.NewClient(option.WithBaseURL(urls[0]+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	params := openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		MaxCompletionTokens: openai.Int(maxTokens), Seed: openai.Int(seed)}
	// 1. A resumable stream; its id and resume token are in the headers.
	var resp *http.Response
	opts := []option.RequestOption{option.WithResponseInto(&resp), option.WithJSONSet("stream_options", map[string]any{"resumable": true})}
	if ignoreEOS {
		opts = append(opts, option.WithJSONSet("ignore_eos", true))
	}
	ctx := context.Background()
	stream := client.Chat.Completions.NewStreaming(ctx, params, opts...)
	if resp == nil {
		return stream.Err()
	}
	id, token := resp.Header.Get("Lifeline-Request-Id"), resp.Header.Get("Lifeline-Resume-Token")
	last := 0
	for attempt := 1; ; attempt++ {
		for stream.Next() {
			c := stream.Current()
			if len(c.Choices) > 0 {
				fmt.Print(c.Choices[0].Delta.Content)
			}
			// 2. The last sequence number printed.
			var ll struct {
				SequenceNo int `json:"sequence_no"`
			}
			if json.Unmarshal([]byte(c.JSON.ExtraFields["lifeline"].Raw()), &ll) == nil && ll.SequenceNo > 0 {
				last = ll.SequenceNo
			}
		}
		if stream.Err() == nil {
			fmt.Println()
			return nil
		}
		if attempt > 3*len(urls) {
			return fmt.Errorf("gave up after %d attempts: %w", attempt, stream.Err())
		}
		// 3. Resume at another frontend after the last sequence number.
		next := urls[attempt%len(urls)]
		fmt.Fprintf(os.Stderr, "resume-go: stream broke (%v); resuming at %s after %d\n", stream.Err(), next, last)
		stream = resume(ctx, next, id, token, last)
	}
}

// resume opens the stream's rest at the frontend at url, read by the
// SDK's own SSE decoder.
func resume(ctx context.Context, url, id, token string, after int) *ssestream.Stream[openai.ChatCompletionChunk] {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/streams/"+id, nil)
	if err != nil {
		return ssestream.NewStream[openai.ChatCompletionChunk](nil, err)
	}
	req.Header.Set("Last-Event-ID", strconv.Itoa(after))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err == nil && resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		err = fmt.Errorf("%s: %s", resp.Status, body)
	}
	if err != nil {
		return ssestream.NewStream[openai.ChatCompletionChunk](nil, err)
	}
	return ssestream.NewStream[openai.ChatCompletionChunk](ssestream.NewDecoder(resp), nil)
}
