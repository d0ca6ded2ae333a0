package main

import (
	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/worker"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

func workerCmd() *cobra.Command {
	var (
		opts                  worker.Options
		maxRunning, maxQueued int
	)
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Serve one engine instance over QUIC (started by the node agent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if maxRunning > 0 {
				opts.Engine.Limits = sched.Limits{MaxRunning: maxRunning, MaxQueued: maxQueued, MaxStepTokens: sched.DefaultLimits.MaxStepTokens}
			}
			return worker.Run(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.InstanceID, "instance-id", "", "instance id")
	f.Uint64Var(&opts.Generation, "generation", 0, "instance generation, stamped on every frame")
	f.StringVar(&opts.Role, "role", "decode", "decode, prefill or both")
	f.StringVar(&opts.Listen, "listen", "127.0.0.1:0", "UDP address of the QUIC endpoint")
	f.StringVar(&opts.CertDir, "certs", "", "certificate directory (lifeline certs init)")
	f.StringVar(&opts.Engine.Preset, "preset", "tiny", "synthetic model preset")
	f.Uint64Var(&opts.Engine.WeightSeed, "weight-seed", 1, "seed of the synthetic weights")
	f.StringVar(&opts.Engine.ModelPath, "model", "", "llama2.c model.bin")
	f.StringVar(&opts.Engine.TokenizerPath, "tokenizer", "", "llama2.c tokenizer.bin")
	f.StringVar(&opts.Engine.KVSocket, "kv-socket", "", "the node's KV arena owner socket")
	f.StringVar(&opts.KVTransfer, "kv-transfer", "", "the node agent's KV transfer endpoint (migrated requests pull their blocks through it)")
	f.IntVar(&maxRunning, "max-running", 0, "hard limit on running sequences (0: default)")
	f.IntVar(&maxQueued, "max-queued", 0, "hard limit on queued requests (0: default, or none when max-running is set)")
	return cmd
}

func certsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "certs", Short: "Cluster certificates for mutual TLS between components"}
	var (
		dir   string
		hosts []string
	)
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Create a cluster CA and a node certificate in --dir (kept if present)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return pki.Init(dir, hosts)
		},
	}
	initCmd.Flags().StringVar(&dir, "dir", "", "certificate directory")
	initCmd.Flags().StringSliceVar(&hosts, "host", nil, "extra DNS names or IPs for the node certificate")
	initCmd.MarkFlagRequired("dir")
	cmd.AddCommand(initCmd)
	return cmd
}
