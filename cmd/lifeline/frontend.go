package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lifeline-llm/lifeline/frontend"
	"github.com/lifeline-llm/lifeline/frontend/reqfsm"
	"github.com/lifeline-llm/lifeline/internal/pki"
	"github.com/lifeline-llm/lifeline/internal/tracing"
)

func frontendCmd() *cobra.Command {
	var (
		opts            frontend.Options
		secretFile      string
		capacityWait    time.Duration
		failoverRecords bool
		otlp            tracing.Options
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
			opts.NoFailoverRecords = !failoverRecords
			if capacityWait == 0 {
				opts.CapacityWait = -1 // the option's "do not wait"
			}
			switch {
			case opts.Limits.KeepAlive < 0:
				return fmt.Errorf("--sse-keepalive: %v (0 sends none)", opts.Limits.KeepAlive)
			case opts.Limits.KeepAlive == 0:
				opts.Limits.KeepAlive = -1 // the option's "never"
			}
			log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
			otlp.Service, otlp.Instance = "lifeline-frontend", opts.ID
			tr, err := tracing.New(otlp)
			if err != nil {
				return err
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				tr.Shutdown(ctx)
			}()
			opts.Tracing = tr
			return frontend.Run(cmd.Context(), opts, log, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Listen, "listen", "127.0.0.1:8080", "HTTP address")
	f.StringSliceVar(&opts.Etcd, "etcd", nil, "etcd endpoints host:port,...")
	f.BoolVar(&opts.EtcdTLS, "etcd-tls", false, "connect to etcd with mutual TLS (the --certs certificate; etcd maps its CN to a user)")
	f.StringVar(&opts.CertDir, "certs", "", "this frontend's certificate directory (lifeline certs issue --role frontend)")
	f.StringVar(&secretFile, "resume-secret-file", "", "a static key for resume tokens instead of the cluster's key ring in etcd (replicas must then share the file to accept each other's tokens)")
	f.StringVar(&opts.ID, "id", "", "this frontend's id in etcd (its record, the requests it owns; default: host, pid and a random suffix)")
	f.StringVar(&opts.AdvertiseURL, "advertise-url", "", "where clients reach this frontend, named to clients of streams it took over (default: http(s)://<listen address>)")
	f.Int64Var(&opts.RecordBytesMax, "record-bytes-max", frontend.DefaultRecordBytesMax, "bound on the bytes of request records this frontend may have live in etcd; a streamed request over it is refused (503 records_full, retryable): no client can fill etcd")
	f.BoolVar(&failoverRecords, "failover-records", true, "write a record of every streamed request to etcd so that any frontend can resume it after this one dies")
	f.BoolVar(&opts.NoKVPull, "no-kv-pull", false, "do not let a migrated request's new worker pull its prefix KV from peers (it recomputes what its node lacks)")
	f.DurationVar(&capacityWait, "capacity-wait", reqfsm.DefaultCapacityWait, "how long a request that finds no routable instance of its model (starting, restarting) waits for one before a retryable 503 no_capacity with Retry-After; 0 fails at once")
	f.BoolVar(&opts.TLS, "tls", false, "serve HTTPS (HTTP/1.1, HTTP/2) and HTTP/3 on the same port, with Alt-Svc")
	f.StringVar(&opts.MetricsAddr, "metrics-addr", "127.0.0.1:0", "where /metrics is served, apart from the API (empty: nowhere)")
	f.StringVar(&opts.DebugSocket, "debug-socket", "", "a unix socket (made mode 0600) for the debug pages: /debug/pprof/* and /debug/traces (empty: none)")
	f.DurationVar(&opts.ResumeTokenMaxAge, "resume-token-max-age", frontend.DefaultResumeTokenMaxAge, "refuse resume tokens whose expiry lies further ahead than this, even when validly signed")
	otlpFlags(f, &otlp)
	limitFlags(f, &opts.Limits)
	cmd.AddCommand(rotateResumeKeyCmd())
	return cmd
}

func rotateResumeKeyCmd() *cobra.Command {
	var (
		endpoints []string
		certs     string
		etcdTLS   bool
	)
	cmd := &cobra.Command{
		Use:   "rotate-resume-key",
		Short: "Put a fresh key first in the cluster's resume key ring; tokens of the previous key stay valid until the next rotation",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(endpoints) == 0 {
				return fmt.Errorf("--etcd: required")
			}
			cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second}
			if etcdTLS {
				tlsConf, err := pki.EtcdClientTLS(certs)
				if err != nil {
					return err
				}
				cfg.TLS = tlsConf
			}
			cli, err := clientv3.New(cfg)
			if err != nil {
				return fmt.Errorf("etcd: %w", err)
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			ids, err := frontend.RotateResumeKey(ctx, cli)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "resume keys: current %s, previous %s\n", ids[0], strings.Join(ids[1:], ", "))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&endpoints, "etcd", nil, "etcd endpoints host:port,...")
	f.BoolVar(&etcdTLS, "etcd-tls", false, "connect to etcd with mutual TLS (the --certs certificate; etcd maps its CN to a user)")
	f.StringVar(&certs, "certs", "", "an admin's (or a frontend's) certificate directory")
	return cmd
}

// otlpFlags binds where a process's spans are exported (they are kept
// for /debug/traces on its debug socket in any case).
func otlpFlags(f *pflag.FlagSet, o *tracing.Options) {
	f.StringVar(&o.Endpoint, "otlp-endpoint", "", "export trace spans over OTLP/gRPC to this collector host:port (default: OTEL_EXPORTER_OTLP_ENDPOINT when set, else nowhere)")
	f.BoolVar(&o.Insecure, "otlp-insecure", false, "speak plaintext to the OTLP collector (a local agent) instead of TLS")
}

// limitFlags binds the frontend's resource limits.
func limitFlags(f *pflag.FlagSet, l *frontend.Limits) {
	f.IntVar(&l.MaxConns, "max-conns", frontend.DefaultMaxConns, "open client TCP connections at most; beyond, new ones are refused (cleartext: 503 with Retry-After; TLS: closed)")
	f.IntVar(&l.MaxStreams, "max-streams", frontend.DefaultMaxStreams, "concurrent streams of one HTTP/2 or HTTP/3 connection")
	f.Int64Var(&l.MaxBodyBytes, "max-body-bytes", frontend.DefaultMaxBodyBytes, "largest request body; larger ones get 413 request_too_large")
	f.DurationVar(&l.ReadHeaderTimeout, "read-header-timeout", frontend.DefaultReadHeaderTimeout, "time to read a request's headers (and a new connection's wait for its first)")
	f.DurationVar(&l.BodyTimeout, "body-timeout", frontend.DefaultBodyTimeout, "time to read a request's body; slower ones get 408 request_timeout")
	f.DurationVar(&l.WriteTimeout, "write-timeout", frontend.DefaultWriteTimeout, "close a stream whose client takes none of a write for this long (it resumes by Last-Event-ID; the stream's log is its only buffer)")
	f.DurationVar(&l.KeepAlive, "sse-keepalive", frontend.DefaultKeepAlive, "a streamed response that has sent nothing this long writes an SSE comment, so that clients can tell a silent stream from a cut connection (0: none)")
	f.DurationVar(&l.IdleTimeout, "idle-timeout", frontend.DefaultIdleTimeout, "close keep-alive connections (HTTP/1.1, HTTP/2, HTTP/3) idle this long")
	f.BoolVar(&l.Off, "no-limits", false, "no connection cap, body or idle timeout, default stream limits (to measure what the limits cost)")
	f.MarkHidden("no-limits")
}
