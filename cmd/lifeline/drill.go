package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/internal/app/drill"
)

// errDrillsFailed makes the command exit non-zero after its report.
var errDrillsFailed = errors.New("drill: at least one drill failed")

func drillCmd() *cobra.Command {
	var (
		o      drill.Options
		report string
	)
	o.Config = drill.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "drill [NAME|NUMBER…|all]",
		Short: "Inject the fault-injection matrix's faults under load and report pass/fail with figures",
		Long: `Run drills (all by default): each injects one fault under a steady load of seeded
streams, compares every stream with a fault-free run token by token, and prints
pass, fail or not_available with its figures. By default each drill runs on a
local cluster started for it (drills of the same shape share one) and stopped
after; with --against, on an existing cluster, acting only through its
frontends' APIs and its agents' control sockets. Exits non-zero when a drill
fails.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ds, err := drill.Select(args)
			if err != nil {
				return err
			}
			o.Drills = ds
			out := cmd.OutOrStdout()
			start := time.Now()
			reports, err := drill.Run(cmd.Context(), o, out)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "\n%d drills in %v\n\n", len(reports), time.Since(start).Round(time.Second))
			drill.Summary(out, reports)
			if report != "" {
				where := fmt.Sprintf("local cluster(s), preset %s", o.Local.Preset)
				if len(o.Against.URLs) > 0 {
					where = fmt.Sprintf("cluster at %v", o.Against.URLs)
				}
				doc := drill.Document{Generated: time.Now(), Cluster: where, Drills: reports}
				if err := drill.WriteReport(report, doc); err != nil {
					return err
				}
				fmt.Fprintf(out, "\nreport: %s/report.json, %s/report.html\n", report, report)
			}
			if drill.Failed(reports) {
				return errDrillsFailed
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&report, "report", "", "write report.json and report.html into this directory")
	f.IntVar(&o.Config.Streams, "streams", o.Config.Streams, "concurrent streams of each drill's load")
	f.IntVar(&o.Config.MaxTokens, "max-tokens", o.Config.MaxTokens, "tokens per stream")
	f.Uint64Var(&o.Config.Seed, "seed", o.Config.Seed, "first sampling seed of the load's streams")
	f.DurationVar(&o.Timeout, "timeout", 3*time.Minute, "bound on each drill")
	f.StringVar(&o.Local.Preset, "preset", "small", "local cluster: the workers' model (tiny or small)")
	f.IntVar(&o.Local.Threads, "threads", 0, "local cluster: compute threads per worker where a drill sets none (0: every CPU)")
	f.DurationVar(&o.Local.StepInterval, "step-interval", 0, "local cluster: pace the workers to a step at most this often (0: unpaced; 5ms makes tiny stream as slowly as small computes)")
	f.StringVar(&o.Local.Dir, "dir", "", "local cluster: where its temporary directories go (default: the system's)")
	f.StringSliceVar(&o.Against.URLs, "against", nil, "act on the existing cluster with these frontend URLs")
	f.StringSliceVar(&o.Against.MetricsURLs, "frontend-metrics", nil, "with --against: the frontends' metrics URLs, in the same order (lifeline up prints them)")
	f.StringSliceVar(&o.Against.Debugs, "frontend-debug", nil, "with --against: the frontends' debug sockets (--debug-socket), in the same order: traces in the report, goroutines by stack")
	f.StringSliceVar(&o.Against.Sockets, "agent-socket", nil, "with --against: the node agents' control sockets")
	f.StringSliceVar(&o.Against.Etcd, "etcd", nil, "with --against: etcd endpoints host:port,... (routing seen from etcd)")
	f.BoolVar(&o.Against.EtcdTLS, "etcd-tls", false, "with --against: connect to etcd with mutual TLS")
	f.StringVar(&o.Against.Certs, "certs", "", "with --against: certificate directory (etcd TLS, workers' health)")
	f.StringVar(&o.Against.Model, "model", "", "with --against: the model to load (default: the first the frontend lists)")
	cmd.AddCommand(soakCmd())
	return cmd
}

func soakCmd() *cobra.Command {
	var (
		o       drill.SoakOptions
		report  string
		logFile string
	)
	o.Config = drill.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "A steady seeded load on a local cluster while workers, agents, frontends and etcd's leader are killed, stopped and drained, then a check that nothing was lost or leaked",
		Long: `Start a local cluster (--nodes nodes, a decode worker each and one prefill
worker; two frontends when frontends are killed, three etcd member processes
when etcd's leader is), run --streams seeded streams continuously through the
resuming Go client, and every --kill-every inject the next of --faults:
  decode, prefill  SIGKILL a ready worker of that role (its agent restarts it)
  stop             SIGSTOP a ready worker for --stop-for
  agent            SIGKILL a node agent, start it again at once (it adopts its workers)
  frontend         SIGKILL a frontend, start it again on its address
                   (its clients resume on the other one meanwhile)
  etcd-leader      SIGKILL etcd's leader, start it again once another leads
  drain            drain a node, undrain it once drained
A fault that cannot be injected in its turn (a node is out already) gives way
to the next one that can. At the end: 0 lost or duplicated tokens, every
stream bit-identical to its reference, no slot, lease, pull, in-flight
request, process or segment left, the goroutines and descriptors of the
frontends and agents that ran on back to where they were, resident memory
grown less than 1.5×. Exits non-zero otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			rep, err := drill.Soak(cmd.Context(), o, out)
			if err != nil {
				return err
			}
			fmt.Fprintln(out)
			drill.Summary(out, []drill.Report{rep})
			if report != "" {
				doc := drill.Document{Generated: time.Now(), Cluster: fmt.Sprintf("local cluster, %d nodes, preset %s", o.Nodes, o.Local.Preset), Drills: []drill.Report{rep}}
				if err := drill.WriteReport(report, doc); err != nil {
					return err
				}
				fmt.Fprintf(out, "\nreport: %s/report.json, %s/report.html\n", report, report)
			}
			if drill.Failed([]drill.Report{rep}) {
				return errDrillsFailed
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.Duration, "duration", 10*time.Minute, "how long faults are injected")
	f.DurationVar(&o.KillEvery, "kill-every", 5*time.Second, "a fault every this long")
	f.StringSliceVar(&o.Faults, "faults", drill.SoakFaults, "the faults, one per turn, in this order")
	f.DurationVar(&o.StopFor, "stop-for", 12*time.Second, "how long a SIGSTOPped worker stays stopped")
	f.IntVar(&o.Nodes, "nodes", 3, "nodes of the local cluster")
	f.IntVar(&o.Config.Streams, "streams", 64, "concurrent streams")
	f.IntVar(&o.Config.MaxTokens, "max-tokens", o.Config.MaxTokens, "tokens per stream")
	f.Uint64Var(&o.Config.Seed, "seed", o.Config.Seed, "first sampling seed of the streams")
	f.StringVar(&report, "report", "", "write report.json and report.html into this directory")
	f.StringVar(&o.Local.Preset, "preset", "small", "the workers' model (tiny or small)")
	f.IntVar(&o.Local.Threads, "threads", 0, "compute threads per worker (0: every CPU)")
	f.DurationVar(&o.Local.StepInterval, "step-interval", 0, "pace the workers to a step at most this often (0: unpaced)")
	f.StringVar(&o.Local.Dir, "dir", "", "where the cluster's temporary directory goes (default: the system's)")
	f.StringVar(&logFile, "log", "", "append every process's output to this file (default: the cluster's directory, removed at the end)")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if logFile == "" {
			return nil
		}
		f, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		o.Local.Log = f
		return nil
	}
	return cmd
}
