package frontend

import (
	"fmt"
	"strconv"
	"strings"
)

// This file reads the parameters that ask for several choices in one
// request: n, best_of (equal to n) and a prompt array of k prompts. Each
// choice is a request of its own (a child: its own token log, run, epoch,
// record and routing), so that each migrates alone; the parent is what the
// client sees (one id, one resume token) and the response multiplexes the
// children (choices_stream.go). Choice i = prompt_index*n + j, as OpenAI
// numbers them.

// Bounds on the choices of one request.
const (
	maxN            = 16 // n
	maxBatchPrompts = 16 // prompts of a prompt array
	maxChoices      = 64 // n × prompts
)

// BatchPrompt is one prompt of a batched completion: a text or token ids.
type BatchPrompt struct {
	Prompt       string `json:"prompt,omitempty"`
	PromptTokens []int  `json:"prompt_tokens,omitempty"`
}

// ChoiceOf places a child request in its parent: its choice index, the
// parent's number of choices, and its prompt's index.
type ChoiceOf struct {
	Parent string `json:"parent"`
	Index  int    `json:"index"`
	Count  int    `json:"count"`
	Prompt int    `json:"prompt"`
}

// ChoiceSeed is the sampling seed of choice i of a request seeded with
// seed: choice 0 keeps the request's seed (so n = 1 is unchanged), choice
// i > 0 gets splitmix64(seed + i·0x9E3779B97F4A7C15) >> 1, in
// 0..2^63-1 like every seed. A fixed function: a migrated or taken-over
// choice samples with the same seed.
func ChoiceSeed(seed uint64, i int) uint64 {
	if i == 0 {
		return seed
	}
	z := seed + uint64(i)*0x9E3779B97F4A7C15
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return (z ^ z>>31) >> 1
}

// choiceCount is how many choices the request asks for: n per prompt.
func (b *CompletionRequest) choiceCount() int {
	return max(b.N, 1) * max(len(b.Batch), 1)
}

// children are the requests of b's choices, in choice order: b with one
// prompt, the choice's seed, and its place.
func (b *CompletionRequest) children(parent string) []CompletionRequest {
	prompts := b.Batch
	if len(prompts) == 0 {
		prompts = []BatchPrompt{{Prompt: b.Prompt, PromptTokens: b.PromptTokens}}
	}
	n, count := max(b.N, 1), b.choiceCount()
	out := make([]CompletionRequest, 0, count)
	for p, pr := range prompts {
		for j := range n {
			c := *b
			c.N, c.Batch = 0, nil
			c.Prompt, c.PromptTokens = pr.Prompt, pr.PromptTokens
			i := p*n + j
			c.Seed = ChoiceSeed(b.Seed, i)
			c.Choice = &ChoiceOf{Parent: parent, Index: i, Count: count, Prompt: p}
			out = append(out, c)
		}
	}
	return out
}

// groupID names a request of count > 1 choices: the count is in the id
// ("-c<count>"), so that any frontend knows from the id alone how many
// choices it has and where their records are (childID), without a record
// of its own.
func groupID(base string, count int) string { return base + "-c" + strconv.Itoa(count) }

// childID is the request id of choice i of parent.
func childID(parent string, i int) string { return parent + "." + strconv.Itoa(i) }

// groupCount is the number of choices a request id names: 0 for an id of
// one choice.
func groupCount(id string) int {
	i := strings.LastIndex(id, "-c")
	if i < 0 || strings.Contains(id[i:], ".") {
		return 0
	}
	digits := id[i+2:]
	if digits == "" || len(digits) > 3 || strings.TrimLeft(digits, "0123456789") != "" || digits[0] == '0' {
		return 0
	}
	n, _ := strconv.Atoi(digits)
	if n < 2 || n > maxChoices {
		return 0
	}
	return n
}

// parseChoices reads n and best_of (n's alias when equal; refusals has
// refused it when larger).
func parseChoices(b *openAIRequest, out *CompletionRequest) error {
	if b.N != nil {
		n, err := parseInt("n", *b.N, 1, maxN)
		if err != nil {
			return err
		}
		out.N = int(n)
	}
	if b.BestOf != nil {
		bo, err := parseInt("best_of", *b.BestOf, 1, maxN)
		if err != nil {
			return err
		}
		if int(bo) < max(out.N, 1) {
			return invalid("best_of", "best_of %d is less than n %d: want best_of ≥ n", bo, max(out.N, 1))
		}
	}
	if c := out.choiceCount(); c > maxChoices {
		return invalid("n", "n %d × %d prompts = %d choices: at most %d", max(out.N, 1), len(out.Batch), c, maxChoices)
	}
	return nil
}

// bestOfAboveN: best_of asks for more candidates than choices (n, 1 if
// unset), a search whose candidate tree cannot be migrated.
func bestOfAboveN(b *openAIRequest) bool {
	if b.BestOf == nil {
		return false
	}
	bo, err := b.BestOf.Float64()
	n := 1.0
	if b.N != nil {
		if v, err := b.N.Float64(); err == nil {
			n = v
		}
	}
	return err != nil || bo > n
}

// batchOfTexts reads a prompt array of strings: one is a plain prompt,
// several a batch.
func batchOfTexts(texts []string, out *CompletionRequest) error {
	if err := batchSize(len(texts)); err != nil {
		return err
	}
	for i, t := range texts {
		if t == "" {
			return invalid(promptParam(len(texts), i), "the prompt must not be empty")
		}
		if len(texts) > 1 {
			out.Batch = append(out.Batch, BatchPrompt{Prompt: t})
		}
	}
	out.Prompt = texts[0]
	return nil
}

// batchOfTokens reads a prompt array of token-id arrays.
func batchOfTokens(batch [][]int64, out *CompletionRequest) error {
	if err := batchSize(len(batch)); err != nil {
		return err
	}
	for i, ids := range batch {
		toks, err := promptTokens(promptParam(len(batch), i), ids)
		if err != nil {
			return err
		}
		if len(batch) > 1 {
			out.Batch = append(out.Batch, BatchPrompt{PromptTokens: toks})
		}
		if i == 0 {
			out.PromptTokens = toks
		}
	}
	return nil
}

func batchSize(k int) error {
	switch {
	case k == 0:
		return invalid("prompt", "the prompt must not be empty")
	case k > maxBatchPrompts:
		return invalid("prompt", "%d prompts: at most %d in one request", k, maxBatchPrompts)
	}
	return nil
}

func promptParam(k, i int) string {
	if k == 1 {
		return "prompt"
	}
	return fmt.Sprintf("prompt[%d]", i)
}
