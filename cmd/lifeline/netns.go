package main

import (
	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/internal/netns"
)

// netnsExecCmd runs a command in a network namespace: `lifeline up
// --netns` starts each node's agent through it.
func netnsExecCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "netns-exec NAMESPACE -- COMMAND [ARG…]",
		Short:  "Run a command in network namespace NAMESPACE (/run/netns/NAMESPACE)",
		Hidden: true,
		Args:   cobra.MinimumNArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			return netns.Exec(args[0], args[1:])
		},
	}
}
