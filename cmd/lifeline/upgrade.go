package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"sort"

	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/agent/nodectl"
)

func upgradeCmd() *cobra.Command {
	var (
		opts    nodectl.RollingOptions
		rolling bool
		dataDir string
	)
	cmd := &cobra.Command{
		Use:   "upgrade --rolling (--data-dir DIR | --socket SOCK ...)",
		Short: "Restart every node's agent and workers, one node at a time, without failing a stream",
		Long: `Node by node: drain (within the disruption budget; requests in flight finish or
move), stop the agent, let its supervisor (systemd, or lifeline up) start it again
with the binary installed now, and wait until every instance the node had is ready
at a higher generation. Against lifeline up, --data-dir finds its nodes; elsewhere
give each node's agent control socket with --socket.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !rolling {
				return errors.New("upgrade: only --rolling is supported")
			}
			if dataDir != "" {
				socks, _ := filepath.Glob(filepath.Join(dataDir, "node-*", "agent.sock"))
				if len(socks) == 0 {
					return fmt.Errorf("upgrade: no node sockets under %s (is lifeline up running there?)", dataDir)
				}
				sort.Strings(socks)
				opts.Sockets = append(opts.Sockets, socks...)
			}
			return nodectl.RollingUpgrade(cmd.Context(), opts, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&rolling, "rolling", false, "one node at a time (the only mode)")
	f.StringVar(&dataDir, "data-dir", "", "a lifeline up data directory: upgrade its nodes")
	f.StringArrayVar(&opts.Sockets, "socket", nil, "a node agent's control socket (repeatable, in order)")
	f.StringVar(&opts.Deadline, "deadline", "30s", "each drain's deadline for requests in flight")
	f.StringVar(&opts.HardDeadline, "hard-deadline", "50s", "each drain's hard deadline")
	f.DurationVar(&opts.ReadyTimeout, "ready-timeout", 0, "how long a restarted node may take to be ready (default 2m)")
	return cmd
}
