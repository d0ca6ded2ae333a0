package main

import (
	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/internal/app/localcluster"
)

func upCmd() *cobra.Command {
	var opts localcluster.Options
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a whole Lifeline on this machine: embedded etcd, node agents with workers, a frontend",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return localcluster.Run(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.DataDir, "data-dir", ".lifeline", "where certificates, etcd, arenas' manifests and logs go")
	f.IntVar(&opts.Nodes, "nodes", 2, "node agents to run, each with one decode worker")
	f.StringVar(&opts.Preset, "preset", "small", "model preset: tiny or small")
	f.StringVar(&opts.Engine, "engine", "", "lifeline (the reference engine: a preset, or --model) or llamacpp (--model a GGUF file; a lifeline built with -tags llamacpp); default: lifeline, or with --model lifeline when it computes the file and llamacpp otherwise, saying why")
	f.StringVar(&opts.Model, "model", "", "a GGUF file or a Hugging Face directory to serve instead of --preset")
	f.StringVar(&opts.ServedName, "served-model-name", "", "the model id clients ask for (default: the preset, or the model's base name without .gguf)")
	f.IntVar(&opts.Threads, "threads", 0, "compute threads per worker (0: every CPU)")
	f.IntVar(&opts.ContextLen, "context", 0, "--model: cap on the context in tokens (0: the model's; with llama.cpp at most 4096)")
	f.IntVar(&opts.GPULayers, "gpu-layers", 0, "--engine llamacpp: layers on the GPU (make llamacpp-cuda, LIFELINE_GGML_BACKENDS=$PWD/lib/lifeline)")
	f.IntVar(&opts.Prefill, "prefill", 0, "prefill instances to add (prefill/decode disaggregation); placed from the last node backwards")
	f.StringVar(&opts.Listen, "listen", "127.0.0.1:8080", "frontend HTTP address (frontend i listens on its port + i)")
	f.IntVar(&opts.Frontends, "frontends", 1, "frontends to run; any of them resumes any stream")
	f.IntVar(&opts.EtcdMembers, "etcd-members", 0, "run etcd as this many member processes (3 survives losing one, the leader included); 0: one member inside lifeline up")
	f.IntVar(&opts.TP, "tp", 1, "run each decode instance as a tensor-parallel group of this many worker processes (2 splits small and tiny)")
	f.BoolVar(&opts.TLS, "tls", false, "frontends serve HTTPS and HTTP/3 (one port each) with certificates of the cluster's CA; up prints the CA's path")
	f.BoolVar(&opts.NetNS, "netns", false, "run each node in a network namespace of its own joined by a bridge (root), so that one can be cut off for real: ip link set LINK down")
	f.IntVar(&opts.ArenaMB, "arena-mb", 0, "each node's KV arena in MiB (0: an eighth of the memory this machine may use, split between the nodes, at most 1 GiB each)")
	return cmd
}

func demoCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "demo", Short: "Demonstrations"}
	var opts localcluster.DemoOptions
	failover := &cobra.Command{
		Use:   "failover",
		Short: "Kill the decode worker of a seeded stream after sequence 127 and check the continuation is bit-identical",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return localcluster.Failover(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := failover.Flags()
	f.StringVar(&opts.Preset, "preset", "small", "model preset")
	f.IntVar(&opts.KillAfter, "kill-after", 127, "kill the worker right after this sequence number reaches the client")
	f.IntVar(&opts.MaxTokens, "max-tokens", 300, "tokens in the stream")
	f.Uint64Var(&opts.Seed, "seed", 42, "sampling seed")
	cmd.AddCommand(failover)
	return cmd
}
