package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/frontend"
)

func frontendCmd() *cobra.Command {
	var (
		opts         frontend.Options
		secretFile   string
		capacityWait time.Duration
	)
	cmd := &cobra.Command{
		Use:   "frontend",
		Short: "Serve the client API (OpenAI-compatible completions with mid-stream migration)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if secretFile != "" {
				b, err := os.ReadFile(secretFile)
				if err != nil {
					return fmt.Errorf("--resume-secret-file: %w", err)
				}
				if len(b) < 16 {
					return fmt.Errorf("--resume-secret-file: %d bytes (want at least 16)", len(b))
				}
				opts.ResumeSecret = b
			}
			if capacityWait < 0 {
				return fmt.Errorf("--capacity-wait: %v (0 fails at once)", capacityWait)
			}
			opts.CapacityWait = capacityWait
			if capacityWait == 0 {
				opts.CapacityWait = -1 // the option's "do not wait"
			}
			log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
			return frontend.Run(cmd.Context(), opts, log, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Listen, "listen", "127.0.0.1:8080", "HTTP address")
	f.StringSliceVar(&opts.Etcd, "etcd", nil, "etcd endpoints host:port,...")
	f.BoolVar(&opts.EtcdTLS, "etcd-tls", false, "connect to etcd with mutual TLS (the node certificate)")
	f.StringVar(&opts.CertDir, "certs", "", "certificate directory (lifeline certs init)")
	f.StringVar(&secretFile, "resume-secret-file", "", "key for resume tokens, shared by replicas so that each accepts the others' tokens (default: random per process); a stream's log stays on the replica that served it, so resume there")
	f.BoolVar(&opts.NoKVPull, "no-kv-pull", false, "do not let a migrated request's new worker pull its prefix KV from peers (it recomputes what its node lacks)")
	f.DurationVar(&capacityWait, "capacity-wait", frontend.DefaultCapacityWait, "how long a request that finds no routable instance of its model (starting, restarting) waits for one before a retryable 503 no_capacity with Retry-After; 0 fails at once")
	f.BoolVar(&opts.TLS, "tls", false, "serve HTTPS (HTTP/1.1, HTTP/2) and HTTP/3 on the same port, with Alt-Svc")
	return cmd
}
