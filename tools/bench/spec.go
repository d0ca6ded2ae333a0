package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/lifeline-llm/lifeline/decode/model"
	"github.com/lifeline-llm/lifeline/decode/sched"
)

// specDraft is one speculative configuration of the bench.
type specDraft struct {
	name  string
	draft func(target *model.Model) (*model.Model, error)
}

// runSpecBench measures greedy decoding of small, one sequence at a time,
// with speculation ÷ without, for a tiny draft and for self-drafts of the
// first layers, on the same prompts; it checks that every configuration
// generates exactly the plain run's tokens.
func runSpecBench(tokens int) error {
	const k = 4
	target, err := model.Synthetic("small", 1)
	if err != nil {
		return err
	}
	drafts := []specDraft{
		{"tiny draft", func(t *model.Model) (*model.Model, error) { return model.SyntheticDraft("tiny", 2, t.Config) }},
		{"self-draft, first 1 layer", func(t *model.Model) (*model.Model, error) { return t.FirstLayers(1) }},
		{"self-draft, first 2 layers", func(t *model.Model) (*model.Model, error) { return t.FirstLayers(2) }},
	}
	prompts := [][]int{promptOf(8), promptOf(16), append(promptOf(4), 900, 1200, 1500), append(promptOf(12), 2100)}
	fmt.Printf("# Speculative decoding (small target, greedy, batch 1, %d tokens per prompt, k = %d)\n\n", tokens, k)
	var want [][]int
	plain, err := median3(func() (float64, error) {
		var rate float64
		rate, want, _, err = specThroughput(target, nil, prompts, tokens)
		return rate, err
	})
	if err != nil {
		return err
	}
	fmt.Printf("| draft | tokens/s | ÷ plain | draft tokens accepted |\n|---|---|---|---|\n")
	fmt.Printf("| none (plain) | %.0f | 1.00× | — |\n", plain)
	for _, d := range drafts {
		dm, err := d.draft(target)
		if err != nil {
			return err
		}
		var st sched.Stats
		rate, err := median3(func() (float64, error) {
			rate, got, s, err := specThroughput(target, &sched.Speculation{Draft: dm, K: k}, prompts, tokens)
			if err == nil && !slices.EqualFunc(got, want, slices.Equal) {
				err = fmt.Errorf("spec bench: %s: output differs from the plain run's", d.name)
			}
			st = s
			return rate, err
		})
		if err != nil {
			return err
		}
		fmt.Printf("| %s | %.0f | %.2f× | %d of %d (%.0f%%) |\n", d.name, rate, rate/plain, st.DraftAccepted, st.DraftProposed,
			100*float64(st.DraftAccepted)/float64(max(st.DraftProposed, 1)))
	}
	fmt.Println()
	return nil
}

// specThroughput generates tokens greedy tokens after each prompt, one
// prompt at a time, and returns the tokens per second (prefill included),
// the outputs and the scheduler's counters.
func specThroughput(m *model.Model, sp *sched.Speculation, prompts [][]int, tokens int) (float64, [][]int, sched.Stats, error) {
	s, _, err := newScheduler(m, 1, 16+tokens)
	if err != nil {
		return 0, nil, sched.Stats{}, err
	}
	if sp != nil {
		if err := s.Speculate(*sp); err != nil {
			return 0, nil, sched.Stats{}, err
		}
	}
	outs := make([][]int, len(prompts))
	start := time.Now()
	for i, p := range prompts {
		err := s.Submit(sched.Request{ID: fmt.Sprint(i), Prompt: p, MaxTokens: tokens,
			OnToken:  func(t sched.Token) bool { outs[i] = append(outs[i], t.ID); return true },
			OnFinish: func(sched.Finish) {}})
		if err != nil {
			return 0, nil, sched.Stats{}, err
		}
		for {
			busy, err := s.Step()
			if err != nil {
				return 0, nil, sched.Stats{}, err
			}
			if !busy {
				break
			}
		}
		if len(outs[i]) != tokens {
			return 0, nil, sched.Stats{}, fmt.Errorf("spec bench: prompt %d: %d tokens, want %d", i, len(outs[i]), tokens)
		}
	}
	return float64(len(prompts)*tokens) / time.Since(start).Seconds(), outs, s.Stats(), nil
}
