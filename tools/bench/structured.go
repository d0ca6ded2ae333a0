package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/grammar"
	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
)

// benchSchema is a realistic response_format: a property of each type, an
// enum, an array and a nested object.
const benchSchema = `{"type":"object","properties":{
	"name":{"type":"string"},
	"age":{"type":"integer"},
	"height":{"type":"number"},
	"member":{"type":"boolean"},
	"plan":{"enum":["free","pro","team"]},
	"tags":{"type":"array","items":{"type":"string"},"maxItems":4},
	"address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"integer"}},"required":["city"]}},
	"required":["name","age","plan","tags"]}`

var structuredPrompts = []string{
	"Describe a customer as JSON:",
	"The user profile is",
	"Return the record for the new member",
	"Once upon a time a clerk wrote down",
}

// runStructuredBench measures structured output's cost at the engine
// (preset small): tokens/s of the same prompts and seeds with the json
// schema ÷ without, one at a time and all at once, and the cost of one
// grammar mask beside a decode step.
func runStructuredBench() error {
	fmt.Printf("## Structured output (engine, preset small)\n\n")
	e, err := decode.NewEngine(decode.Options{Preset: "small", WeightSeed: 1})
	if err != nil {
		return err
	}
	defer e.Close()
	a, err := grammar.Compile([]byte(benchSchema))
	if err != nil {
		return err
	}
	e.GrammarVocab() // built once per engine, not per request: not timed
	const maxTokens = 64
	fmt.Printf("| run | plain tokens/s | json_schema tokens/s | ratio | tokens per run, plain / json_schema |\n|---|---|---|---|---|\n")
	var stepTime time.Duration
	for _, batch := range []int{1, len(structuredPrompts)} {
		// Interleaved, five of each, medians: the cores are shared and
		// drift over a run would otherwise favour one side.
		var runs [2][]float64
		var per [2]float64
		for range 5 {
			for i, s := range []*decode.Structured{nil, {Automaton: a}} {
				tps, tokens, err := structuredThroughput(e, s, batch, maxTokens)
				if err != nil {
					return err
				}
				runs[i] = append(runs[i], tps)
				per[i] = float64(tokens) / float64(len(structuredPrompts))
			}
		}
		var res [2]float64
		for i := range runs {
			slices.Sort(runs[i])
			res[i] = runs[i][len(runs[i])/2]
		}
		if batch == 1 {
			stepTime = time.Duration(float64(time.Second) / res[0])
		}
		fmt.Printf("| %d prompt(s) at once, temperature 1 | %.0f | %.0f | %.2f× | %.0f / %.0f |\n", batch, res[0], res[1], res[1]/res[0], per[0], per[1])
	}
	mask, err := maskCost(e, a)
	if err != nil {
		return err
	}
	fmt.Printf("\none MaskBudget over the %d-token vocabulary: %.1f µs on average over the states of a sampled output; a batch-1 decode step of small: %.0f µs (%.1f%%)\n\n",
		e.GrammarVocab().Size(), float64(mask.Nanoseconds())/1e3, float64(stepTime.Nanoseconds())/1e3, 100*float64(mask)/float64(stepTime))
	return nil
}

// structuredThroughput runs the prompts (batch of them at once, the rest
// after) with seeds 1.. and returns output tokens per second and tokens. A
// structured run ends when its value closes, so its token count is its
// own: shorter runs leave a batch sooner and carry more prefill per token.
func structuredThroughput(e *decode.Engine, s *decode.Structured, batch, maxTokens int) (float64, int, error) {
	tokens := 0
	start := time.Now()
	for at := 0; at < len(structuredPrompts); at += batch {
		var chans []<-chan decode.Event
		for i, p := range structuredPrompts[at:min(at+batch, len(structuredPrompts))] {
			ch, err := e.Generate(context.Background(), decode.Request{Prompt: p, MaxTokens: maxTokens, IgnoreEOS: true,
				Sampling: sample.Params{Temperature: 1, Seed: uint64(at + i + 1)}, Structured: s})
			if err != nil {
				return 0, 0, err
			}
			chans = append(chans, ch)
		}
		for _, ch := range chans {
			var text []byte
			for ev := range ch {
				if ev.Err != nil {
					return 0, 0, ev.Err
				}
				if !ev.Done {
					tokens++
					text = append(text, ev.Text...)
				} else if s != nil && (ev.FinishReason != sched.FinishStop || !json.Valid(text)) {
					return 0, 0, fmt.Errorf("structured run ended %s with %q", ev.FinishReason, text)
				}
			}
		}
	}
	return float64(tokens) / time.Since(start).Seconds(), tokens, nil
}

// maskCost is the mean time of one MaskBudget call over the states of a
// sampled structured output (inside strings, between values, in numbers).
func maskCost(e *decode.Engine, a *grammar.Automaton) (time.Duration, error) {
	ch, err := e.Generate(context.Background(), decode.Request{Prompt: structuredPrompts[0], MaxTokens: 64,
		Sampling: sample.Params{Temperature: 1, Seed: 1}, Structured: &decode.Structured{Automaton: a}})
	if err != nil {
		return 0, err
	}
	v := e.GrammarVocab()
	states := []grammar.State{a.Start()}
	for ev := range ch {
		if !ev.Done {
			s, _ := a.Advance(states[len(states)-1], v.Piece(ev.TokenID))
			states = append(states, s)
		}
	}
	allowed := make([]bool, v.Size())
	calls := 0
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		for i, s := range states {
			a.MaskBudget(s, v, allowed, 64-i)
			calls++
		}
	}
	return time.Since(start) / time.Duration(calls), nil
}
