package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	loadgen "github.com/lifeline-llm/lifeline/internal/app/load"
	"github.com/lifeline-llm/lifeline/internal/app/overload"
)

// loadResult is what `lifeline load` prints: the clients' report and,
// with --metrics, what the frontends spent on it.
type loadResult struct {
	Requests    int     `json:"requests"`
	Completed   int     `json:"completed"`
	Failed      int     `json:"failed"`
	FirstError  string  `json:"first_error,omitempty"`
	Tokens      int64   `json:"tokens"`
	Seconds     float64 `json:"seconds"`
	StartRate   float64 `json:"start_rate"`
	PeakOpen    int64   `json:"peak_open"`
	TTFTP50Ms   float64 `json:"ttft_p50_ms"`
	TTFTP99Ms   float64 `json:"ttft_p99_ms"`
	GapP50Ms    float64 `json:"gap_p50_ms"`
	GapP99Ms    float64 `json:"gap_p99_ms"`
	Relayed     float64 `json:"relayed_tokens,omitempty"`
	CPUPerToken float64 `json:"frontend_cpu_us_per_token,omitempty"`
}

func loadCmd() *cobra.Command {
	var (
		urls, metrics []string
		cfg           loadgen.Config
		asJSON        bool
	)
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Open streams at a rate through frontends and report latency, and with --metrics the frontends' CPU per relayed token",
		Long: `load starts --requests streamed completions at --rate a second across the
--url frontends (round robin), each with a seeded prompt, max_tokens
--max-tokens and ignore_eos, reads every stream to its end and reports
what the clients saw: completed and failed streams, tokens, the start
rate reached, the most streams open at once, time to the first token and
between tokens (p50, p99). With --metrics (each frontend's metrics URL)
it also reports the frontends' CPU per relayed token over the run.
Point it only at a fleet you run: it is a load test.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.URLs = urls
			if err := cfg.Validate(); err != nil {
				return fmt.Errorf("%w (flags --url, --model, --requests, --rate, --max-tokens)", err)
			}
			res, err := runLoad(cmd.Context(), cfg, metrics)
			if err != nil {
				return err
			}
			printLoad(cmd.OutOrStdout(), res, asJSON)
			if res.Failed > 0 {
				return fmt.Errorf("load: %d of %d streams failed; the first: %s", res.Failed, res.Requests, res.FirstError)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&urls, "url", nil, "a frontend's base URL (repeat for several)")
	f.StringArrayVar(&metrics, "metrics", nil, "a frontend's metrics base URL (/metrics is read), for the CPU per relayed token (repeat: one per frontend loaded)")
	f.StringVar(&cfg.Model, "model", "", "the model to ask for")
	f.IntVar(&cfg.Requests, "requests", 100, "streams to open")
	f.Float64Var(&cfg.Rate, "rate", 10, "streams started a second (0: all at once)")
	f.IntVar(&cfg.MaxTokens, "max-tokens", 64, "tokens per stream")
	f.Uint64Var(&cfg.Seed, "seed", 1, "stream i's sampler seed is seed+i")
	f.BoolVar(&cfg.HTTP2, "h2c", false, "send over cleartext HTTP/2, streams sharing connections as a load balancer's do (default: HTTP/1.1, a connection a stream)")
	f.BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	return cmd
}

// frontendCost sums the frontends' CPU seconds and relayed tokens.
func frontendCost(ctx context.Context, metrics []string) (cpu, tokens float64, err error) {
	for _, u := range metrics {
		m, err := overload.Scrape(ctx, u)
		if err != nil {
			return 0, 0, fmt.Errorf("load: --metrics %s: %w", u, err)
		}
		cpu += m["process_cpu_seconds_total"]
		tokens += m["lifeline_frontend_tokens_total"]
	}
	return cpu, tokens, nil
}

func runLoad(ctx context.Context, cfg loadgen.Config, metrics []string) (loadResult, error) {
	cpu0, tok0, err := frontendCost(ctx, metrics)
	if err != nil {
		return loadResult{}, err
	}
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return loadResult{}, err
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	res := loadResult{Requests: rep.Requests, Completed: rep.Completed, Failed: rep.Failed, FirstError: rep.FirstError,
		Tokens: rep.Tokens, Seconds: rep.Elapsed.Seconds(), StartRate: rep.StartRate, PeakOpen: rep.PeakOpen,
		TTFTP50Ms: ms(rep.TTFT.P50), TTFTP99Ms: ms(rep.TTFT.P99), GapP50Ms: ms(rep.Gap.P50), GapP99Ms: ms(rep.Gap.P99)}
	if len(metrics) > 0 {
		cpu1, tok1, err := frontendCost(ctx, metrics)
		if err != nil {
			return loadResult{}, err
		}
		res.Relayed = tok1 - tok0
		if res.Relayed > 0 {
			res.CPUPerToken = (cpu1 - cpu0) / res.Relayed * 1e6
		}
	}
	return res, nil
}

func printLoad(w io.Writer, r loadResult, asJSON bool) {
	if asJSON {
		json.NewEncoder(w).Encode(r)
		return
	}
	fmt.Fprintf(w, "streams: %d started (%.1f/s), %d completed, %d failed; %d tokens in %.1fs; at most %d open at once\n",
		r.Requests, r.StartRate, r.Completed, r.Failed, r.Tokens, r.Seconds, r.PeakOpen)
	fmt.Fprintf(w, "time to first token: p50 %.1f ms, p99 %.1f ms\nbetween tokens:      p50 %.1f ms, p99 %.1f ms\n",
		r.TTFTP50Ms, r.TTFTP99Ms, r.GapP50Ms, r.GapP99Ms)
	if r.Relayed > 0 {
		fmt.Fprintf(w, "frontends: %.0f tokens relayed, %.1f µs of CPU per relayed token\n", r.Relayed, r.CPUPerToken)
	}
}
