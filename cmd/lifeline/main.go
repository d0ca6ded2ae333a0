// Command lifeline runs Lifeline's processes; today the reference engine
// (`lifeline engine generate`).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/internal/failpoint"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := rootCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "lifeline:", err)
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "lifeline",
		Short:         "Keep streaming LLM requests alive through failures",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	engine := &cobra.Command{Use: "engine", Short: "Run the reference engine directly"}
	engine.AddCommand(generateCmd())
	root.AddCommand(engine, kvCmd(), workerCmd(), certsCmd(), agentCmd(), frontendCmd(), upCmd(), upgradeCmd(), demoCmd(), drillCmd(), clientGenerateCmd(), loadCmd(), etcdCmd(), netnsExecCmd())
	return root
}

func generateCmd() *cobra.Command {
	var (
		opts    decode.GenerateOptions
		prefix  string
		stats   bool
		engine  string
		threads int
	)
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Stream one generation from the reference engine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ids, err := parseTokenIDs(prefix)
			if err != nil {
				return err
			}
			opts.PrefixTokens = ids
			if stats {
				opts.Stats = cmd.ErrOrStderr()
			}
			if err := failpoint.Check(); err != nil {
				return err
			}
			switch engine {
			case engineLifeline:
			case engineLlamaCpp:
				return generateGGUF(cmd.Context(), opts.Engine.ModelPath, opts, threads, cmd.OutOrStdout())
			default:
				return fmt.Errorf("--engine: %q (want %s or %s)", engine, engineLifeline, engineLlamaCpp)
			}
			return decode.RunGenerate(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Engine.Preset, "preset", "tiny", "synthetic model preset: tiny or small")
	f.Uint64Var(&opts.Engine.WeightSeed, "weight-seed", 1, "seed of the synthetic weights")
	f.StringVar(&engine, "engine", engineLifeline, "lifeline (the reference engine) or llamacpp (a GGUF --model through llama.cpp; a binary built with -tags llamacpp)")
	f.IntVar(&threads, "threads", 0, "--engine llamacpp: compute threads (0: every CPU)")
	f.StringVar(&opts.Engine.ModelPath, "model", "", "llama2.c model.bin (replaces --preset), or with --engine llamacpp a GGUF file")
	f.StringVar(&opts.Engine.TokenizerPath, "tokenizer", "", "llama2.c tokenizer.bin for --model")
	f.StringVar(&opts.Engine.DraftPreset, "draft-preset", "", "speculative decoding with this synthetic draft preset (tiny)")
	f.IntVar(&opts.Engine.DraftLayers, "draft-layers", 0, "speculative decoding with the target's first N layers as the draft")
	f.IntVar(&opts.Engine.DraftK, "draft-k", 4, "draft tokens proposed per step")
	f.StringVar(&opts.Prompt, "prompt", "", "prompt text")
	f.StringVar(&prefix, "prefix-tokens", "", "comma-separated output token ids already generated; continue after them")
	f.IntVar(&opts.MaxTokens, "max-tokens", 64, "total output tokens, prefix included")
	f.Uint64Var(&opts.Sampling.Seed, "seed", 0, "sampling seed")
	f.Float64Var(&opts.Sampling.Temperature, "temperature", 0.8, "sampling temperature; 0 is greedy")
	f.Float64Var(&opts.Sampling.TopP, "top-p", 0.95, "nucleus sampling threshold")
	f.IntVar(&opts.Sampling.TopK, "top-k", 0, "keep only the K most likely tokens; 0 keeps all")
	f.Float64Var(&opts.Sampling.FrequencyPenalty, "frequency-penalty", 0, "OpenAI frequency penalty")
	f.Float64Var(&opts.Sampling.PresencePenalty, "presence-penalty", 0, "OpenAI presence penalty")
	f.StringArrayVar(&opts.Stop, "stop", nil, "stop string (repeatable)")
	f.BoolVar(&opts.IgnoreEOS, "ignore-eos", false, "keep generating past end-of-sequence")
	f.BoolVar(&opts.JSON, "json", false, `print one JSON object per token: {"sequence_no","token_id","text"}`)
	f.StringVar(&opts.Engine.KVSocket, "kv-socket", "", "keep the KV cache in the node's shared arena via this owner socket")
	f.StringVar(&opts.Engine.InstanceID, "instance-id", "", "writer instance id for --kv-socket")
	f.Uint64Var(&opts.Engine.Generation, "generation", 1, "writer generation for --kv-socket")
	f.BoolVar(&stats, "stats", false, "print the run's KV figures as JSON on stderr")
	return cmd
}

func parseTokenIDs(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var ids []int
	for _, f := range strings.Split(s, ",") {
		id, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("--prefix-tokens: %q is not a token id", f)
		}
		ids = append(ids, id)
	}
	return ids, nil
}
