package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/decode"
	"github.com/lifeline-llm/lifeline/decode/sched"
	"github.com/lifeline-llm/lifeline/decode/worker"
	"github.com/lifeline-llm/lifeline/decode/workerclient"
)

func workerCmd() *cobra.Command { return newWorkerCmd(worker.Run) }

// newWorkerCmd is `lifeline worker` running run: its flags are the ones
// the node agent builds a worker's command line from.
func newWorkerCmd(run func(context.Context, worker.Options, io.Writer) error) *cobra.Command {
	var args workerclient.Args
	cmd := &cobra.Command{
		Use:   workerclient.Command,
		Short: "Serve one engine instance over QUIC (started by the node agent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A worker outlives its agent's output (adoption): a write to
			// a log pipe nobody reads any more must fail, not kill it.
			signal.Ignore(syscall.SIGPIPE)
			if args.AgentSocket == "" || args.OrphanTimeout <= 0 {
				return run(cmd.Context(), workerOptions(args), cmd.OutOrStdout())
			}
			// An orphan stops: its agent gone for good, nobody would.
			ctx, cancel := context.WithCancelCause(cmd.Context())
			defer cancel(nil)
			var wg sync.WaitGroup
			defer wg.Wait()
			wg.Go(func() {
				if err := worker.WatchAgent(ctx, args.AgentSocket, args.OrphanTimeout); err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), err)
					cancel(err)
				}
			})
			err := run(ctx, workerOptions(args), cmd.OutOrStdout())
			if cause := context.Cause(ctx); errors.Is(cause, worker.ErrOrphaned) {
				return cause
			}
			return err
		},
	}
	args.AddFlags(cmd.Flags())
	return cmd
}

// workerOptions is the worker's configuration from its command line.
func workerOptions(a workerclient.Args) worker.Options {
	o := worker.Options{InstanceID: a.InstanceID, Generation: a.Generation, Role: a.Role, Listen: a.Listen, CertDir: a.CertDir,
		KVTransfer: a.KVTransfer, MemoryHeadroom: int64(a.MemoryHeadroomMiB) << 20, Engine: decode.Options{Preset: a.Preset, WeightSeed: a.WeightSeed, ModelPath: a.ModelPath,
			TokenizerPath: a.TokenizerPath, Engine: a.Engine, ServedName: a.ServedName, ContextLen: a.ContextLen, Threads: a.Threads, GPULayers: a.GPULayers, GGMLBackends: cmp.Or(a.GGMLBackends, os.Getenv("LIFELINE_GGML_BACKENDS")), RevisionCache: a.RevisionCache, KVSocket: a.KVSocket, DraftPreset: a.DraftPreset, DraftLayers: a.DraftLayers, DraftK: a.DraftK,
			TP: a.TP, Rank: a.Rank, GroupSegment: a.GroupSegment, GroupGeneration: a.GroupGeneration, KVArena: a.KVArena, SyntheticRate: a.SyntheticRate, StepInterval: a.StepInterval},
		Log: slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("instance_id", a.InstanceID, "generation", a.Generation)}
	if a.MaxRunning > 0 {
		o.Engine.Limits = sched.Limits{MaxRunning: a.MaxRunning, MaxQueued: a.MaxQueued, MaxStepTokens: sched.DefaultLimits.MaxStepTokens}
	}
	return o
}
