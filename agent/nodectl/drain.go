package nodectl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/lifeline-llm/lifeline/agent/controlapi"
)

// Drain asks the agent at socket to drain its node and returns the drain
// as it began. With req.NoWait it fails with controlapi.ErrBudgetTaken
// when the disruption budget is taken.
func Drain(ctx context.Context, socket string, req controlapi.DrainRequest) (controlapi.Drain, error) {
	var d controlapi.Drain
	err := postJSON(ctx, socket, "/v1/drain", req, &d)
	return d, err
}

// Undrain asks the agent at socket to start its drained node's instances
// again. It fails with controlapi.ErrNotDrained or
// controlapi.ErrDrainInProgress.
func Undrain(ctx context.Context, socket string) (controlapi.Drain, error) {
	var d controlapi.Drain
	err := postJSON(ctx, socket, "/v1/undrain", nil, &d)
	return d, err
}

// drainCmd is `nodectl drain`.
func drainCmd(socket *string) *cobra.Command {
	var (
		req    controlapi.DrainRequest
		detach bool
	)
	cmd := &cobra.Command{Use: "drain", Short: "Drain the node: stop routing to it, let requests finish or move, stop its workers", Args: cobra.NoArgs,
		Long: `Drain the node. Its instances become not ready and their registrations are marked
draining; once every frontend acknowledged that (at most drain_settle), its workers
refuse new requests;
requests in flight run on until the deadline, and those left then end with a
retryable "draining" error that frontends migrate; then the workers stop. The
agent stays up with its instances stopped until 'nodectl undrain'. At most
max_unavailable nodes (etcd ` + "`/lifeline/v1/drain/max_unavailable`" + `, default 1) drain at
once: a drain waits for its turn, or with --no-wait is refused.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := Drain(cmd.Context(), *socket, req)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			printDrain(out, d)
			if detach {
				return nil
			}
			return followDrain(cmd.Context(), out, *socket, d)
		}}
	f := cmd.Flags()
	f.StringVar(&req.Deadline, "deadline", "60s", "how long requests in flight may run on before they are moved")
	f.StringVar(&req.HardDeadline, "hard-deadline", "90s", "by when the workers are stopped whatever happens")
	f.BoolVar(&req.NoWait, "no-wait", false, "refuse instead of waiting when the disruption budget is taken")
	f.BoolVar(&detach, "detach", false, "return once the drain has begun")
	return cmd
}

// followDrain prints a drain's progress until the node is drained.
func followDrain(ctx context.Context, out io.Writer, socket string, last controlapi.Drain) error {
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped following; the drain goes on (nodectl status)")
		case <-time.After(250 * time.Millisecond):
		}
		st, err := GetStatus(ctx, socket)
		if err != nil {
			return err
		}
		d := st.Drain
		switch {
		case d == nil || d.Phase == controlapi.DrainUndraining:
			return fmt.Errorf("node %s: the drain was cancelled (nodectl undrain)", st.NodeID)
		case d.Phase != last.Phase || d.InFlight != last.InFlight || d.Detail != last.Detail:
			if d.Phase != last.Phase {
				printSkipped(ctx, out, socket, last.Phase, *d)
			}
			printDrain(out, *d)
			last = *d
		}
		if d.Phase == controlapi.DrainDrained {
			fmt.Fprintf(out, "node %s drained in %v: %d requests in flight at the start, %d routed after not-ready, %d ended by the deadline (%d moved early, %d at the deadline), %d finished in place\n",
				st.NodeID, d.DrainedAt.Sub(d.StartedAt).Round(time.Millisecond), d.ActiveAtStart, d.RoutedAfterNotReady, d.ForcedEnded,
				d.MovedEarly, d.EndedAtDeadline, d.FinishedInPlace)
			return nil
		}
	}
}

// drainSteps are a drain's phases in order.
var drainSteps = []string{controlapi.DrainWaitingForBudget, controlapi.DrainNotReady, controlapi.DrainInFlight, controlapi.DrainStopping, controlapi.DrainDrained}

// printSkipped prints the drain's steps that came and went between two
// looks at its status, from (printed before) and d's (printed next), from
// the agent's drain events: a step can take less than a poll (every
// request in flight moved at once).
func printSkipped(ctx context.Context, out io.Writer, socket, from string, d controlapi.Drain) {
	lo, hi := slices.Index(drainSteps, from), slices.Index(drainSteps, d.Phase)
	if hi < 0 || hi-lo < 2 {
		return
	}
	evs, err := Events(ctx, socket)
	if err != nil {
		return
	}
	printed := map[string]bool{}
	for _, e := range evs {
		i := slices.Index(drainSteps, e.Reason)
		if e.Kind != controlapi.EventDrain || e.Time.Before(d.StartedAt) || i <= lo || i >= hi || printed[e.Reason] {
			continue
		}
		fmt.Fprintf(out, "drain (%s): %s; %s\n", d.Trigger, e.Reason, e.Detail)
		printed[e.Reason] = true
	}
}

func printDrain(out io.Writer, d controlapi.Drain) {
	fmt.Fprintf(out, "drain (%s): %s, %d requests in flight, deadline %s, hard deadline %s", d.Trigger, d.Phase, d.InFlight,
		d.Deadline.Format(time.TimeOnly), d.HardDeadline.Format(time.TimeOnly))
	switch d.Phase {
	case controlapi.DrainInFlight, controlapi.DrainStopping, controlapi.DrainDrained:
		fmt.Fprintf(out, "; %d/%d frontends acknowledged (all: %v) after %v, %d routed here after", d.FrontendsAcked, d.Frontends, d.AllAcked,
			d.AckWait.Round(time.Millisecond), d.RoutedAfterNotReady)
	}
	if d.Detail != "" {
		fmt.Fprintf(out, "; %s", d.Detail)
	}
	fmt.Fprintln(out)
}

// undrainCmd is `nodectl undrain`.
func undrainCmd(socket *string) *cobra.Command {
	return &cobra.Command{Use: "undrain", Short: "Start a drained node's instances again (new generations)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := Undrain(cmd.Context(), *socket)
			if err != nil {
				return err
			}
			if d.Phase == controlapi.DrainWaitingForBudget {
				fmt.Fprintln(cmd.OutOrStdout(), "drain cancelled before it began")
				return nil
			}
			fmt.Fprintln(cmd.OutOrStdout(), "undraining: instances starting at new generations; the disruption budget goes back once they are ready")
			return nil
		}}
}
