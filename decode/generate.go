package decode

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/lifeline-llm/lifeline/decode/sample"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
)

// GenerateOptions are the flags of `lifeline engine generate`.
type GenerateOptions struct {
	Engine       Options
	Prompt       string
	PrefixTokens []int
	MaxTokens    int
	Sampling     sample.Params
	Stop         []string
	IgnoreEOS    bool
	// JSON prints one object per token instead of plain text.
	JSON bool
	// Stats, when set, receives one JSON object with the run's KV figures.
	Stats io.Writer
}

// RunStats is what --stats prints after a generation.
type RunStats struct {
	Generated       int                  `json:"generated"`
	ReusedPositions int                  `json:"reused_positions"`
	FinishReason    string               `json:"finish_reason"`
	Cache           *kvclient.CacheStats `json:"cache,omitempty"`
}

// TokenLine is the JSON object printed per generated token. FinishReason is
// set on the last token only.
type TokenLine struct {
	SequenceNo   int    `json:"sequence_no"`
	TokenID      int    `json:"token_id"`
	Text         string `json:"text"`
	FinishReason string `json:"finish_reason,omitempty"`
}

// RunGenerate runs one generation on a fresh engine and streams it to out.
func RunGenerate(ctx context.Context, opts GenerateOptions, out io.Writer) error {
	e, err := NewEngine(opts.Engine)
	if err != nil {
		return err
	}
	defer e.Close()
	events, err := e.Generate(ctx, Request{
		Prompt: opts.Prompt, PrefixTokens: opts.PrefixTokens, MaxTokens: opts.MaxTokens,
		Sampling: opts.Sampling, Stop: opts.Stop, IgnoreEOS: opts.IgnoreEOS,
	})
	if err != nil {
		return err
	}
	w := bufio.NewWriter(out)
	defer w.Flush()
	enc := json.NewEncoder(w)
	generated := 0
	for ev := range events {
		if ev.Done {
			if opts.Stats != nil {
				st := RunStats{Generated: generated, ReusedPositions: ev.ReusedPositions, FinishReason: string(ev.FinishReason)}
				if e.Cache != nil {
					cs := e.Cache.Stats()
					st.Cache = &cs
				}
				json.NewEncoder(opts.Stats).Encode(st)
			}
			if !opts.JSON {
				fmt.Fprintln(w)
			}
			if ev.FinishReason == sched.FinishCancelled || ev.FinishReason == sched.FinishError {
				return fmt.Errorf("decode: generation ended: %s: %w", ev.FinishReason, ev.Err)
			}
			return nil
		}
		generated++
		if !opts.JSON {
			io.WriteString(w, ev.Text)
			w.Flush()
			continue
		}
		if err := enc.Encode(TokenLine{SequenceNo: ev.SequenceNo, TokenID: ev.TokenID, Text: ev.Text, FinishReason: string(ev.FinishReason)}); err != nil {
			return err
		}
		w.Flush()
	}
	return nil
}
