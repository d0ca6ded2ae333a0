package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/kv"
	"github.com/lifeline-llm/lifeline/kv/kvclient"
)

func kvCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "kv", Short: "The node's shared-memory KV arena and its owner"}
	var socket string
	cmd.PersistentFlags().StringVar(&socket, "socket", "/run/lifeline/kv.sock", "the arena owner's unix socket")

	var so kv.ServeOptions
	serve := &cobra.Command{
		Use:   "serve",
		Short: "Own the arena: manifests, leases, sweeper, and the service socket",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			so.Socket = socket
			return kv.RunServe(cmd.Context(), so, cmd.ErrOrStderr())
		},
	}
	f := serve.Flags()
	f.StringVar(&so.Arena, "arena", "/dev/shm/lifeline-kv", "arena file (created if missing, reopened as is otherwise)")
	f.IntVar(&so.Slots, "slots", 1024, "number of block slots")
	f.IntVar(&so.SlotBytes, "slot-bytes", 131072, "bytes per slot (at least one KV block)")
	f.StringVar(&so.DBDir, "db", "/var/lib/lifeline/kv", "Badger directory of the manifests")
	f.DurationVar(&so.LeaseTTL, "lease-ttl", 3*time.Second, "session lease; unrenewed writers' blocks are reclaimed after it")
	f.Float64Var(&so.HighWater, "high-water", 0.9, "fraction of slots in use above which unleased blocks are evicted (LRU)")

	stats := &cobra.Command{
		Use:   "stats",
		Short: "Print slot counts by state and the owner's counters as JSON",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := kvclient.NewAdminClient(socket).Stats(cmd.Context())
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(st)
		},
	}
	var w kv.Writer
	dead := &cobra.Command{
		Use:   "writer-dead",
		Short: "Report a writer's death: reclaim its unpublished blocks and leases now",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := kvclient.NewAdminClient(socket).WriterDead(cmd.Context(), w)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d blocks reclaimed\n", n)
			return nil
		},
	}
	dead.Flags().StringVar(&w.Instance, "instance-id", "", "writer instance id")
	dead.Flags().Uint64Var(&w.Gen, "generation", 0, "writer generation")
	sweep := &cobra.Command{
		Use:   "sweep",
		Short: "Run one mark-and-sweep pass now",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := kvclient.NewAdminClient(socket).Sweep(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d blocks reclaimed\n", n)
			return nil
		},
	}
	cmd.AddCommand(serve, stats, dead, sweep)
	return cmd
}
