// Command nodectl inspects a node through its agent's control socket.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/lifeline-llm/lifeline/agent/nodectl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := nodectl.Command().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "nodectl:", err)
		os.Exit(1)
	}
}
