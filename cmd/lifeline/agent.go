package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/agent"
	"github.com/lifeline-llm/lifeline/agent/nvmlgpu"
	"github.com/lifeline-llm/lifeline/internal/pki"
)

func agentCmd() *cobra.Command {
	var (
		opts        agent.Options
		config      string
		checkConfig bool
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent (systemd: deploy/lifeline-agent.service)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := agent.Options{}
			if config != "" {
				if err := agent.LoadFile(config, &o); err != nil {
					return err
				}
			}
			// Flags given on the command line win over the file.
			f := cmd.Flags()
			if f.Changed("node-id") {
				o.NodeID = opts.NodeID
			}
			if f.Changed("data-dir") {
				o.DataDir = opts.DataDir
			}
			if f.Changed("socket") || o.Socket == "" {
				o.Socket = opts.Socket
			}
			if f.Changed("etcd") {
				o.Etcd = opts.Etcd
			}
			if f.Changed("certs") {
				o.CertDir = opts.CertDir
			}
			if f.Changed("metrics-listen") {
				o.Metrics = opts.Metrics
			}
			if f.Changed("arena") {
				o.ArenaPath = opts.ArenaPath
			}
			o.Defaults()
			if err := o.Validate(); err != nil {
				return err
			}
			if checkConfig {
				// The certificates too: a missing or foreign directory
				// would fail only at the first etcd call.
				if err := pki.CheckDir(o.CertDir, pki.Agent(o.NodeID)); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "config OK")
				return nil
			}
			log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("node", o.NodeID)
			o.GPU = nvmlgpu.Open
			return agent.Run(cmd.Context(), o, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&config, "config", "", "JSON configuration file")
	f.BoolVar(&checkConfig, "check-config", false, "validate the configuration and exit")
	f.StringVar(&opts.NodeID, "node-id", "", "node id")
	f.StringVar(&opts.DataDir, "data-dir", "", "state directory")
	f.StringVar(&opts.Socket, "socket", "/run/lifeline/agent.sock", "control socket for nodectl")
	f.StringSliceVar(&opts.Etcd, "etcd", nil, "etcd endpoints host:port,...")
	f.StringVar(&opts.CertDir, "certs", "", "this agent's certificate directory (lifeline certs issue --role agent)")
	f.StringVar(&opts.Metrics, "metrics-listen", "", "address of /metrics, /livez, /readyz")
	f.StringVar(&opts.ArenaPath, "arena", "", "the node's KV arena file under /dev/shm")
	return cmd
}
