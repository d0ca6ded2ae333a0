package main

import (
	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/internal/cluster"
)

func upCmd() *cobra.Command {
	var opts cluster.Options
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a whole Lifeline on this machine: embedded etcd, node agents with workers, a frontend",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return cluster.Run(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.DataDir, "data-dir", ".lifeline", "where certificates, etcd, arenas' manifests and logs go")
	f.IntVar(&opts.Nodes, "nodes", 2, "node agents to run, each with one decode worker")
	f.StringVar(&opts.Preset, "preset", "small", "model preset: tiny or small")
	f.StringVar(&opts.Listen, "listen", "127.0.0.1:8080", "frontend HTTP address")
	return cmd
}
